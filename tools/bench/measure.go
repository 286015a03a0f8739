package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/forkbox/forkbox/client"
)

// RuntimeResult is section 1 for one runtime.
type RuntimeResult struct {
	Runtime string `json:"runtime"`
	// CreateFirstExec is CreateSandbox + the first exec of `true`.
	CreateFirstExec Summary `json:"create_first_exec"`
	ExecTrue        Summary `json:"exec_true"`
	// CreateOverFloor and ExecOverFloor are p50 ratios to the raw floor.
	CreateOverFloor float64 `json:"create_over_floor"`
	ExecOverFloor   float64 `json:"exec_over_floor"`
}

func (b *bench) measureRuntime(ctx context.Context, rt string) (RuntimeResult, error) {
	r := RuntimeResult{Runtime: rt}
	var creates []float64
	for i := range b.opts.reps + 1 { // the first is a warm-up
		t := time.Now()
		sb, err := b.create(ctx, rt)
		if err != nil {
			return r, err
		}
		_, err = execTrue(ctx, sb)
		d := ms(time.Since(t))
		b.close(ctx, sb)
		if err != nil {
			return r, err
		}
		if i > 0 {
			creates = append(creates, d)
		}
	}
	r.CreateFirstExec = summarize(creates)
	sb, err := b.create(ctx, rt)
	if err != nil {
		return r, err
	}
	defer b.close(ctx, sb)
	var execs []float64
	for i := range b.opts.execReps + 1 {
		d, err := execTrue(ctx, sb)
		if err != nil {
			return r, err
		}
		if i > 0 {
			execs = append(execs, d)
		}
	}
	r.ExecTrue = summarize(execs)
	return r, nil
}

// ForkResult is section 2 for one size and runtime.
type ForkResult struct {
	Runtime string `json:"runtime"`
	Size    string `json:"size"`
	Files   int64  `json:"files"`
	// SetupMS is the one source setup (create + write), for reference.
	SetupMS float64 `json:"setup_ms"`
	// Capture is ForkResult.CaptureMS: freeze + snapshot + thaw.
	Capture Summary `json:"capture"`
	// ChildStart is ForkChild.StartMS: the child's launch in the daemon.
	ChildStart Summary `json:"child_start"`
	// ForkWall is the client's wall time from the fork call to the child
	// being ready for exec.
	ForkWall Summary `json:"fork_wall"`
	// Baseline is create a fresh sandbox + write the same data into it.
	Baseline Summary `json:"baseline"`
	// Speedup is Baseline p50 / ForkWall p50.
	Speedup float64 `json:"speedup"`
}

// forkOnce forks one child of src, waits for it and closes it.
func (b *bench) forkOnce(ctx context.Context, src *client.Sandbox, tag string) (capture, start, wall float64, err error) {
	t := time.Now()
	res, err := src.Fork(ctx, client.ForkOptions{Tag: tag, Count: 1})
	wall = ms(time.Since(t))
	if err != nil {
		return 0, 0, 0, fmt.Errorf("fork %s: %w", src.ID, err)
	}
	b.track(res.Sandboxes()...)
	b.close(ctx, res.Sandboxes()...)
	b.deleteCheckpoint(ctx, res.Checkpoint)
	if c := res.Children[0]; c.Err != nil {
		return 0, 0, 0, fmt.Errorf("fork %s: child: %w", src.ID, c.Err)
	}
	return res.CaptureMS, res.Children[0].StartMS, wall, nil
}

func (b *bench) deleteCheckpoint(ctx context.Context, ck *client.Checkpoint) {
	if ck == nil {
		return
	}
	if err := b.c.DeleteCheckpoint(context.WithoutCancel(ctx), ck.Id); err != nil {
		slog.Debug("delete checkpoint", "checkpoint", ck.Id, "err", err)
	}
}

