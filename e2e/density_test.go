package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
)

// densityCount is how many sandboxes TestDensityPages keeps live at once: a
// bounded form of the bench's density section (tools/bench, --sections
// density) that fits the CI machine in about a minute.
const densityCount = 200

// TestDensityPages runs densityCount crun sandboxes at once (crun: no
// Sentry per sandbox, so 200 start in well under two minutes on two cores
// and take a few hundred MiB; gVisor's density is the bench's to measure):
// the live-sandbox limit holds at that count, the list pages return every
// sandbox exactly once in creation order with the page sizes asked for
// (through the SDK and `forkbox ls`), a forged page token is refused with
// InvalidArgument, and closing them all leaves nothing on the host.
func TestDensityPages(t *testing.T) {
	withDaemonFlags(t, "--max-sandboxes", fmt.Sprint(densityCount))
	ctx := context.Background()
	before, err := env.c.ListSandboxes(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	want := densityCount - len(before)
	began := time.Now()
	var mu sync.Mutex
	var made []*client.Sandbox
	defer func() {
		closeParallel(made)
	}()
	work := make(chan int)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				sb, err := env.c.CreateSandbox(ctx, client.CreateOptions{Image: env.image, Runtime: "crun",
					Name: fmt.Sprintf("dens-%03d", i), Resources: client.Resources{Memory: "64Mi"}})
				mu.Lock()
				if err != nil {
					t.Errorf("create %d of %d: %v", i+1, want, err)
				} else {
					made = append(made, sb)
				}
				mu.Unlock()
			}
		}()
	}
	for i := range want {
		work <- i
	}
	close(work)
	wg.Wait()
	t.Logf("%d sandboxes created in %v", want, time.Since(began).Round(time.Millisecond))
	if t.Failed() {
		t.FailNow()
	}
	if _, err := env.c.CreateSandbox(ctx, client.CreateOptions{Image: env.image, Runtime: "crun"}); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("create past --max-sandboxes %d: got %v, want ResourceExhausted", densityCount, err)
	}

	for _, size := range []int{1, 7, 0, 100, 1000, 5000} {
		checkPages(t, size, densityCount)
	}
	out, errs, code := cli(t, "--json", "ls", "--page-size", "7")
	var listed []map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &listed) != nil || len(listed) != densityCount {
		t.Fatalf("forkbox ls --page-size 7: exit %d, %d sandboxes, want %d (stderr %q)", code, len(listed), densityCount, errs)
	}

	_, liveTok := firstPage(t, client.ListOptions{PageSize: 10})
	_, allTok := firstPage(t, client.ListOptions{All: true, PageSize: 10})
	for name, tok := range map[string]string{
		"garbage":       "not a token",
		"forged sql":    base64.RawURLEncoding.EncodeToString([]byte("v1|sb|000000000000|0|x' OR 1=1 --")),
		"other filters": allTok,
		"truncated":     liveTok[:len(liveTok)/2],
		"oversized":     strings.Repeat("A", 4096),
		"a byte more":   liveTok + "A",
	} {
		if _, err := env.c.ListSandboxesPage(ctx, client.ListOptions{PageToken: tok}); !errdefs.IsInvalidArgument(err) {
			t.Errorf("page token %s: got %v, want InvalidArgument", name, err)
		}
	}
	if _, err := env.c.ListSandboxesPage(ctx, client.ListOptions{PageSize: -1}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("page size -1: got %v, want InvalidArgument", err)
	}

	// The first and the last are usable at full count.
	for _, sb := range []*client.Sandbox{made[0], made[len(made)-1]} {
		if got := mustSh(t, sb, "echo ok"); got != "ok\n" {
			t.Errorf("exec in %s at %d live: got %q", sb.ID, densityCount, got)
		}
	}

	t.Logf("listed and checked at %v", time.Since(began).Round(time.Millisecond))
	first, last := made[0].ID, made[len(made)-1].ID
	closeParallel(made)
	made = nil
	t.Logf("closed at %v", time.Since(began).Round(time.Millisecond))
	// The host audit looks for traces of every sandbox at once (mounts,
	// processes, cgroups, netns, veths, nftables elements, layers, bundle
	// directories); the per-sandbox check adds what is not under the run's
	// directory, for two of them.
	closeAllLive(t)
	checkNoLeftovers(t, first)
	checkNoLeftovers(t, last)
	t.Logf("audited at %v", time.Since(began).Round(time.Millisecond))
}

// checkPages lists the live sandboxes page by page with page size size and
// checks that there are n, each exactly once, oldest first, in pages of the
// size asked for (the default 100 for 0, at most 1,000).
func checkPages(t *testing.T, size, n int) {
	t.Helper()
	ctx := context.Background()
	per := size
	if per == 0 {
		per = 100
	}
	per = min(per, 1000)
	seen := map[string]bool{}
	var last int64
	o := client.ListOptions{PageSize: size}
	for page := 0; ; page++ {
		if page > n {
			t.Fatalf("page size %d: more than %d pages", size, n)
		}
		p, err := env.c.ListSandboxesPage(ctx, o)
		if err != nil {
			t.Fatalf("page size %d, page %d: %v", size, page, err)
		}
		if len(p.Sandboxes) > per || (p.NextPageToken != "" && len(p.Sandboxes) != per) {
			t.Fatalf("page size %d, page %d: got %d sandboxes (next %q), want %d", size, page, len(p.Sandboxes), p.NextPageToken, per)
		}
		for _, s := range p.Sandboxes {
			if seen[s.Id] {
				t.Fatalf("page size %d: %s listed twice", size, s.Id)
			}
			if s.CreatedAtUnixMs < last {
				t.Fatalf("page size %d: %s out of creation order", size, s.Id)
			}
			seen[s.Id], last = true, s.CreatedAtUnixMs
		}
		if p.NextPageToken == "" {
			break
		}
		o.PageToken = p.NextPageToken
	}
	if len(seen) != n {
		t.Fatalf("page size %d: got %d sandboxes across the pages, want %d", size, len(seen), n)
	}
}

func firstPage(t *testing.T, o client.ListOptions) (*client.SandboxPage, string) {
	t.Helper()
	p, err := env.c.ListSandboxesPage(context.Background(), o)
	if err != nil {
		t.Fatalf("first page of %+v: %v", o, err)
	}
	if p.NextPageToken == "" {
		t.Fatalf("first page of %+v: no next page", o)
	}
	return p, p.NextPageToken
}

// closeParallel closes sandboxes eight at a time.
func closeParallel(sbs []*client.Sandbox) {
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for _, sb := range sbs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			sb.Close(context.Background())
		}()
	}
	wg.Wait()
}
