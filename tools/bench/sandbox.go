package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/forkbox/forkbox/client"
)

// bench holds the connection and every sandbox still open, so that an
// interrupted run closes what it made.
type bench struct {
	c     *client.Client
	image string
	opts  options
	// memhog is the allocator binary of the memory section, spawnFloor the
	// profile section's in-sandbox program (spawnfloor.go); daemonLog and
	// stateDir are the throwaway daemon's (empty with --host).
	memhog, spawnFloor  []byte
	daemonLog, stateDir string
	// e2b reaches the daemon's E2B endpoint (nil: none).
	e2b          *e2bClient
	daemonPID    int    // the throwaway daemon's (0 with --host)
	cgroupParent string // its --cgroup-parent ("" with --host)
	// metrics scrapes the throwaway daemon's /metrics (nil with --host).
	metrics *metricsClient

	mu   sync.Mutex
	live map[string]*client.Sandbox
}

func (b *bench) track(sbs ...*client.Sandbox) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, sb := range sbs {
		if sb != nil {
			b.live[sb.ID] = sb
		}
	}
}

// close closes sandboxes a few at a time and forgets them.
func (b *bench) close(ctx context.Context, sbs ...*client.Sandbox) {
	closeAll(context.WithoutCancel(ctx), sbs)
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, sb := range sbs {
		if sb != nil {
			delete(b.live, sb.ID)
		}
	}
}

// closeLeft closes whatever is still open.
func (b *bench) closeLeft() {
	b.mu.Lock()
	var sbs []*client.Sandbox
	for _, sb := range b.live {
		sbs = append(sbs, sb)
	}
	b.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	b.close(ctx, sbs...)
}

// create makes a sandbox of the bench image on runtime rt.
func (b *bench) create(ctx context.Context, rt string) (*client.Sandbox, error) {
	sb, err := b.c.CreateSandbox(ctx, client.CreateOptions{Image: b.image, Runtime: rt,
		Resources: client.Resources{Memory: b.opts.memory}})
	if err != nil {
		return nil, fmt.Errorf("create %s sandbox: %w", rt, err)
	}
	b.track(sb)
	return sb, nil
}

// sh runs a shell command and fails unless it exits 0.
func sh(ctx context.Context, sb *client.Sandbox, cmd string) error {
	var stderr strings.Builder
	res, err := sb.Exec(ctx, client.ExecOptions{Shell: cmd, Stderr: &stderr})
	if err != nil {
		return fmt.Errorf("exec in %s: %w", sb.ID, err)
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("exec %.80q in %s: exit %d (signal %q, oom %v): %s", cmd, sb.ID, res.ExitCode, res.Signal, res.OOMKilled, stderr.String())
	}
	return nil
}

// execTrue runs `true` and returns the round trip.
func execTrue(ctx context.Context, sb *client.Sandbox) (float64, error) {
	t := time.Now()
	res, err := sb.Exec(ctx, client.ExecOptions{Argv: []string{"true"}})
	d := ms(time.Since(t))
	if err != nil {
		return 0, fmt.Errorf("exec true in %s: %w", sb.ID, err)
	}
	if res.ExitCode != 0 {
		return 0, fmt.Errorf("exec true in %s: exit %d", sb.ID, res.ExitCode)
	}
	return d, nil
}

// fileSize is the size of every data file: 1 GB is 50,000 of them.
const fileSize = 20_000

// writeCmd is the setup that puts size bytes into /data, in files of
// fileSize bytes, 1000 per directory. Only shell builtins run per file (no
// fork per file): one base64 block of random bytes is echoed into each.
func writeCmd(size int64) string {
	n := max(size/fileSize, 1)
	per := min(size, fileSize)
	return fmt.Sprintf(`set -e; mkdir -p /data; b=$(head -c %d /dev/urandom | base64 -w0 | head -c %d); `+
		`i=0; while [ $i -lt %d ]; do d=/data/d$((i/1000)); [ -d $d ] || mkdir $d; echo -n "$b" > $d/f$i; i=$((i+1)); done; `+
		`[ $(ls /data/d0 | wc -l) -gt 0 ]`, per, per, n)
}
