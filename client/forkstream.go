package client

import (
	"context"
	"fmt"
	"iter"

	"connectrpc.com/connect"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/errdefs/errconnect"
)

// ForkStream is a fork whose children arrive as they become ready
// (Sandbox.ForkStream). Range over Children; then Err says whether the
// stream ended cleanly.
type ForkStream struct {
	Checkpoint *Checkpoint
	// Captured, CaptureMS and FlushMS: as in ForkResult.
	Captured  string
	CaptureMS float64
	FlushMS   float64
	// Count is how many children Children yields.
	Count int
	// TotalMS is the daemon's time for the whole fork, known once Children
	// is done.
	TotalMS float64

	s      *Sandbox
	stream *connect.ServerStreamForClient[v1.ForkStreamResponse]
	cancel context.CancelFunc
	slots  int // this client's slots still held for children not yet seen
	err    error
	done   bool
}

// ForkStream checkpoints the sandbox and starts children from that state,
// like Fork, but returns as soon as the snapshot is taken: each child comes
// out of Children as soon as it is ready (or has failed), so the first can
// be used before the last has started. Close the stream when done with it
// (it stops nothing on the daemon: every child asked for is started).
func (s *Sandbox) ForkStream(ctx context.Context, o ForkOptions) (*ForkStream, error) {
	n := max(o.Count, 1)
	if err := s.c.acquire(n); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	stream, err := s.c.sbx.ForkStream(ctx, connect.NewRequest(&v1.ForkRequest{Sandbox: s.ID, Tag: o.Tag, Count: int32(n),
		Overrides: o.Overrides.proto(), Credentials: o.Credentials, FromCheckpoint: o.FromCheckpoint, BestEffort: o.BestEffort, Memory: o.Memory}))
	if err != nil {
		cancel()
		s.c.release(n)
		return nil, errconnect.FromConnect(err)
	}
	f := &ForkStream{s: s, stream: stream, cancel: cancel, slots: n}
	if !stream.Receive() {
		err := errconnect.FromConnect(stream.Err())
		if err == nil {
			err = fmt.Errorf("fork stream ended before the capture: %w", errdefs.ErrUnavailable)
		}
		f.Close()
		return nil, err
	}
	c := stream.Msg().GetCaptured()
	if c == nil {
		f.Close()
		return nil, fmt.Errorf("fork stream: the first message is not the capture: %w", errdefs.ErrInternal)
	}
	f.Checkpoint, f.Captured, f.CaptureMS, f.FlushMS, f.Count = c.Checkpoint, c.Captured, c.CaptureMs, c.FlushMs, int(c.Count)
	return f, nil
}

// Children yields each child with its index (in the order asked for) as the
// daemon reports it: a Sandbox, or the Err that child got. It can be
// ranged over once.
func (f *ForkStream) Children() iter.Seq2[int, ForkChild] {
	return func(yield func(int, ForkChild) bool) {
		if f.done {
			return
		}
		defer func() { f.done = true }()
		for f.stream.Receive() {
			switch ev := f.stream.Msg().Event.(type) {
			case *v1.ForkStreamResponse_Child:
				fc := ForkChild{StartMS: ev.Child.GetChild().GetStartMs()}
				if sb := ev.Child.GetChild().GetSandbox(); sb != nil {
					fc.Sandbox = &Sandbox{c: f.s.c, ID: sb.Id, Info: sb, slot: true}
				} else {
					f.s.c.release(1)
				}
				if e := ev.Child.GetChild().GetError(); e != "" {
					fc.Err = errdefs.FromClassName(ev.Child.Child.ErrorClass, e)
				}
				f.slots--
				if !yield(int(ev.Child.Index), fc) {
					return
				}
			case *v1.ForkStreamResponse_Done:
				f.TotalMS = ev.Done.TotalMs
			}
		}
		f.err = errconnect.FromConnect(f.stream.Err())
	}
}

// Err is the error that ended the stream early (nil after a whole fork).
func (f *ForkStream) Err() error { return f.err }

// Close ends the stream. Children not yet received still start on the
// daemon; this client's slots for them are given back.
func (f *ForkStream) Close() error {
	f.cancel()
	err := f.stream.Close()
	if f.slots > 0 {
		f.s.c.release(f.slots)
		f.slots = 0
	}
	return err
}
