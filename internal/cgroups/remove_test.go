package cgroups

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/runtime/testsuite"
)

// fakeRoot points Root at a temp dir holding the given hierarchies.
func fakeRoot(t *testing.T, hierarchies ...string) string {
	t.Helper()
	old := Root
	Root = t.TempDir()
	t.Cleanup(func() { Root = old })
	for _, h := range hierarchies {
		if err := os.MkdirAll(filepath.Join(Root, h), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return Root
}

func TestRootsListsEachHierarchyOnce(t *testing.T) {
	root := fakeRoot(t, "cpu,cpuacct", "memory", "unified")
	if err := os.Symlink("cpu,cpuacct", filepath.Join(root, "cpu")); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(root, "not-a-dir"), nil, 0o644)
	var got []string
	for _, r := range Roots() {
		rel, _ := filepath.Rel(root, r)
		got = append(got, rel)
	}
	slices.Sort(got)
	want := []string{".", "cpu,cpuacct", "memory", "unified"}
	// The alias and its target are one hierarchy: either name may be listed.
	if i := slices.Index(got, "cpu"); i >= 0 {
		got[i] = "cpu,cpuacct"
		slices.Sort(got)
	}
	if !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

func TestRemoveEveryHierarchyDeepestFirst(t *testing.T) {
	root := fakeRoot(t, "memory", "pids", "unified")
	for _, d := range []string{"memory/fb/sb-1/sub/deeper", "pids/fb/sb-1", "unified/fb/sb-1", "fb/sb-1", "memory/fb/sb-2"} {
		os.MkdirAll(filepath.Join(root, d), 0o755)
	}
	if got := Children("/fb"); !slices.Equal(got, []string{"sb-1", "sb-2"}) {
		t.Errorf("Children: got %v, want [sb-1 sb-2]", got)
	}
	if err := Remove(context.Background(), "/fb/sb-1"); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"memory/fb/sb-1", "pids/fb/sb-1", "unified/fb/sb-1", "fb/sb-1"} {
		if _, err := os.Stat(filepath.Join(root, d)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: got %v, want it removed", d, err)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "memory/fb/sb-2")); err != nil {
		t.Errorf("a sibling was touched: %v", err)
	}
	if err := Remove(context.Background(), "/fb/sb-1"); err != nil {
		t.Errorf("removing a missing cgroup: got %v, want nil", err)
	}
}

func TestRemoveRefusesRoot(t *testing.T) {
	fakeRoot(t, "memory")
	for _, p := range []string{"", "/", "/..", "../.."} {
		if err := Remove(context.Background(), p); !errdefs.IsInvalidArgument(err) {
			t.Errorf("Remove(%q): got %v, want InvalidArgument", p, err)
		}
	}
}

// startChild starts a process that runs until killed, and a goroutine that
// reaps it; the returned channel yields how it ended.
func startChild(t *testing.T) (*exec.Cmd, <-chan error) {
	t.Helper()
	cmd := exec.Command("sleep", "3600")
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot start sleep: %v", err)
	}
	done := make(chan error, 1)
	exited := make(chan struct{})
	go func() { done <- cmd.Wait(); close(exited) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-exited })
	return cmd, done
}

func killedBySIGKILL(err error) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

func TestKillWaitsForListedProcesses(t *testing.T) {
	root := fakeRoot(t, "pids")
	dir := filepath.Join(root, "pids", "fb", "sb-1")
	os.MkdirAll(dir, 0o755)
	a, doneA := startChild(t)
	b, doneB := startChild(t)
	procs := fmt.Sprintf("%d\n%d\n", a.Process.Pid, b.Process.Pid)
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(procs), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Kill(context.Background(), dir); err != nil {
		t.Fatal(err)
	}
	for i, done := range []<-chan error{doneA, doneB} {
		if err := <-done; !killedBySIGKILL(err) {
			t.Errorf("process %d: got %v, want killed by SIGKILL", i, err)
		}
	}
	if err := Kill(context.Background(), filepath.Join(root, "pids", "missing")); err != nil {
		t.Errorf("a missing cgroup: got %v, want nil", err)
	}
}

func TestKillRefusesInitAndItself(t *testing.T) {
	root := fakeRoot(t, "pids")
	for _, pid := range []int{1, os.Getpid()} {
		dir := filepath.Join(root, "pids", strconv.Itoa(pid))
		os.MkdirAll(dir, 0o755)
		os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)+"\n"), 0o644)
		if err := Kill(context.Background(), dir); !errdefs.IsFailedPrecondition(err) {
			t.Errorf("pid %d: got %v, want FailedPrecondition", pid, err)
		}
	}
}

// TestRemoveRealCgroup needs root and a writable cgroup hierarchy: it puts
// a process in a real cgroup with a sub-cgroup and removes both.
func TestRemoveRealCgroup(t *testing.T) {
	testsuite.Need(t, os.Geteuid() == 0, "needs root to make cgroups")
	var hier string
	for _, h := range []string{"pids", "memory", ""} {
		if _, err := os.Stat(filepath.Join(Root, h, "cgroup.procs")); err == nil {
			hier = filepath.Join(Root, h)
			break
		}
	}
	testsuite.Need(t, hier != "", "no cgroup hierarchy with cgroup.procs under "+Root)
	rel := fmt.Sprintf("/forkbox-cgtest-%d", os.Getpid())
	dir := filepath.Join(hier, rel)
	err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755)
	testsuite.Need(t, err == nil, fmt.Sprintf("cannot make a cgroup: %v", err))
	t.Cleanup(func() { Remove(context.Background(), rel) })
	top, doneTop := startChild(t)
	sub, doneSub := startChild(t)
	for file, pid := range map[string]int{"cgroup.procs": top.Process.Pid, "sub/cgroup.procs": sub.Process.Pid} {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(strconv.Itoa(pid)), 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := Remove(context.Background(), rel); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("cgroup dir: got %v, want removed", err)
	}
	for name, done := range map[string]<-chan error{"top": doneTop, "sub": doneSub} {
		if err := <-done; !killedBySIGKILL(err) {
			t.Errorf("process in the %s cgroup: got %v, want killed by SIGKILL", name, err)
		}
	}
}
