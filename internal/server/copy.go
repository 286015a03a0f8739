package server

import (
	"context"
	"fmt"
	"io"

	"connectrpc.com/connect"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
	"github.com/forkbox/forkbox/errdefs"
)

// copyChunk is the size of the data messages CopyFrom sends.
const copyChunk = 256 << 10

// streamReader reads the data messages of a CopyTo stream after its header.
type streamReader struct {
	s   *connect.ClientStream[v1.CopyToRequest]
	buf []byte
}

func (r *streamReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if !r.s.Receive() {
			if err := r.s.Err(); err != nil {
				return 0, fmt.Errorf("copy stream: %v: %w", err, errdefs.ErrUnavailable)
			}
			return 0, io.EOF
		}
		m := r.s.Msg()
		if m.GetHeader() != nil {
			return 0, fmt.Errorf("copy stream: a second header: %w", errdefs.ErrInvalidArgument)
		}
		r.buf = m.GetData()
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

func (s *sandboxes) CopyTo(ctx context.Context, stream *connect.ClientStream[v1.CopyToRequest]) (*connect.Response[v1.CopyToResponse], error) {
	if !stream.Receive() {
		if err := stream.Err(); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("copy: empty stream, want a header first: %w", errdefs.ErrInvalidArgument)
	}
	h := stream.Msg().GetHeader()
	if h == nil {
		return nil, fmt.Errorf("copy: the first message must be the header: %w", errdefs.ErrInvalidArgument)
	}
	res, err := s.d.CopyTo(ctx, h.Sandbox, h.Path, &streamReader{s: stream})
	if err != nil {
		drainCopy(stream)
		return nil, err
	}
	return connect.NewResponse(&v1.CopyToResponse{Bytes: res.Bytes, Entries: res.Entries}), nil
}

// drainLimit bounds what drainCopy discards.
const drainLimit = 64 << 20

// drainCopy discards the unread rest of a refused CopyTo stream (up to
// drainLimit bytes) before the error is answered. Over HTTP/1.1 a handler
// that answers before the request body has ended makes the server close
// the connection, and the client can lose the answer to the close.
func drainCopy(stream *connect.ClientStream[v1.CopyToRequest]) {
	for n := 0; n <= drainLimit && stream.Receive(); {
		n += len(stream.Msg().GetData())
	}
}

// chunkSender sends writes as data messages of at most copyChunk bytes.
type chunkSender struct {
	s *connect.ServerStream[v1.CopyFromResponse]
}

func (w chunkSender) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		c := min(len(p), copyChunk)
		if err := w.s.Send(&v1.CopyFromResponse{Data: append([]byte(nil), p[:c]...)}); err != nil {
			return n, fmt.Errorf("copy stream: %v: %w", err, errdefs.ErrUnavailable)
		}
		n += c
		p = p[c:]
	}
	return n, nil
}

func (s *sandboxes) CopyFrom(ctx context.Context, req *connect.Request[v1.CopyFromRequest], stream *connect.ServerStream[v1.CopyFromResponse]) error {
	_, err := s.d.CopyFrom(ctx, req.Msg.Sandbox, req.Msg.Path, chunkSender{s: stream})
	return err
}
