package cgroups

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/internal/mount"
	"github.com/forkbox/forkbox/internal/runtime/testsuite"
)

// requireDynMods skips (fails in CI) where FavorDynMods cannot work: not
// root, a kernel without the option, or no cgroup2 mount. CI's machine has
// all three (a hybrid host with /sys/fs/cgroup/unified).
func requireDynMods(t testing.TB) {
	t.Helper()
	testsuite.Need(t, os.Geteuid() == 0, "favordynmods needs root")
	b, _ := os.ReadFile("/sys/kernel/cgroup/features")
	testsuite.Need(t, slices.Contains(strings.Fields(string(b)), FavorDynModsOption), "the kernel has no favordynmods")
	_, err := cgroup2Mount()
	testsuite.Need(t, err == nil, fmt.Sprint(err))
}

// TestFavorDynModsOptions: the option set a reconfigure gets is the
// mount's own superblock options (a cgroup2 reconfigure applies its whole
// set, so one left out would be cleared) plus favordynmods, without rw/ro.
func TestFavorDynModsOptions(t *testing.T) {
	for in, want := range map[string][]string{
		"rw":                                     {FavorDynModsOption},
		"rw,nsdelegate,memory_recursiveprot":     {"nsdelegate", "memory_recursiveprot", FavorDynModsOption},
		"ro,nsdelegate,favordynmods":             {"nsdelegate", FavorDynModsOption},
		"rw,memory_localevents,pids_localevents": {"memory_localevents", "pids_localevents", FavorDynModsOption},
	} {
		if got := withFavorDynMods(mount.Info{SuperOptions: in}); !slices.Equal(got, want) {
			t.Errorf("%q: got %q, want %q", in, got, want)
		}
	}
}

// TestFavorDynMods switches the option on through the host's real cgroup2
// superblock, first through the reconfigure itself (whatever the host had:
// the daemons of other packages' tests switch it on too, with the same
// options, so nothing here races them), then through FavorDynMods, and
// checks that nothing else about the mount changed: its per-mount flags (a
// legacy MS_REMOUNT would have cleared nosuid, nodev, noexec) and its other
// superblock options. The option stays on, as a daemon leaves it.
func TestFavorDynMods(t *testing.T) {
	requireDynMods(t)
	before, _ := cgroup2Mount()
	if err := reconfigure(before.Mountpoint, withFavorDynMods(before)); err != nil {
		t.Fatal(err)
	}
	mp, changed, err := FavorDynMods()
	if err != nil || changed || mp != before.Mountpoint {
		t.Fatalf("FavorDynMods after the reconfigure: %q, changed %v, %v; want %s, no change", mp, changed, err, before.Mountpoint)
	}
	after, _ := cgroup2Mount()
	if after.Options != before.Options {
		t.Errorf("per-mount options: %q, were %q", after.Options, before.Options)
	}
	want := withFavorDynMods(before)
	slices.Sort(want)
	got := superOptions(after)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("superblock options: %q, want %q (were %q)", got, want, before.SuperOptions)
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
