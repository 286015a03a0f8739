package runsc

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/mount"
	"github.com/forkbox/forkbox/internal/runtime/spec"
)

// stageMounts returns the mounts on dir, bottom first.
func stageMounts(t *testing.T, dir string) []mount.Info {
	t.Helper()
	infos, err := mount.List()
	if err != nil {
		t.Fatal(err)
	}
	var on []mount.Info
	for _, in := range infos {
		if in.Mountpoint == dir {
			on = append(on, in)
		}
	}
	return on
}

// installedRunsc is the runsc from PATH with its symlinks resolved.
func installedRunsc(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("runsc")
	if err != nil {
		t.Fatal(err)
	}
	real, err := filepath.EvalSymlinks(bin)
	if err != nil {
		t.Fatal(err)
	}
	return real
}

// pmdMapped is the kB of pid's memory mapped from shmem 2 MiB at a time.
func pmdMapped(t *testing.T, pid string) int {
	t.Helper()
	b, err := os.ReadFile("/proc/" + pid + "/smaps_rollup")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "ShmemPmdMapped:"); ok {
			kb, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return kb
		}
	}
	t.Fatalf("no ShmemPmdMapped in /proc/%s/smaps_rollup", pid)
	return 0
}

// A driver with a stage runs its sandbox from the copy: the copy is the
// installed runsc and its sidecars byte for byte, on a read-only tmpfs of
// huge pages; every host process of the sandbox runs a staged binary mapped
// 2 MiB at a time; Close detaches the stage while the sandbox runs on, and
// the driver then runs the installed runsc.
func TestStagedBinariesRunSandbox(t *testing.T) {
	requireRunsc(t)
	dir := filepath.Join(t.TempDir(), "runsc-bin")
	f := newFixture(t, Options{StageDir: dir}, spec.SpecOptions{Args: []string{"/bin/sh", "-c", "echo up; sleep 1000"}})
	rt, ctx := f.rt, context.Background()
	dir, _ = filepath.EvalSymlinks(dir) // as the mount table names it
	if rt.stage == nil || !strings.HasPrefix(rt.binary(), dir+"/") {
		t.Fatalf("binary %s, want one in the stage %s", rt.binary(), dir)
	}
	files, _, _, err := stageFiles(installedRunsc(t))
	if err != nil {
		t.Fatal(err)
	}
	for rel, src := range files {
		want, _ := os.ReadFile(src)
		got, err := os.ReadFile(filepath.Join(dir, rel))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("staged %s: %d bytes (err %v), want the %d of %s", rel, len(got), err, len(want), src)
		}
	}
	on := stageMounts(t, dir)
	if len(on) != 1 || on[0].FSType != "tmpfs" || on[0].Source != stageFS ||
		!strings.Contains(","+on[0].Options+",", ",ro,") || !strings.Contains(on[0].SuperOptions, "huge=always") {
		t.Fatalf("mounts on the stage: %+v, want one read-only %s tmpfs with huge=always", on, stageFS)
	}
	if err := os.WriteFile(filepath.Join(dir, "x"), nil, 0o644); err == nil {
		t.Errorf("write into the stage: got nil error")
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		t.Fatal(err)
	}
	stageDev := st.Dev

	if err := rt.Run(ctx, f.ID, f.Bundle); err != nil {
		t.Fatalf("run: %v", err)
	}
	f.WaitLog(t, "up", 30*time.Second)
	procs := hostProcsWith(f.ID)
	if len(procs) == 0 {
		t.Fatal("no host process of the sandbox")
	}
	for _, p := range procs {
		pid, _, _ := strings.Cut(p, ":")
		// The Sentry's exe link names its binary in its own mount
		// namespace; the file is the stage's if its device is.
		exe, _ := os.Readlink("/proc/" + pid + "/exe")
		var st unix.Stat_t
		if err := unix.Stat("/proc/"+pid+"/exe", &st); err != nil || st.Dev != stageDev {
			t.Errorf("process %s runs %q (device %d, err %v), want a binary of the stage (device %d)", p, exe, st.Dev, err, stageDev)
			continue
		}
		if kb := pmdMapped(t, pid); kb == 0 {
			t.Errorf("process %s (%s) maps nothing 2 MiB at a time", p, exe)
		}
	}

	if err := rt.Close(); err != nil {
		t.Fatal(err)
	}
	if on := stageMounts(t, dir); len(on) != 0 {
		t.Errorf("mounts on the stage after Close: %+v", on)
	}
	if rt.binary() != rt.opts.Binary {
		t.Errorf("binary after Close %s, want the installed %s", rt.binary(), rt.opts.Binary)
	}
	if s, err := rt.State(ctx, f.ID); err != nil || s.Status != "running" {
		t.Fatalf("state after Close: %+v, %v; want running", s, err)
	}
	if err := rt.Delete(ctx, f.ID, true); err != nil {
		t.Fatal(err)
	}
	assertNoTrace(t, f)
}

