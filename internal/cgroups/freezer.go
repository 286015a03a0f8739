// Package cgroups is the daemon's access to a sandbox's cgroups, which the
// OCI runtimes create: it freezes and thaws them, on cgroup v1 (the freezer
// controller) and v2 (cgroup.freeze); reads their OOM kill count and their
// CPU, memory and pids counters (stats.go); and kills
// what is left in them and removes them from every mounted hierarchy when a
// sandbox is closed or found orphaned. Freezing stops every process of the
// sandbox (for gVisor: the sentry and gofer themselves), so what it wrote is
// stable while its writable layer is snapshotted.
package cgroups

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// Root is where the cgroup hierarchies are mounted.
var Root = "/sys/fs/cgroup"

// freezeFiles returns the file to write and how to read the state, for the
// cgroup at path (relative to the hierarchy roots, e.g. "/forkbox/sb-1").
func freezeFile(path string) (file string, v2 bool, err error) {
	v1 := filepath.Join(Root, "freezer", path, "freezer.state")
	if _, err := os.Stat(v1); err == nil {
		return v1, false, nil
	}
	v2f := filepath.Join(Root, path, "cgroup.freeze")
	if _, err := os.Stat(v2f); err == nil {
		return v2f, true, nil
	}
	return "", false, fmt.Errorf("cgroup %s: no freezer (v1 freezer.state or v2 cgroup.freeze): %w", path, errdefs.ErrNotFound)
}

// Freeze freezes the cgroup and waits until every task in it is frozen.
func Freeze(ctx context.Context, path string) error {
	return set(ctx, path, true)
}

// Thaw thaws the cgroup.
func Thaw(ctx context.Context, path string) error {
	return set(ctx, path, false)
}

// Frozen reports whether the cgroup is frozen.
func Frozen(path string) (bool, error) {
	file, v2, err := freezeFile(path)
	if err != nil {
		return false, err
	}
	return frozen(file, v2)
}

func frozen(file string, v2 bool) (bool, error) {
	if v2 {
		b, err := os.ReadFile(filepath.Join(filepath.Dir(file), "cgroup.events"))
		if err != nil {
			return false, err
		}
		return strings.Contains(string(b), "frozen 1"), nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return false, err
	}
	return strings.TrimSpace(string(b)) == "FROZEN", nil
}

func set(ctx context.Context, path string, freeze bool) error {
	file, v2, err := freezeFile(path)
	if err != nil {
		return err
	}
	val := map[bool]string{true: "FROZEN", false: "THAWED"}[freeze]
	if v2 {
		val = map[bool]string{true: "1", false: "0"}[freeze]
	}
	if err := os.WriteFile(file, []byte(val), 0); err != nil {
		return fmt.Errorf("cgroup %s: write %s: %w", path, val, err)
	}
	// v1 goes FREEZING -> FROZEN; v2 reports "frozen 1" in cgroup.events.
	// Busy cgroups take up to a few hundred ms; the v1 kernel may need the
	// state rewritten to retry tasks that were not frozen yet.
	for delay := 100 * time.Microsecond; ; delay = min(delay*2, 10*time.Millisecond) {
		got, err := frozen(file, v2)
		if err != nil {
			return fmt.Errorf("cgroup %s: %w", path, err)
		}
		if got == freeze {
			return nil
		}
		select {
		case <-ctx.Done():
			if freeze {
				_ = os.WriteFile(file, []byte(map[bool]string{true: "0", false: "THAWED"}[v2]), 0)
			}
			return fmt.Errorf("cgroup %s: freeze=%v did not settle: %w", path, freeze, errors.Join(ctx.Err(), errdefs.ErrUnavailable))
		case <-time.After(delay):
		}
		if freeze && !v2 {
			_ = os.WriteFile(file, []byte("FROZEN"), 0)
		}
	}
}
