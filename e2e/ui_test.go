package e2e

import (
	"context"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/forkbox/forkbox/client"
)

// chromium returns the browser binary, or skips the test (fails it in CI).
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("FORKBOX_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium is missing (scripts/setup.sh installs it)")
	}
	t.Skip("needs chromium (apt-get install chromium)")
	return ""
}

// artifactDir is where tests leave files for a person to look at:
// $FORKBOX_TEST_ARTIFACTS, else forkbox-e2e-artifacts in the temp dir.
func artifactDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("FORKBOX_TEST_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "forkbox-e2e-artifacts")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// login GETs /?token= without following the redirect and returns the
// session cookie.
func login(t *testing.T, base, token string) *http.Cookie {
	t.Helper()
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Get(base + "/?token=" + url.QueryEscape(token))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/" {
		t.Fatalf("login: got %d to %q, want 303 to /", resp.StatusCode, resp.Header.Get("Location"))
	}
	for _, ck := range resp.Cookies() {
		if ck.Name == "forkbox_session" {
			return ck
		}
	}
	t.Fatal("login set no session cookie")
	return nil
}

func post(t *testing.T, u, ctype, body string, ck *http.Cookie) int {
	t.Helper()
	req, err := http.NewRequest("POST", u, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", ctype)
	req.AddCookie(ck)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestDashboard opens the dashboard in headless Chromium and checks what a
// person sees: the 401 page without the token, the fork tree after a fork of
// 3 (three children under the source's checkpoint), and the exec in the
// source's ledger. It saves a screenshot and prints its path.
func TestDashboard(t *testing.T) {
	browser := chromium(t)
	uiAddr, tcp := freeAddr(t), freeAddr(t)
	const token = "dashboard-s3cret"
	withDaemonFlags(t, "--tcp", tcp, "--api-token", token, "--ui", uiAddr)
	base := "http://" + uiAddr
	ctx := context.Background()

	src := newSandbox(t, client.CreateOptions{Name: "ui-src", Resources: client.Resources{CPU: "1", Memory: "256Mi"}})
	mustSh(t, src, "echo hello-from-the-ledger > /root/greeting")
	fr, err := src.Fork(ctx, client.ForkOptions{Tag: "ui-fan-out", Count: 3})
	if err != nil {
		t.Fatalf("fork: %v", err)
	}
	kids := fr.Sandboxes()
	for _, k := range kids {
		t.Cleanup(func() { k.Close(context.Background()) })
	}
	if len(kids) != 3 {
		t.Fatalf("fork: got %d children, want 3", len(kids))
	}

	// CSRF: the session cookie alone does not carry a form post; the same
	// cookie with the API's JSON content type does.
	ck := login(t, base, token)
	del := base + "/forkbox.v1.SandboxService/DeleteSandbox"
	if got := post(t, del, "application/x-www-form-urlencoded", "sandbox="+kids[0].ID, ck); got != http.StatusUnauthorized {
		t.Errorf("cookie-only form post: got %d, want 401", got)
	}
	if got := post(t, del, "text/plain", `{"sandbox":"`+kids[0].ID+`"}`, ck); got != http.StatusUnauthorized {
		t.Errorf("cookie-only text/plain post: got %d, want 401", got)
	}
	if _, err := env.c.Sandbox(ctx, kids[0].ID); err != nil {
		t.Errorf("child after the refused posts: %v", err)
	}
	if got := post(t, base+"/forkbox.v1.SandboxService/ListSandboxes", "application/json", "{}", ck); got != http.StatusOK {
		t.Errorf("cookie with JSON: got %d, want 200", got)
	}
	// The TCP listener serves the same page at /ui/, behind the token.
	resp, err := http.Get("http://" + tcp + "/ui/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("TCP /ui/ without a token: got %d, want 401", resp.StatusCode)
	}

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(browser), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.NoFirstRun, chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1400, 1200),
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true))
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	bctx, cancel := context.WithTimeout(bctx, 3*time.Minute)
	defer cancel()

	// Without the token: the 401 page.
	if err := chromedp.Do(bctx, chromedp.Navigate(base+"/")); err != nil {
		t.Fatalf("open without a token: %v", err)
	}
	body, err := chromedp.Run(bctx, chromedp.Evaluate[string](`document.body.innerText`))
	if err != nil {
		t.Fatalf("open without a token: %v", err)
	}
	if !strings.Contains(body, "401") || !strings.Contains(body, "?token=") {
		t.Errorf("without a token the page says %q, want the 401 page", body)
	}

	// With it: logged in, and the token leaves the address; the fork tree
	// shows three children under the source's checkpoint.
	// A query waits across the login's redirect (a Poll is bound to one
	// execution context: it failed once with "Cannot find context with
	// specified id" when the redirect replaced the page under it).
	srcNode := `#tree li.sb[data-id="` + src.ID + `"]`
	kidNodes := srcNode + ` > ul > li.ck > ul > li.sb`
	if err := chromedp.Do(bctx,
		chromedp.Navigate(base+"/?token="+token),
		chromedp.WaitVisible(chromedp.CSS(kidNodes+`:nth-of-type(3)`)),
	); err != nil {
		t.Fatalf("dashboard fork tree: %v", err)
	}
	if n, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll('`+kidNodes+`').length`)); err != nil || n != 3 {
		t.Fatalf("dashboard fork tree: %d children under the source's checkpoint (%v), want 3", n, err)
	}
	loc, err := chromedp.Run(bctx, chromedp.Evaluate[string](`location.href`))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(loc, "token") {
		t.Errorf("address after login: %q, want the token dropped", loc)
	}
	cookies, err := chromedp.Run(bctx, chromedp.Evaluate[string](`document.cookie`))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(cookies, "forkbox_session") {
		t.Errorf("document.cookie %q: the session cookie must be HttpOnly", cookies)
	}
	treeText, err := chromedp.Run(bctx, chromedp.Evaluate[string](`document.querySelector('`+srcNode+`').innerText`))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(treeText, "3 children") || !strings.Contains(treeText, fr.Checkpoint.Id) {
		t.Errorf("fork tree under the source: %q, want its checkpoint %s with 3 children", treeText, fr.Checkpoint.Id)
	}
	for _, k := range kids {
		if !strings.Contains(treeText, k.Info.Name) {
			t.Errorf("fork tree under the source: %q, want child %s", treeText, k.Info.Name)
		}
	}

	// The source's ledger shows the exec once the source is picked (its row
	// is kept across polls, so the click lands on a live node).
	if err := chromedp.Do(bctx,
		chromedp.Click(chromedp.CSS(`#sandboxes tr[data-id="`+src.ID+`"]`)),
		chromedp.Poll[chromedp.Void](`[...document.querySelectorAll('#ledger li[data-type="exec.started"]')].some(li => li.innerText.includes('hello-from-the-ledger'))
			&& document.querySelector('#ledger li[data-type="exec.finished"]') !== null
			&& document.querySelectorAll('#charts svg polyline').length >= 10`,
			chromedp.WithPollingTimeout(2*time.Minute), chromedp.WithPollingInterval(100*time.Millisecond)),
	); err != nil {
		t.Fatalf("dashboard ledger: %v", err)
	}
	ledger, err := chromedp.Run(bctx, chromedp.Evaluate[string](`document.querySelector("#ledger").innerText`))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"sandbox.created", "exec.started", "echo hello-from-the-ledger", "exec.finished", "exit 0", "sandbox.checkpoint_created"} {
		if !strings.Contains(ledger, want) {
			t.Errorf("ledger of the source: want %q in %q", want, ledger)
		}
	}

	png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	shot := filepath.Join(artifactDir(t), "dashboard.png")
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", shot)
}
