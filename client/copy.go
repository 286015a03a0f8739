package client

import (
	"context"
	"fmt"
	"io"

	"connectrpc.com/connect"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/errdefs/errconnect"
)

// Metrics are one reading of a sandbox's usage counters: CPU seconds,
// memory, disk, network bytes and pids (see the API's SandboxMetrics for
// what they mean under each runtime).
type Metrics = v1.SandboxMetrics

// Metrics reads the sandbox's counters now. A CPU rate is the difference
// of two readings' CpuSeconds over their TimeUnixMs difference.
func (s *Sandbox) Metrics(ctx context.Context) (*Metrics, error) {
	list, err := s.c.SandboxMetrics(ctx, s.ID)
	if err != nil {
		return nil, err
	}
	if len(list) != 1 {
		return nil, fmt.Errorf("metrics of %s: got %d readings: %w", s.ID, len(list), errdefs.ErrInternal)
	}
	return list[0], nil
}

// SandboxMetrics reads the counters of one sandbox (ID or name), or of
// every live one when idOrName is "".
func (c *Client) SandboxMetrics(ctx context.Context, idOrName string) ([]*Metrics, error) {
	c.init()
	resp, err := c.sbx.GetSandboxMetrics(ctx, connect.NewRequest(&v1.GetSandboxMetricsRequest{Sandbox: idOrName}))
	if err != nil {
		return nil, errconnect.FromConnect(err)
	}
	return resp.Msg.Metrics, nil
}

// CopyResult is what a copy into a sandbox moved.
type CopyResult = v1.CopyToResponse

// copyChunk is the size of the data messages CopyTo sends.
const copyChunk = 256 << 10

// CopyTo extracts the tar stream tarStream into the directory dir of the
// sandbox (absolute; made if missing), like `docker cp`: modes and mtimes
// are kept, entries stay below dir (names with ".." or absolute names, and
// entries through a symlink, are an InvalidArgument), and a stream larger
// than the daemon's --max-copy-size is ResourceExhausted.
func (s *Sandbox) CopyTo(ctx context.Context, dir string, tarStream io.Reader) (*CopyResult, error) {
	st := s.c.sbx.CopyTo(ctx)
	if err := st.Send(&v1.CopyToRequest{Msg: &v1.CopyToRequest_Header{Header: &v1.CopyToHeader{Sandbox: s.ID, Path: dir}}}); err != nil {
		return closeCopy(st)
	}
	buf := make([]byte, copyChunk)
	for {
		n, err := tarStream.Read(buf)
		if n > 0 {
			if serr := st.Send(&v1.CopyToRequest{Msg: &v1.CopyToRequest_Data{Data: append([]byte(nil), buf[:n]...)}}); serr != nil {
				// The daemon stopped reading: its answer says why.
				return closeCopy(st)
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			st.CloseAndReceive()
			return nil, fmt.Errorf("copy to %s:%s: read the tar stream: %v: %w", s.ID, dir, err, errdefs.ErrInvalidArgument)
		}
	}
	return closeCopy(st)
}

func closeCopy(st *connect.ClientStreamForClient[v1.CopyToRequest, v1.CopyToResponse]) (*CopyResult, error) {
	resp, err := st.CloseAndReceive()
	if err != nil {
		return nil, errconnect.FromConnect(err)
	}
	return resp.Msg, nil
}

// CopyFrom writes the file, symlink or directory at path in the sandbox
// to w as a tar stream whose one top-level entry is the path's base name.
// Symlinks are sent as symlinks. The stream comes from the sandbox: extract
// it with care (the CLI's `forkbox cp` keeps entries below the target).
func (s *Sandbox) CopyFrom(ctx context.Context, path string, w io.Writer) error {
	st, err := s.c.sbx.CopyFrom(ctx, connect.NewRequest(&v1.CopyFromRequest{Sandbox: s.ID, Path: path}))
	if err != nil {
		return errconnect.FromConnect(err)
	}
	defer st.Close()
	for st.Receive() {
		if _, err := w.Write(st.Msg().Data); err != nil {
			return fmt.Errorf("copy from %s:%s: write: %v: %w", s.ID, path, err, errdefs.ErrUnavailable)
		}
	}
	return errconnect.FromConnect(st.Err())
}
