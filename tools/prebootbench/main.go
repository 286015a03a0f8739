// Command prebootbench measures what pre-booted gVisor sandboxes (serve
// --preboot) buy: create → first exec and fork → child's first exec, against
// two running daemons, one with the pool and one without, interleaved round
// by round (the order alternates) so that both see the same machine load.
//
//	prebootbench -on unix:///run/a.sock -on-runsc-root /run/a/runsc -off unix:///run/b.sock -n 10
//
// Before each round it waits (60 s at most) until the pool daemon holds two
// pre-booted sandboxes (read from its runsc root): the figure is a create
// that finds a warm pool, as after any idle moment; the report says how many
// of the pool daemon's sandboxes really were pre-booted.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/internal/runtime/runsc"
	"github.com/forkbox/forkbox/internal/testimage"
)

type side struct {
	name, host, runscRoot string
	c                     *client.Client
	image                 string
	create, fork          []float64
	pooled, total         int
}

func main() {
	on := &side{name: "pool on"}
	off := &side{name: "pool off"}
	flag.StringVar(&on.host, "on", "", "daemon with --preboot (unix:///path)")
	flag.StringVar(&on.runscRoot, "on-runsc-root", "", "its runsc state root (<run-dir>/runsc)")
	flag.StringVar(&off.host, "off", "", "daemon without a pool")
	n := flag.Int("n", 10, "rounds")
	fanout := flag.Int("fanout", 0, "instead: fan-outs of this many children, -old (unary Fork) against -new (ForkStream), interleaved")
	oldHost := flag.String("old", "", "with -fanout: a daemon of the previous build")
	newHost := flag.String("new", "", "with -fanout: a daemon of this build")
	memory := flag.Bool("memory", false, "instead: memory fork → child's first exec of one source per daemon; the pool daemon's children take created placeholders")
	flag.Parse()
	ctx := context.Background()
	if *memory {
		if err := memoryForks(ctx, on, off, *n); err != nil {
			fail(err)
		}
		return
	}
	if *fanout > 0 {
		if err := fanouts(ctx, *oldHost, *newHost, *fanout, *n); err != nil {
			fail(err)
		}
		return
	}
	for _, s := range []*side{on, off} {
		if err := s.connect(ctx); err != nil {
			fail(err)
		}
	}
	for i := range *n + 1 { // round 0 warms both up and is not counted
		order := []*side{on, off}
		if i%2 == 1 {
			order = []*side{off, on}
		}
		for _, s := range order {
			if s == on {
				if err := waitSpares(ctx, on, 2, false); err != nil {
					fail(err)
				}
			}
			c, f, pooled, err := s.round(ctx)
			if err != nil {
				fail(err)
			}
			if i > 0 {
				s.create, s.fork = append(s.create, c), append(s.fork, f)
				s.total += 2
				s.pooled += pooled
			}
		}
	}
	fmt.Printf("gVisor, n=%d rounds, interleaved\n", *n)
	fmt.Printf("%-9s %-28s %-28s %s\n", "", "create→first exec p50/p95", "fork→child exec p50/p95", "pre-booted")
	for _, s := range []*side{on, off} {
		fmt.Printf("%-9s %-28s %-28s %d/%d\n", s.name, summary(s.create), summary(s.fork), s.pooled, s.total)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "prebootbench:", err)
	os.Exit(1)
}

// connect makes s's client and imports the bench's image into its daemon.
func (s *side) connect(ctx context.Context) error {
	s.c = &client.Client{Socket: strings.TrimPrefix(s.host, "unix://")}
	img, err := testimage.Busybox()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "prebootbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	archive := filepath.Join(dir, "busybox.tar")
	if err := testimage.WriteOCIArchive(img, "bench.local/busybox:latest", archive); err != nil {
		return err
	}
	im, err := s.c.ImportImage(ctx, archive, "", nil)
	if err != nil {
		return fmt.Errorf("%s: import: %w", s.name, err)
	}
	s.image = im.Name
	return nil
}

