package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// Stat describes the file at the absolute path (a symlink itself, not its
// target).
func (c *Client) Stat(ctx context.Context, path string) (Entry, error) {
	var e Entry
	err := c.simple(ctx, request{Op: opStat, Path: path}, &e)
	return e, err
}

// MakeDir creates the directory path and its parents; AlreadyExists if it
// is there.
func (c *Client) MakeDir(ctx context.Context, path string) (Entry, error) {
	var e Entry
	err := c.simple(ctx, request{Op: opMkdir, Path: path}, &e)
	return e, err
}

// Move renames src to dst, creating dst's parents.
func (c *Client) Move(ctx context.Context, src, dst string) (Entry, error) {
	var e Entry
	err := c.simple(ctx, request{Op: opMove, Path: src, Dest: dst}, &e)
	return e, err
}

// Remove removes path and, for a directory, everything below it.
func (c *Client) Remove(ctx context.Context, path string) error {
	return c.simple(ctx, request{Op: opRemove, Path: path}, nil)
}

// Signal sends signal sig to the process group of the running exec pid.
func (c *Client) Signal(ctx context.Context, pid, sig int) error {
	return c.simple(ctx, request{Op: opSignal, Pid: pid, Signal: sig}, nil)
}

// Walk lists the directory path to depth levels (1: its entries), at most
// MaxWalkEntries entries.
func (c *Client) Walk(ctx context.Context, path string, depth int) ([]Entry, error) {
	cl, err := c.open(ctx, request{Op: opWalk, Path: path, Depth: depth})
	if err != nil {
		return nil, err
	}
	defer cl.close()
	_ = cl.bw.Flush()
	var out []Entry
	err = cl.result(ctx, opWalk, func(_ byte, p []byte) error {
		var batch []Entry
		if err := json.Unmarshal(p, &batch); err != nil {
			return fmt.Errorf("agent walk %s: decode entries: %v: %w", path, err, errdefs.ErrInternal)
		}
		if len(out)+len(batch) > MaxWalkEntries {
			return fmt.Errorf("agent walk %s: more than %d entries: %w", path, MaxWalkEntries, errdefs.ErrResourceExhausted)
		}
		out = append(out, batch...)
		return nil
	}, nil)
	return out, err
}

// Watch watches the directory path (with recursive, its subdirectories
// too) until ctx ends or the directory is removed, passing each batch of
// changes to onEvents. started is called once the watch has its first look
// of the tree: changes from then on are reported. Watch returns nil when
// the directory was removed, ctx's error class when ctx ended.
func (c *Client) Watch(ctx context.Context, path string, recursive bool, started func(), onEvents func([]WatchEvent) error) error {
	cl, err := c.open(ctx, request{Op: opWatch, Path: path, Recursive: recursive})
	if err != nil {
		return err
	}
	defer cl.close()
	_ = cl.bw.Flush()
	if err := cl.result(ctx, opWatch, nil, nil, frameStarted); err != nil {
		return err
	}
	if started != nil {
		started()
	}
	return cl.result(ctx, opWatch, func(_ byte, p []byte) error {
		var evs []WatchEvent
		if err := json.Unmarshal(p, &evs); err != nil {
			return fmt.Errorf("agent watch %s: decode events: %v: %w", path, err, errdefs.ErrInternal)
		}
		return onEvents(evs)
	}, nil)
}

// ExecIO is where a streamed exec's input comes from and its output goes.
type ExecIO struct {
	// Stdin, if set, is copied to the command's standard input as it comes;
	// its EOF closes that input. ExecStream closes it when the command has
	// ended, which must make a blocked Read return (an io.Pipe does).
	Stdin io.ReadCloser
	// Stdout and Stderr receive the output as it arrives; either may be nil.
	Stdout, Stderr io.Writer
	// Started, if set, is called with the command's pid before any output.
	Started func(pid int)
	// Detach keeps the command running if the connection fails (the
	// sandbox hibernates, say); Attach collects it then. Its stdin ends with
	// the connection.
	Detach bool
}

// ExecStream runs req as Exec does, with its standard input streamed from
// eio.Stdin and its pid reported as soon as it started. req.Stdin must be
// empty.
func (c *Client) ExecStream(ctx context.Context, req ExecRequest, eio ExecIO) (ExecResult, error) {
	var res ExecResult
	if len(req.Stdin) > 0 {
		return res, fmt.Errorf("agent exec: stdin bytes and a stdin stream both given: %w", errdefs.ErrInvalidArgument)
	}
	cl, err := c.open(ctx, request{Op: opExec, Exec: &req, HasStdin: eio.Stdin != nil, Notify: true, Detach: eio.Detach})
	if err != nil {
		return res, err
	}
	defer cl.close()
	return cl.stream(ctx, opExec, eio)
}

// Attach reattaches to the detached exec pid (see ExecIO.Detach): from its
// started frame on, its output goes to eio and its result is returned, as
// ExecStream would have. eio.Stdin must be nil.
func (c *Client) Attach(ctx context.Context, pid int, eio ExecIO) (ExecResult, error) {
	if eio.Stdin != nil {
		return ExecResult{}, fmt.Errorf("agent attach: an attached exec takes no stdin: %w", errdefs.ErrInvalidArgument)
	}
	cl, err := c.open(ctx, request{Op: opAttach, Pid: pid})
	if err != nil {
		return ExecResult{}, err
	}
	defer cl.close()
	return cl.stream(ctx, opAttach, eio)
}

// stream runs a streamed exec's call once its header is buffered: stdin
// out, started frame, output and result in.
func (cl *call) stream(ctx context.Context, op string, eio ExecIO) (ExecResult, error) {
	var res ExecResult
	stopKill := context.AfterFunc(ctx, func() { cl.sendKill() })
	defer stopKill()
	_ = cl.bw.Flush() // a write error shows up as a read error below
	var wg sync.WaitGroup
	if eio.Stdin != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl.copyStdin(eio.Stdin)
		}()
		defer func() {
			eio.Stdin.Close()
			cl.stopWrites() // the command has ended, or the call failed
			wg.Wait()
		}()
	}
	var started startResult
	if err := cl.result(ctx, op, nil, &started, frameStarted); err != nil {
		return res, err
	}
	if eio.Started != nil {
		eio.Started(started.Pid)
	}
	onData := func(stream byte, p []byte) error {
		w := eio.Stdout
		if stream == streamStderr {
			w = eio.Stderr
		} else if stream != streamStdout {
			w = nil
		}
		if w != nil {
			if _, err := w.Write(p); err != nil {
				return fmt.Errorf("agent exec: write output: %v: %w", err, errdefs.ErrInternal)
			}
		}
		return nil
	}
	err := cl.result(ctx, op, onData, &res)
	return res, err
}

// copyStdin sends r as stdin data frames and, at its EOF, an EOF frame.
func (cl *call) copyStdin(r io.Reader) {
	buf := make([]byte, chunkSize)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if cl.fw.write(frameData, streamStdin, buf[:n]) != nil || cl.bw.Flush() != nil {
				return
			}
		}
		if err == io.EOF {
			if cl.fw.write(frameEOF, streamStdin, nil) == nil {
				cl.bw.Flush()
			}
			return
		}
		if err != nil {
			return
		}
	}
}

// sendKill asks the agent to kill the running exec (best effort: closing
// the connection does it too).
func (cl *call) sendKill() {
	cl.conn.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	var b [frameHeaderLen]byte
	b[0] = frameKill
	cl.conn.Write(b[:])
}
