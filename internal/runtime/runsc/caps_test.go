package runsc

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// sentryBounding is the capability bounding set runsc gives the Sentry in
// forkbox's configuration (systrap, directfs, its own netstack): the five
// file-access capabilities of directfs and CAP_SYS_PTRACE, which systrap
// needs (runsc's boot.go). Only those the host has can be there.
const sentryBounding = 1<<unix.CAP_CHOWN | 1<<unix.CAP_DAC_OVERRIDE | 1<<unix.CAP_DAC_READ_SEARCH |
	1<<unix.CAP_FOWNER | 1<<unix.CAP_FSETID | 1<<unix.CAP_SYS_PTRACE

// TestSentryCapabilities: every thread of a Sentry, booted and restored,
// holds exactly the capabilities runsc means it to: that bounding set,
// the same permitted and effective sets, no inheritable and no ambient
// ones. With the sidecars `make setup` installs beside runsc, the Sentry
// is gvisor_sentry, exec'd by gvisor-sentry-prewarmer, which trims the
// bounding set before the exec and raises the inheritable set to keep the
// permitted one across it (scripts/gvisor/prewarmer.c); the Sentry then
// drops only what is left (bounding-held.patch). A trim that kept too
// much, an inheritable set left raised or a drop skipped that some thread
// still held shows here.
func TestSentryCapabilities(t *testing.T) {
	g := newMFRig(t)
	host := capsOf(t, "/proc/self/status")
	want := sentryBounding & host["CapBnd"]
	prewarmer := filepath.Join(filepath.Dir(g.rt.opts.Binary), "gvisor-bin", "gvisor-sentry-prewarmer")
	_, err := os.Stat(prewarmer)
	sidecars := err == nil
	t.Logf("host bounding %#x, sentry's expected %#x, sidecars beside runsc: %v", host["CapBnd"], want, sidecars)

	srcDir, src := g.source(t, "fbx-caps")
	checkSentryCaps(t, g.rt, src.ID, want, sidecars)

	kid := g.memoryChild(t, src, srcDir, "fbx-caps-kid", g.args)
	kid.WaitLog(t, "tick=", 60*time.Second)
	checkSentryCaps(t, g.rt, kid.ID, want, sidecars)
}

// checkSentryCaps checks the capability sets of every thread of id's
// sandbox process.
func checkSentryCaps(t *testing.T, rt *Runsc, id string, want uint64, sidecars bool) {
	t.Helper()
	st, err := rt.State(context.Background(), id)
	if err != nil || st.Pid <= 0 {
		t.Fatalf("state of %s: %+v, %v", id, st, err)
	}
	exe, err := os.Readlink("/proc/" + strconv.Itoa(st.Pid) + "/exe")
	if err != nil {
		t.Fatal(err)
	}
	if sidecars && filepath.Base(exe) != "gvisor_sentry" {
		t.Errorf("%s: sandbox process runs %s, want gvisor_sentry (the prewarmer's exec)", id, exe)
	}
	dir := "/proc/" + strconv.Itoa(st.Pid) + "/task"
	tasks, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		caps := capsOf(t, filepath.Join(dir, task.Name(), "status"))
		if caps == nil {
			continue // the thread exited
		}
		for name, w := range map[string]uint64{"CapBnd": want, "CapPrm": want, "CapEff": want, "CapInh": 0, "CapAmb": 0} {
			if caps[name] != w {
				t.Errorf("%s: thread %s of %s: %s %#x, want %#x", id, task.Name(), exe, name, caps[name], w)
			}
		}
	}
	t.Logf("%s: %d threads of %s checked", id, len(tasks), exe)
}

// capsOf reads the Cap* lines of a /proc status file; nil if it is gone.
func capsOf(t *testing.T, path string) map[string]uint64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ESRCH) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	caps := map[string]uint64{}
	for _, line := range strings.Split(string(b), "\n") {
		name, v, ok := strings.Cut(line, ":")
		if !ok || !strings.HasPrefix(name, "Cap") {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		if err != nil {
			t.Fatalf("%s: %q: %v", path, line, err)
		}
		caps[name] = n
	}
	if len(caps) != 5 {
		t.Fatalf("%s: capability lines %v", path, caps)
	}
	return caps
}