// A crashed daemon's stage is taken over by the next one when it holds
// the same files, and replaced when it does not (a stale stage's unstage
// then leaves the new one alone); a stage directory reached through a
// symlink is found in the mount table; a mount there that is not a stage
// is not touched, and the driver runs the installed runsc.
func TestStageAfterCrash(t *testing.T) {
	requireRunsc(t)
	ctx := context.Background()
	bin := installedRunsc(t)
	tmp := t.TempDir()
	if err := os.Mkdir(filepath.Join(tmp, "real"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("real", filepath.Join(tmp, "link")); err != nil {
		t.Fatal(err)
	}
	dir, realDir := filepath.Join(tmp, "link", "runsc-bin"), filepath.Join(tmp, "real", "runsc-bin")
	t.Cleanup(func() { _ = mount.UnmountAll(ctx, realDir) })

	crashed, err := stageBinaries(ctx, bin, dir)
	if err != nil {
		t.Fatal(err)
	}
	if on := stageMounts(t, realDir); len(on) != 1 {
		t.Fatalf("mounts on %s: %d, want 1", realDir, len(on))
	}
	same, err := stageBinaries(ctx, bin, dir)
	if err != nil {
		t.Fatal(err)
	}
	if same.token != crashed.token || len(stageMounts(t, realDir)) != 1 {
		t.Errorf("a stage of the same files was not taken over: token %q after %q, %d mounts", same.token, crashed.token, len(stageMounts(t, realDir)))
	}

	// Other files (another binary): a new stage replaces the old.
	other := filepath.Join(t.TempDir(), "runsc")
	if b, err := os.ReadFile("/bin/true"); err != nil || os.WriteFile(other, b, 0o755) != nil {
		t.Fatal("copying /bin/true:", err)
	}
	cur, err := stageBinaries(ctx, other, dir)
	if err != nil {
		t.Fatal(err)
	}
	if cur.token == crashed.token || len(stageMounts(t, realDir)) != 1 {
		t.Fatalf("a stage of other files: token %q (old %q), %d mounts; want a new one alone", cur.token, crashed.token, len(stageMounts(t, realDir)))
	}
	if err := crashed.unstage(ctx); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(cur.binary).CombinedOutput(); err != nil {
		t.Fatalf("the stage after a stale unstage: %v: %s", err, out)
	}
	if err := cur.unstage(ctx); err != nil {
		t.Fatal(err)
	}
	if on := stageMounts(t, realDir); len(on) != 0 {
		t.Fatalf("mounts on the stage after unstage: %+v", on)
	}

	if err := mount.Bind(ctx, t.TempDir(), realDir, true); err != nil {
		t.Fatal(err)
	}
	if _, err := stageBinaries(ctx, bin, dir); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("stage over a bind mount: got %v, want FailedPrecondition", err)
	}
	if on := stageMounts(t, realDir); len(on) != 1 || on[0].Source == stageFS {
		t.Errorf("mounts on the stage directory: %+v, want the bind mount alone", on)
	}
	rt := newRuntime(t, Options{StageDir: dir})
	if rt.stage != nil || rt.binary() != rt.opts.Binary {
		t.Errorf("driver over a foreign mount runs %s, want the installed %s", rt.binary(), rt.opts.Binary)
	}
}

// BenchmarkStagedExec times an exec of `runsc --version` from where it is
// installed and from a stage on huge pages.
func BenchmarkStagedExec(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("staging needs root")
	}
	ctx := context.Background()
	bin := installedRunsc(b)
	dir := filepath.Join(b.TempDir(), "runsc-bin")
	s, err := stageBinaries(ctx, bin, dir)
	if err != nil {
		b.Fatal(err)
	}
	defer s.unstage(ctx)
	for _, c := range []struct{ name, bin string }{{"installed", bin}, {"staged", s.binary}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if err := exec.Command(c.bin, "--version").Run(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
