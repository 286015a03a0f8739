package cgroups

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// requireDynMods skips (fails in CI) where FavorDynMods cannot work: not
// root, a kernel without the option, or no cgroup2 mount. CI's machine has
// all three (a hybrid host with /sys/fs/cgroup/unified).
func requireDynMods(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		skipOrFailTB(t, "favordynmods needs root")
	}
	b, _ := os.ReadFile("/sys/kernel/cgroup/features")
	if !slices.Contains(strings.Fields(string(b)), FavorDynModsOption) {
		skipOrFailTB(t, "the kernel has no favordynmods")
	}
	if _, err := cgroup2Mount(); err != nil {
		skipOrFailTB(t, err.Error())
	}
}

func skipOrFailTB(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(why)
	}
	t.Skip(why)
}

// TestFavorDynMods switches the option on through the host's real cgroup2
// superblock and checks that nothing else about the mount changed: its
// per-mount flags (a legacy MS_REMOUNT would have cleared nosuid, nodev,
// noexec) and its other superblock options (a cgroup2 reconfigure applies
// its whole option set, so one not passed again is cleared). A superblock
// option the host lacks is set first so that there is one to lose. The
// cleanup sets the options back as they were; favordynmods' per-thread-group
// locking stays on until reboot from Linux 6.18 (see dynmods.go).
func TestFavorDynMods(t *testing.T) {
	requireDynMods(t)
	orig, _ := cgroup2Mount()
	t.Cleanup(func() {
		if err := reconfigure(orig.Mountpoint, superOptions(orig)); err != nil {
			t.Errorf("restoring %s's options %q: %v", orig.Mountpoint, orig.SuperOptions, err)
		}
	})
	b, _ := os.ReadFile("/sys/kernel/cgroup/features")
	extra := ""
	for _, o := range []string{"memory_localevents", "pids_localevents"} {
		if slices.Contains(strings.Fields(string(b)), o) && !slices.Contains(superOptions(orig), o) {
			extra = o
			break
		}
	}
	base := slices.DeleteFunc(superOptions(orig), func(o string) bool { return o == FavorDynModsOption })
	if extra != "" {
		base = append(base, extra)
	}
	if err := reconfigure(orig.Mountpoint, base); err != nil {
		t.Fatal(err)
	}
	before, _ := cgroup2Mount()

	// A daemon started by another package's tests may switch it on at
	// the same time (with the same result), so changed is not checked.
	mp, _, err := FavorDynMods()
	if err != nil || mp != orig.Mountpoint {
		t.Fatalf("FavorDynMods: %q, %v; want %s", mp, err, orig.Mountpoint)
	}
	after, _ := cgroup2Mount()
	if after.Options != before.Options {
		t.Errorf("per-mount options: %q, were %q", after.Options, before.Options)
	}
	want := append(slices.DeleteFunc(superOptions(before), func(o string) bool { return o == FavorDynModsOption }), FavorDynModsOption)
	slices.Sort(want)
	got := superOptions(after)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("superblock options: %q, want %q (were %q)", got, want, before.SuperOptions)
	}
	if extra != "" && !slices.Contains(got, extra) {
		t.Errorf("%s lost by the reconfigure", extra)
	}

	if _, changed, err := FavorDynMods(); err != nil || changed {
		t.Errorf("second FavorDynMods: changed %v, %v; want a no-op", changed, err)
	}
}

// BenchmarkCgroupJoin is what favordynmods saves: it moves this process
// into a cgroup and back in each v1 controller forkbox uses (the joins
// runsc makes on a v1 host), one round per 20 ms, so that every round
// starts after a quiet spell as a runtime start does. ms/round is the
// figure; run it before and after FavorDynMods (`go test ./internal/cgroups
// -run - -bench CgroupJoin`; the switch is one-way on Linux 6.18+).
func BenchmarkCgroupJoin(b *testing.B) {
	requireDynMods(b)
	self := []byte(strconv.Itoa(os.Getpid()))
	home := v1Cgroups(b)
	var dirs, homes []string
	for _, c := range []string{"cpu", "memory", "pids", "freezer"} {
		root := filepath.Join(Root, c)
		if _, err := os.Stat(filepath.Join(root, "cgroup.procs")); err != nil || home[c] == "" {
			continue
		}
		homes = append(homes, filepath.Join(root, home[c]))
		dir := filepath.Join(root, "forkbox-bench-join")
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			b.Fatal(err)
		}
		b.Cleanup(func() { os.Remove(dir) })
		dirs = append(dirs, dir)
	}
	if len(dirs) == 0 {
		b.Skip("no v1 controllers here (a v2 host: runsc clones into the cgroup)")
	}
	var total time.Duration
	for i := 0; i < b.N; i++ {
		time.Sleep(20 * time.Millisecond)
		t0 := time.Now()
		for _, d := range dirs {
			if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), self, 0); err != nil {
				b.Fatal(err)
			}
		}
		for _, d := range homes {
			if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), self, 0); err != nil {
				b.Fatal(err)
			}
		}
		total += time.Since(t0)
	}
	b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "ms/round")
}

// v1Cgroups returns this process's cgroup in each v1 controller, from
// /proc/self/cgroup ("3:cpu,cpuacct:/user.slice").
func v1Cgroups(tb testing.TB) map[string]string {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		tb.Fatal(err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 || f[1] == "" {
			continue
		}
		for _, c := range strings.Split(f[1], ",") {
			out[c] = f[2]
		}
	}
	return out
}
