package main

import (
	"context"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/client"
)

// The density section's sessions phase (--density-sessions): hibernated
// sandboxes hold no memory and no bridge port, so a host keeps many more
// of them than it runs.

// growSessions adds sandboxes to all, each hibernated once it is up, a
// few at once, until target exist or the disk under the daemon's state
// has only --density-min-disk free; it returns them with each one's
// create-and-hibernate time and why it stopped.
func (b *bench) growSessions(ctx context.Context, all []*client.Sandbox, target int) ([]*client.Sandbox, []float64, string) {
	var mu sync.Mutex
	var made []float64
	var failed error
	for len(all) < target {
		if b.freeDiskGiB() < b.opts.densityMinDisk {
			return all, made, "min disk"
		}
		var wg sync.WaitGroup
		for range min(densityParallel, target-len(all)) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				t := time.Now()
				sb, err := b.c.CreateSandbox(ctx, client.CreateOptions{Image: b.image, Runtime: densityRuntime,
					Resources: client.Resources{Memory: b.opts.densityMemory}})
				if err == nil {
					b.track(sb)
					err = sb.Hibernate(ctx)
				}
				mu.Lock()
				defer mu.Unlock()
				if sb != nil {
					all = append(all, sb)
				}
				if err != nil {
					failed = err
					return
				}
				made = append(made, ms(time.Since(t)))
			}()
		}
		wg.Wait()
		if failed != nil {
			return all, made, "create or hibernate failed: " + failed.Error()
		}
		if len(all)%500 < densityParallel {
			progress("density: %d sessions, %.1f GiB disk free, %.1f GiB memory available", len(all), b.freeDiskGiB(), memAvailableGiB())
		}
	}
	return all, made, "target"
}

// freeDiskGiB is the free space of the filesystem holding the daemon's
// state (the root's with --host).
func (b *bench) freeDiskGiB() float64 {
	dir := b.stateDir
	if dir == "" {
		dir = "/"
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0
	}
	return float64(st.Bavail) * float64(st.Bsize) / (1 << 30)
}