// round creates a sandbox and runs true in it, forks one child of it and
// runs true in the child; both are closed. pooled counts how many of the
// two were pre-booted.
func (s *side) round(ctx context.Context) (create, fork float64, pooled int, err error) {
	t := time.Now()
	sb, err := s.c.CreateSandbox(ctx, client.CreateOptions{Image: s.image, Runtime: "gvisor", Resources: client.Resources{Memory: "256Mi"}})
	if err != nil {
		return 0, 0, 0, fmt.Errorf("%s: create: %w", s.name, err)
	}
	defer sb.Close(context.WithoutCancel(ctx))
	if err := execTrue(ctx, sb); err != nil {
		return 0, 0, 0, err
	}
	create = ms(time.Since(t))
	t = time.Now()
	res, err := sb.Fork(ctx, client.ForkOptions{Count: 1})
	if err != nil {
		return 0, 0, 0, fmt.Errorf("%s: fork: %w", s.name, err)
	}
	child := res.Children[0]
	if child.Err != nil {
		return 0, 0, 0, fmt.Errorf("%s: fork child: %w", s.name, child.Err)
	}
	defer child.Sandbox.Close(context.WithoutCancel(ctx))
	if err := execTrue(ctx, child.Sandbox); err != nil {
		return 0, 0, 0, err
	}
	fork = ms(time.Since(t))
	for _, x := range []*client.Sandbox{sb, child.Sandbox} {
		if evs, err := x.Events(ctx); err == nil && len(evs) > 0 && evs[0].Data["preboot"] == true {
			pooled++
		}
	}
	_ = s.c.DeleteCheckpoint(ctx, res.Checkpoint.Id)
	return create, fork, pooled, nil
}

func execTrue(ctx context.Context, sb *client.Sandbox) error {
	res, err := sb.Exec(ctx, client.ExecOptions{Argv: []string{"true"}})
	if err != nil {
		return err
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("true exited %d", res.ExitCode)
	}
	return nil
}

