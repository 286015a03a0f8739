package cluster

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fbclient "github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
)

// Streams through the gateway: a terminal both ways, a tar stream each
// way, a fork streamed child by child; egress and hibernation, which the
// object carries, are written to it; oversized and malformed input is
// refused at the gateway.
func TestGatewayStreams(t *testing.T) {
	c := gateway(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sb, err := c.CreateSandbox(ctx, fbclient.CreateOptions{Image: env.image, Name: "streams", Runtime: string(fbv1.RuntimeGVisor)})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close(context.Background())
	obj := &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: gw.namespace, Name: "streams"}}

	// A terminal: what is typed reaches the shell, what it prints comes back.
	var mu sync.Mutex
	var screen bytes.Buffer
	pty, err := sb.Pty(ctx, fbclient.PtyOptions{Shell: "sh", Rows: 30, Cols: 100, OnData: func(b []byte) {
		mu.Lock()
		screen.Write(b)
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := pty.SendInput([]byte("stty size; echo typed-$((6*7)); exit 3\n")); err != nil {
		t.Fatal(err)
	}
	res, err := pty.Wait()
	mu.Lock()
	out := screen.String()
	mu.Unlock()
	if err != nil || res.ExitCode != 3 || !strings.Contains(out, "30 100") || !strings.Contains(out, "typed-42") {
		t.Fatalf("pty: %v, %+v, screen %q", err, res, out)
	}

	// Tar streams both ways.
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	body := bytes.Repeat([]byte("0123456789"), 100_000)
	tw.WriteHeader(&tar.Header{Name: "big.bin", Mode: 0o644, Size: int64(len(body))})
	tw.Write(body)
	tw.Close()
	if cr, err := sb.CopyTo(ctx, "/root/in", &tb); err != nil || cr.Entries != 1 {
		t.Fatalf("copy to: %+v, %v", cr, err)
	}
	var back bytes.Buffer
	if err := sb.CopyFrom(ctx, "/root/in/big.bin", &back); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(&back)
	if h, err := tr.Next(); err != nil || h.Name != "big.bin" || h.Size != int64(len(body)) {
		t.Fatalf("copy from: %+v, %v", h, err)
	}

	// A fork streamed: the capture, then each child with its own index.
	fs, err := sb.ForkStream(ctx, fbclient.ForkOptions{Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]string{}
	for i, ch := range fs.Children() {
		if ch.Err != nil || ch.Sandbox == nil {
			t.Fatalf("streamed child %d: %v", i, ch.Err)
		}
		seen[i] = ch.Sandbox.ID
		if got := gsh(t, ch.Sandbox, "echo child"); got != "child\n" {
			t.Fatalf("streamed child %d: got %q", i, got)
		}
		defer ch.Sandbox.Close(context.Background())
	}
	if err := fs.Err(); err != nil || len(seen) != 2 || seen[0] == seen[1] {
		t.Fatalf("fork stream: %v, children %v", err, seen)
	}

	// Egress: the node applies it, the object records it.
	if err := sb.SetEgress(ctx, fbclient.EgressOptions{Allow: []string{"10.9.0.0/16"}}); err != nil {
		t.Fatal(err)
	}
	if e := get(t, obj).Spec.Egress; e == nil || e.Mode != "allow" || len(e.Allow) != 1 || e.Allow[0] != "10.9.0.0/16" {
		t.Fatalf("object egress after SetEgress: got %+v", e)
	}
	if err := sb.Refresh(ctx); err != nil || sb.Info.Egress != "allow" {
		t.Fatalf("node egress: %v, %q", err, sb.Info.GetEgress())
	}

	// Hibernated through the object; an exec wakes it through the object
	// too, so the node agent does not hibernate it again.
	if err := sb.Hibernate(ctx); err != nil {
		t.Fatal(err)
	}
	if o := get(t, obj); o.Spec.State != fbv1.StateHibernated || o.Status.Phase != fbv1.PhaseHibernated {
		t.Fatalf("hibernated: spec %q phase %q", o.Spec.State, o.Status.Phase)
	}
	if got := gsh(t, sb, "cat /root/in/big.bin | wc -c"); strings.TrimSpace(got) != fmt.Sprint(len(body)) {
		t.Fatalf("after wake: got %q", got)
	}
	if o := get(t, obj); o.Spec.State != fbv1.StateRunning || o.Status.Phase != fbv1.PhaseRunning {
		t.Fatalf("woken by exec: spec %q phase %q", o.Spec.State, o.Status.Phase)
	}

	// Abuse: a message over the gateway's bound, a foreign page token, a
	// fork of too many.
	if err := sb.WriteFile(ctx, "/root/huge", make([]byte, 40<<20), 0o644); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("a 40 MiB write: got %v (%s), want ResourceExhausted", err, errdefs.ClassName(err))
	}
	if _, err := c.ListSandboxesPage(ctx, fbclient.ListOptions{PageToken: "bm90LW91cnM"}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("a foreign page token: got %v, want InvalidArgument", err)
	}
	if _, err := sb.Fork(ctx, fbclient.ForkOptions{Count: 101}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("fork of 101: got %v, want InvalidArgument", err)
	}
	// Pages: two at a time, every sandbox once.
	ids := map[string]bool{}
	for info, err := range c.AllSandboxes(ctx, fbclient.ListOptions{PageSize: 2}) {
		if err != nil {
			t.Fatal(err)
		}
		if ids[info.Id] {
			t.Fatalf("sandbox %s listed twice", info.Id)
		}
		ids[info.Id] = true
	}
	if !ids[sb.ID] || !ids[seen[0]] || !ids[seen[1]] {
		t.Fatalf("paged list: got %v", ids)
	}
}

// The CLI, unchanged, against the gateway: the README's commands.
func TestGatewayCLI(t *testing.T) {
	gateway(t)
	cli := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(cl.Bin, append([]string{"--host", "http://" + gw.addr, "--token", gw.token}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("forkbox %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	cli("create", "--image", env.image, "--name", "cli-dev", "--memory", "256Mi")
	if got := cli("exec", "cli-dev", "--", "sh", "-c", "echo hello > /root/state; cat /root/state"); got != "hello\n" {
		t.Fatalf("exec: got %q", got)
	}
	cli("checkpoint", "cli-dev", "--tag", "ready")
	out := cli("--json", "fork", "cli-dev", "--count", "2", "--env", "ROLE=worker")
	if strings.Count(out, `"sb-`) < 2 {
		t.Fatalf("fork: got %s", out)
	}
	if ls := cli("ls"); !strings.Contains(ls, "cli-dev") || strings.Count(ls, "fork-cli-dev-") != 2 {
		t.Fatalf("ls: got %s", ls)
	}
	var l fbv1.SandboxList
	if err := plane.Client.List(context.Background(), &l, client.InNamespace(gw.namespace)); err != nil {
		t.Fatal(err)
	}
	for _, s := range l.Items {
		if (strings.HasPrefix(s.Name, "fork-cli-dev-") || s.Name == "cli-dev") && !s.Closed() {
			cli("rm", s.Name)
		}
	}
	if ls := cli("ls"); strings.Contains(ls, "cli-dev") {
		t.Fatalf("ls after rm: got %s", ls)
	}
	// Closed, and kept as one host keeps it (README, Closed sandboxes).
	if ls := cli("ls", "--all"); !strings.Contains(ls, "cli-dev") || !strings.Contains(ls, "closed") {
		t.Fatalf("ls --all after rm: got %s", ls)
	}
	if got := cli("inspect", "cli-dev"); !strings.Contains(got, "closed") {
		t.Fatalf("inspect after rm: got %s", got)
	}
	if got := cli("logs", "cli-dev"); !strings.Contains(got, "sandbox.created") || !strings.Contains(got, "sandbox.closed") {
		t.Fatalf("logs after rm: got %s", got)
	}
}
