package agent

import (
	"context"
	"fmt"
	"io"
	"path/filepath"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/tarcopy"
)

// Copies (`forkbox cp`): tar streams in and out of the sandbox. The agent
// extracts with package tarcopy, which keeps every entry below the target
// directory and never writes through a symlink; setuid bits are kept (the
// files stay inside the sandbox). Both directions are bounded by the size
// in the request, which the daemon sets from its --max-copy-size.

// CopyResult is what a copy moved: bytes of the tar stream, and entries.
type CopyResult = tarcopy.Result

// bodyReader reads a request body's data frames as a stream; the EOF frame
// ends it.
type bodyReader struct {
	body *reqBody
	buf  []byte
	done bool
}

func (r *bodyReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if r.done {
			return 0, io.EOF
		}
		f, err := r.body.next()
		if err != nil {
			return 0, fmt.Errorf("read tar stream: %v: %w", err, errdefs.ErrUnavailable)
		}
		switch f.typ {
		case frameEOF:
			r.done = true
		case frameData:
			r.buf = f.payload
		default:
			return 0, fmt.Errorf("tar stream: unexpected frame %q: %w", f.typ, errdefs.ErrInvalidArgument)
		}
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

func (s *Server) handleUntar(body *reqBody, fw *frameWriter, hdr *request) error {
	dir, err := checkPath(hdr.Path)
	if err != nil {
		return err
	}
	if hdr.Size <= 0 {
		return fmt.Errorf("untar %s: no size bound: %w", dir, errdefs.ErrInvalidArgument)
	}
	br := &bodyReader{body: body}
	res, err := tarcopy.Extract(context.Background(), br, dir, tarcopy.ExtractOptions{MaxBytes: hdr.Size, KeepSpecialBits: true})
	if err != nil {
		return err
	}
	// The archive's end may leave padding before the EOF frame; it counts
	// toward the bound too.
	n, err := io.Copy(io.Discard, io.LimitReader(br, hdr.Size-res.Bytes+1))
	if err != nil {
		return err
	}
	if res.Bytes+n > hdr.Size {
		return fmt.Errorf("untar %s: stream larger than %d bytes: %w", dir, hdr.Size, errdefs.ErrResourceExhausted)
	}
	res.Bytes += n
	return fw.writeJSON(frameResult, res)
}

// frameStream writes a stream as data frames of at most chunkSize bytes.
type frameStream struct{ fw *frameWriter }

func (w frameStream) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		c := min(len(p), chunkSize)
		if err := w.fw.write(frameData, streamStdout, p[:c]); err != nil {
			return n, err
		}
		n += c
		p = p[c:]
	}
	return n, nil
}

func (s *Server) handleTar(fw *frameWriter, hdr *request) error {
	p, err := checkPath(hdr.Path)
	if err != nil {
		return err
	}
	if hdr.Size <= 0 {
		return fmt.Errorf("tar %s: no size bound: %w", p, errdefs.ErrInvalidArgument)
	}
	name := filepath.Base(p)
	if p == "/" {
		name = "rootfs"
	}
	res, err := tarcopy.Write(context.Background(), frameStream{fw}, p, name, hdr.Size)
	if err != nil {
		return err
	}
	return fw.writeJSON(frameResult, res)
}

// Untar extracts the tar stream r into the absolute directory dir in the
// sandbox (made if missing), at most max bytes of it. r is read in the
// calling goroutine; the agent's answer is watched meanwhile, so a stream
// the agent refuses early (a bad entry, a full disk) stops being sent.
func (c *Client) Untar(ctx context.Context, dir string, r io.Reader, max int64) (CopyResult, error) {
	var res CopyResult
	cl, err := c.open(ctx, request{Op: opUntar, Path: dir, Size: max})
	if err != nil {
		return res, err
	}
	defer cl.close()
	// The header goes now: the agent drops a connection whose header takes
	// more than headerTimeout, and a slow stream (a pipe, a slow client)
	// may not fill the buffer for longer.
	_ = cl.bw.Flush() // a write error shows up in the answer
	type answer struct{ err error }
	answered := make(chan answer, 1)
	// The reader stops at the agent's last frame, or when the connection
	// closes (cl.close, deferred): it is waited for below either way.
	go func() { answered <- answer{cl.result(ctx, opUntar, nil, &res)} }()
	wait := func() error {
		cl.conn.Close()
		return (<-answered).err
	}
	buf := make([]byte, chunkSize)
	var sent int64
	for {
		select {
		case a := <-answered:
			if a.err == nil {
				a.err = fmt.Errorf("agent untar: answered before the stream ended: %w", errdefs.ErrInternal)
			}
			return res, a.err
		default:
		}
		n, rerr := r.Read(buf)
		if n > 0 {
			sent += int64(n)
			if sent > max {
				wait()
				return res, fmt.Errorf("copy to %s: tar stream larger than %d bytes: %w", dir, max, errdefs.ErrResourceExhausted)
			}
			if err := cl.fw.write(frameData, streamStdin, buf[:n]); err != nil {
				break // the agent closed: its answer says why
			}
		}
		if rerr == io.EOF {
			if err := cl.fw.write(frameEOF, streamStdin, nil); err == nil {
				cl.bw.Flush()
			}
			break
		}
		if rerr != nil {
			wait()
			if errdefs.Class(rerr) != errdefs.ErrUnknown {
				return res, rerr
			}
			return res, fmt.Errorf("copy to %s: read the stream: %v: %w", dir, rerr, errdefs.ErrUnavailable)
		}
	}
	_ = cl.bw.Flush() // on a write error the answer (an error frame) may still be readable
	a := <-answered
	return res, a.err
}

// Tar writes the file, symlink or directory at the absolute path in the
// sandbox to w as a tar stream (one top-level entry, named after the
// path's base name), at most max bytes of it: a sandbox that sends more is
// cut off with ResourceExhausted.
func (c *Client) Tar(ctx context.Context, path string, w io.Writer, max int64) (CopyResult, error) {
	var res CopyResult
	cl, err := c.open(ctx, request{Op: opTar, Path: path, Size: max})
	if err != nil {
		return res, err
	}
	defer cl.close()
	if err := cl.bw.Flush(); err != nil {
		return res, fmt.Errorf("agent tar: %v: %w", err, errdefs.ErrUnavailable)
	}
	var got int64
	err = cl.result(ctx, opTar, func(_ byte, p []byte) error {
		got += int64(len(p))
		if got > max {
			return fmt.Errorf("copy from %s: tar stream larger than %d bytes: %w", path, max, errdefs.ErrResourceExhausted)
		}
		if _, err := w.Write(p); err != nil {
			if errdefs.Class(err) != errdefs.ErrUnknown {
				return err
			}
			return fmt.Errorf("copy from %s: send: %v: %w", path, err, errdefs.ErrUnavailable)
		}
		return nil
	}, &res)
	return res, err
}