// waitSpares waits until the pool daemon's runsc roots hold n placeholders
// (created ones only, if created) whose sandbox it does not list.
func waitSpares(ctx context.Context, s *side, n int, created bool) error {
	rs, err := runsc.New(runsc.Options{Root: s.runscRoot})
	if err != nil {
		return err
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		states, err := rs.List(ctx)
		if err != nil {
			return err
		}
		list, err := s.c.ListSandboxes(ctx, false)
		if err != nil {
			return err
		}
		spare := 0
		for _, st := range states {
			sb, ok := strings.CutPrefix(st.ID, "pod-")
			if ok && (!created || st.Status == "created") && !slices.ContainsFunc(list, func(i *client.Info) bool { return i.Id == sb }) {
				spare++
			}
		}
		if spare >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d pre-booted sandboxes after 60 s, want %d", spare, n)
		}
		time.Sleep(50 * time.Millisecond) // polling a condition, with a deadline
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func summary(v []float64) string {
	if len(v) == 0 {
		return "-"
	}
	s := slices.Clone(v)
	slices.Sort(s)
	p := func(q float64) float64 { return s[min(len(s)-1, int(q*float64(len(s))))] }
	return fmt.Sprintf("%.0f / %.0f ms", p(0.5), p(0.95))
}

// fanouts forks n times count children on each daemon, alternating: the
// old one with the unary Fork (its first child is usable when the call
// returns), the new one with ForkStream (its first child is usable when its
// event arrives).
func fanouts(ctx context.Context, oldHost, newHost string, count, n int) error {
	old, cur := &side{name: "old", host: oldHost}, &side{name: "new", host: newHost}
	for _, s := range []*side{old, cur} {
		if err := s.connect(ctx); err != nil {
			return err
		}
	}
	for i := range n {
		order := []*side{old, cur}
		if i%2 == 1 {
			order = []*side{cur, old}
		}
		for _, s := range order {
			first, total, err := s.fanout(ctx, count, s == cur)
			if err != nil {
				return err
			}
			s.create, s.fork = append(s.create, first), append(s.fork, total)
			fmt.Printf("round %d %s: first child %.0f ms, all %.0f ms\n", i, s.name, first, total)
		}
	}
	fmt.Printf("gVisor fan-out of %d, n=%d, interleaved\n", count, n)
	for _, s := range []*side{old, cur} {
		fmt.Printf("%-4s first child usable p50 %s   all children p50 %s\n", s.name, summary(s.create), summary(s.fork))
	}
	return nil
}

func (s *side) fanout(ctx context.Context, count int, stream bool) (first, total float64, err error) {
	src, err := s.c.CreateSandbox(ctx, client.CreateOptions{Image: s.image, Runtime: "gvisor", Resources: client.Resources{Memory: "256Mi"}})
	if err != nil {
		return 0, 0, err
	}
	defer src.Close(context.WithoutCancel(ctx))
	var kids []*client.Sandbox
	defer func() {
		for _, k := range kids {
			k.Close(context.WithoutCancel(ctx))
		}
	}()
	t := time.Now()
	if !stream {
		res, err := src.Fork(ctx, client.ForkOptions{Count: count})
		if err != nil {
			return 0, 0, err
		}
		total = ms(time.Since(t))
		kids = res.Sandboxes()
		if len(kids) != count {
			return 0, 0, fmt.Errorf("%s: %d of %d children started", s.name, len(kids), count)
		}
		_ = s.c.DeleteCheckpoint(ctx, res.Checkpoint.Id)
		return total, total, nil
	}
	fs, err := src.ForkStream(ctx, client.ForkOptions{Count: count})
	if err != nil {
		return 0, 0, err
	}
	defer fs.Close()
	for _, c := range fs.Children() {
		if c.Err != nil {
			return 0, 0, c.Err
		}
		if len(kids) == 0 {
			first = ms(time.Since(t))
		}
		kids = append(kids, c.Sandbox)
	}
	total = ms(time.Since(t))
	if err := fs.Err(); err != nil || len(kids) != count {
		return 0, 0, fmt.Errorf("%s: %d of %d children, %v", s.name, len(kids), count, err)
	}
	_ = s.c.DeleteCheckpoint(ctx, fs.Checkpoint.Id)
	return first, total, nil
}

// memoryForks: one source per daemon (the pool daemon's runs in a
// pre-booted sandbox), then n interleaved rounds of a memory fork of one
// child and its first exec. The pool daemon waits for a created
// placeholder before each round (its first memory fork turns the pool to
// that kind); round 0 is not counted.
func memoryForks(ctx context.Context, on, off *side, n int) error {
	srcs := map[*side]*client.Sandbox{}
	for _, s := range []*side{on, off} {
		if err := s.connect(ctx); err != nil {
			return err
		}
		if s == on {
			if err := waitSpares(ctx, on, 1, false); err != nil {
				return err
			}
		}
		// The daemon's default resources: what the pool boots for first.
		src, err := s.c.CreateSandbox(ctx, client.CreateOptions{Image: s.image, Runtime: "gvisor"})
		if err != nil {
			return fmt.Errorf("%s: create: %w", s.name, err)
		}
		defer src.Close(context.WithoutCancel(ctx))
		if _, err := src.Start(ctx, client.ExecOptions{Shell: "while :; do sleep 1; done"}); err != nil {
			return err
		}
		srcs[s] = src
	}
	for i := range n + 1 {
		order := []*side{on, off}
		if i%2 == 1 {
			order = []*side{off, on}
		}
		for _, s := range order {
			if s == on && i > 0 {
				if err := waitSpares(ctx, on, 1, true); err != nil {
					return err
				}
			}
			t := time.Now()
			res, err := srcs[s].Fork(ctx, client.ForkOptions{Count: 1, Memory: true})
			if err != nil {
				return fmt.Errorf("%s: memory fork: %w", s.name, err)
			}
			child := res.Children[0]
			if child.Err != nil {
				return fmt.Errorf("%s: memory fork child: %w", s.name, child.Err)
			}
			err = execTrue(ctx, child.Sandbox)
			took := ms(time.Since(t))
			evs, _ := child.Sandbox.Events(ctx)
			child.Sandbox.Close(context.WithoutCancel(ctx))
			_ = s.c.DeleteCheckpoint(ctx, res.Checkpoint.Id)
			if err != nil {
				return err
			}
			if i == 0 {
				continue
			}
			s.fork = append(s.fork, took)
			s.total++
			if len(evs) > 0 && evs[0].Data["preboot_kind"] == "created" {
				s.pooled++
			}
		}
	}
	fmt.Printf("gVisor memory fork of one child, default resources, n=%d rounds, interleaved\n", n)
	fmt.Printf("%-9s %-30s %s\n", "", "memory fork→child exec p50/p95", "into a created placeholder")
	for _, s := range []*side{on, off} {
		fmt.Printf("%-9s %-30s %d/%d\n", s.name, summary(s.fork), s.pooled, s.total)
	}
	return nil
}
