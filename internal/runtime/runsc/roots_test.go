package runsc

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/runtime"
	"github.com/forkbox/forkbox/internal/runtime/spec"
	"github.com/forkbox/forkbox/internal/runtime/testsuite"
)

var sleeper = spec.SpecOptions{Args: []string{"/bin/sleep", "1000"}}

// rootEntries lists what is left in the driver's root directory.
func rootEntries(t *testing.T, r *Runsc) []string {
	t.Helper()
	ents, err := os.ReadDir(r.Root())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func listed(t *testing.T, r *Runsc) map[string]string {
	t.Helper()
	states, err := r.List(context.Background())
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	got := map[string]string{}
	for _, st := range states {
		got[st.ID] = st.Status
	}
	return got
}

// A container's state is in a root of its own, never in the shared one
// (where runsc's lookups read every sandbox's entries), every call finds
// it there, and Delete leaves nothing.
func TestOwnStateRoot(t *testing.T) {
	f := newFixture(t, Options{}, sleeper)
	ctx := context.Background()
	if err := f.rt.Run(ctx, f.ID, f.Bundle); err != nil {
		t.Fatal(err)
	}
	own := filepath.Join(f.rt.Root(), f.ID)
	if got := f.rt.RootOf(f.ID); got != own {
		t.Errorf("RootOf = %s, want %s", got, own)
	}
	if !holdsState(own) {
		t.Errorf("%s holds no state file", own)
	}
	if got := rootEntries(t, f.rt); !slices.Equal(got, []string{f.ID}) {
		t.Errorf("root holds %q, want only the container's own root", got)
	}
	if err := f.rt.Pause(ctx, f.ID); err != nil {
		t.Fatal(err)
	}
	if got := listed(t, f.rt); got[f.ID] != runtime.StatusPaused || len(got) != 1 {
		t.Errorf("list = %v, want %s paused", got, f.ID)
	}
	if err := f.rt.Resume(ctx, f.ID); err != nil {
		t.Fatal(err)
	}
	if err := f.rt.Delete(ctx, f.ID, true); err != nil {
		t.Fatal(err)
	}
	if got := rootEntries(t, f.rt); len(got) != 0 {
		t.Errorf("root after delete holds %q", got)
	}
}

// A tenant started inside a pre-booted sandbox is in its pod's root (a
// symlink), listed once, and whichever of the two goes first, the root is
// empty once both are deleted.
func TestTenantSharesPodRoot(t *testing.T) {
	for _, tenantFirst := range []bool{true, false} {
		pod := newFixture(t, Options{}, sleeper)
		tenant := testsuite.NewFixture(t, pod.rt, sleeper, func(s *specs.Spec) {
			AsTenant(s, pod.ID)
			s.Linux.CgroupsPath = ""
			for i := range s.Linux.Namespaces {
				if s.Linux.Namespaces[i].Type == specs.NetworkNamespace {
					s.Linux.Namespaces[i].Path = pod.NetNS
				}
			}
		})
		s, err := spec.ReadBundle(pod.Bundle)
		if err != nil {
			t.Fatal(err)
		}
		AsPod(s, pod.ID)
		if err := spec.WriteBundle(pod.Bundle, s); err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if err := pod.rt.Run(ctx, pod.ID, pod.Bundle); err != nil {
			t.Fatal(err)
		}
		if err := pod.rt.Run(ctx, tenant.ID, tenant.Bundle); err != nil {
			t.Fatal(err)
		}
		link := filepath.Join(pod.rt.Root(), tenant.ID)
		if target, err := os.Readlink(link); err != nil || target != pod.ID {
			t.Errorf("tenant's root: readlink = %q, %v; want %s", target, err, pod.ID)
		}
		got := listed(t, pod.rt)
		if got[pod.ID] != runtime.StatusRunning || got[tenant.ID] != runtime.StatusRunning || len(got) != 2 {
			t.Errorf("list = %v, want %s and %s running, each once", got, pod.ID, tenant.ID)
		}
		if st, err := pod.rt.State(ctx, tenant.ID); err != nil || st.Status != runtime.StatusRunning {
			t.Errorf("tenant state = %+v, %v", st, err)
		}
		order := []string{pod.ID, tenant.ID}
		if tenantFirst {
			order = []string{tenant.ID, pod.ID}
		}
		for _, id := range order {
			if err := pod.rt.Delete(ctx, id, true); err != nil {
				t.Fatalf("delete %s: %v", id, err)
			}
		}
		if left := rootEntries(t, pod.rt); len(left) != 0 {
			t.Errorf("tenant first %v: root after both deletes holds %q", tenantFirst, left)
		}
	}
}

// A container of a daemon before per-sandbox roots has its state in the
// shared root: the driver still finds, lists and deletes it, leaving
// nothing, and a new container beside it gets a root of its own.
func TestFlatRootStillServed(t *testing.T) {
	f := newFixture(t, Options{}, sleeper)
	ctx := context.Background()
	// Output to a file: the detached sandbox would hold a pipe open.
	out, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	cmd := exec.Command(f.rt.opts.Binary, append(f.rt.globalArgs(f.rt.Root(), ""), "run", "--detach", "--bundle", f.Bundle, f.ID)...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		b, _ := os.ReadFile(out.Name())
		t.Fatalf("runsc run in the flat root: %v: %s", err, b)
	}
	if got := f.rt.RootOf(f.ID); got != f.rt.Root() {
		t.Errorf("RootOf = %s, want the flat root", got)
	}
	if st, err := f.rt.State(ctx, f.ID); err != nil || st.Status != runtime.StatusRunning {
		t.Fatalf("state = %+v, %v", st, err)
	}
	g := testsuite.NewFixture(t, f.rt, sleeper)
	if err := f.rt.Run(ctx, g.ID, g.Bundle); err != nil {
		t.Fatal(err)
	}
	if got := listed(t, f.rt); got[f.ID] != runtime.StatusRunning || got[g.ID] != runtime.StatusRunning || len(got) != 2 {
		t.Errorf("list = %v, want %s and %s running", got, f.ID, g.ID)
	}
	for _, id := range []string{f.ID, g.ID} {
		if err := f.rt.Delete(ctx, id, true); err != nil {
			t.Fatal(err)
		}
	}
	if left := rootEntries(t, f.rt); len(left) != 0 {
		t.Errorf("root after delete holds %s", strings.Join(left, ", "))
	}
}

// Every create first asks runsc whether its id exists. With per-sandbox
// roots the answer for an id without a root of its own is known without a
// runsc start, unless the flat root holds its state (a container of a
// daemon before per-sandbox roots): then runsc is asked. The binary here
// fails whenever it is started.
func TestStateOfUnknownStartsNoRunsc(t *testing.T) {
	requireRunsc(t)
	rt, err := New(Options{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	rt.opts.Binary = "/bin/false"
	ctx := context.Background()
	if _, err := rt.State(ctx, "sb-unknown"); !errdefs.IsNotFound(err) {
		t.Errorf("state of an unknown id: got %v, want NotFound without runsc", err)
	}
	if err := os.WriteFile(filepath.Join(rt.Root(), "pod-x_sandbox:sb-unknown.state"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.State(ctx, "sb-unknown"); err == nil || errdefs.IsNotFound(err) {
		t.Errorf("state of an id in the flat root: got %v, want runsc's (failing) answer", err)
	}
}