func (b *bench) measureFork(ctx context.Context, rt string, size int64, label string) (ForkResult, error) {
	r := ForkResult{Runtime: rt, Size: label, Files: max(size/fileSize, 1)}
	cmd := writeCmd(size)
	t := time.Now()
	src, err := b.create(ctx, rt)
	if err != nil {
		return r, err
	}
	defer b.close(ctx, src)
	if err := sh(ctx, src, cmd); err != nil {
		return r, fmt.Errorf("setup %s: %w", label, err)
	}
	r.SetupMS = ms(time.Since(t))
	progress("  %s %s: source ready in %.1f s; %d forks", rt, label, r.SetupMS/1000, b.opts.reps)
	var caps, starts, walls []float64
	for i := range b.opts.reps {
		c, s, w, err := b.forkOnce(ctx, src, fmt.Sprintf("bench-%s-%d", label, i))
		if err != nil {
			return r, err
		}
		caps, starts, walls = append(caps, c), append(starts, s), append(walls, w)
	}
	r.Capture, r.ChildStart, r.ForkWall = summarize(caps), summarize(starts), summarize(walls)
	progress("  %s %s: baseline x%d (create + write)", rt, label, b.opts.baselineReps)
	var base []float64
	for range b.opts.baselineReps {
		t := time.Now()
		sb, err := b.create(ctx, rt)
		if err != nil {
			return r, err
		}
		err = sh(ctx, sb, cmd)
		d := ms(time.Since(t))
		b.close(ctx, sb)
		if err != nil {
			return r, fmt.Errorf("baseline %s: %w", label, err)
		}
		base = append(base, d)
	}
	r.Baseline = summarize(base)
	r.Speedup = ratio(r.Baseline.Median, r.ForkWall.Median)
	return r, nil
}

// FanoutResult is section 3 for one runtime.
type FanoutResult struct {
	Runtime   string  `json:"runtime"`
	Count     int     `json:"count"`
	Started   int     `json:"started"`
	Failed    int     `json:"failed"`
	FirstErr  string  `json:"first_error,omitempty"`
	CaptureMS float64 `json:"capture_ms"`
	// TotalMS is ForkResult.TotalMS: the call until the last child is ready.
	TotalMS    float64 `json:"total_ms"`
	WallMS     float64 `json:"wall_ms"`
	ChildStart Summary `json:"child_start"`
	CloseMS    float64 `json:"close_ms"`
}

func (b *bench) measureFanout(ctx context.Context, rt string) (FanoutResult, error) {
	r := FanoutResult{Runtime: rt, Count: b.opts.fanout}
	src, err := b.create(ctx, rt)
	if err != nil {
		return r, err
	}
	defer b.close(ctx, src)
	if err := sh(ctx, src, writeCmd(1_000_000)); err != nil {
		return r, err
	}
	t := time.Now()
	res, err := src.Fork(ctx, client.ForkOptions{Tag: "bench-fanout", Count: b.opts.fanout})
	r.WallMS = ms(time.Since(t))
	if err != nil {
		return r, fmt.Errorf("fork %d: %w", b.opts.fanout, err)
	}
	kids := res.Sandboxes()
	b.track(kids...)
	r.CaptureMS, r.TotalMS = res.CaptureMS, res.TotalMS
	var starts []float64
	for _, c := range res.Children {
		if c.Err != nil {
			r.Failed++
			if r.FirstErr == "" {
				r.FirstErr = c.Err.Error()
			}
			continue
		}
		r.Started++
		starts = append(starts, c.StartMS)
	}
	r.ChildStart = summarize(starts)
	t = time.Now()
	b.close(ctx, kids...)
	r.CloseMS = ms(time.Since(t))
	b.deleteCheckpoint(ctx, res.Checkpoint)
	return r, nil
}

// BusyResult is section 4 for one runtime: capture of an idle source, then
// of the same source running CPU-busy loops.
type BusyResult struct {
	Runtime string  `json:"runtime"`
	Loops   int     `json:"busy_loops"`
	Idle    Summary `json:"idle_capture"`
	Busy    Summary `json:"busy_capture"`
	Ratio   float64 `json:"busy_over_idle"`
}

func (b *bench) measureBusy(ctx context.Context, rt string) (BusyResult, error) {
	r := BusyResult{Runtime: rt, Loops: 2}
	src, err := b.create(ctx, rt)
	if err != nil {
		return r, err
	}
	defer b.close(ctx, src)
	if err := sh(ctx, src, writeCmd(1_000_000)); err != nil {
		return r, err
	}
	captures := func(name string) (Summary, error) {
		var xs []float64
		for i := range b.opts.reps {
			c, _, _, err := b.forkOnce(ctx, src, fmt.Sprintf("bench-%s-%d", name, i))
			if err != nil {
				return Summary{}, err
			}
			xs = append(xs, c)
		}
		return summarize(xs), nil
	}
	if r.Idle, err = captures("idle"); err != nil {
		return r, err
	}
	for range r.Loops {
		if _, err := src.Start(ctx, client.ExecOptions{Shell: "while :; do :; done"}); err != nil {
			return r, fmt.Errorf("start busy loop: %w", err)
		}
	}
	time.Sleep(300 * time.Millisecond)
	if r.Busy, err = captures("busy"); err != nil {
		return r, err
	}
	r.Ratio = ratio(r.Busy.Median, r.Idle.Median)
	return r, nil
}
