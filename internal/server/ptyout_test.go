package server

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/h2c"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
	"github.com/forkbox/forkbox/errdefs"
)

const testPtyProcedure = "/test.v1.Test/Pty"

// h2cServer serves handler over h2c, as Listen does, with stream control on
// testPtyProcedure.
// It also returns the transport's CloseIdleConnections.
func h2cServer(t *testing.T, handler func(context.Context, *connect.BidiStream[v1.PtyRequest, v1.PtyResponse]) error) (*connect.Client[v1.PtyRequest, v1.PtyResponse], func()) {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle(testPtyProcedure, connect.NewBidiStreamHandler(testPtyProcedure, handler))
	srv := httptest.NewUnstartedServer(h2c.NewHandler(withStreamControl(testPtyProcedure, mux), &http2.Server{}))
	srv.Start()
	t.Cleanup(srv.Close)
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &p}
	t.Cleanup(tr.CloseIdleConnections)
	return connect.NewClient[v1.PtyRequest, v1.PtyResponse](&http.Client{Transport: tr}, srv.URL+testPtyProcedure), tr.CloseIdleConnections
}

type outResult struct {
	pushErr, sendErr error
	pushed           int
}

// TestPtyOutputStalledCaller: a caller that starts a stream and never reads
// it makes push fail with ResourceExhausted after the stall timeout, and the
// sender, blocked in Send by HTTP/2 flow control, is ended and joined.
func TestPtyOutputStalledCaller(t *testing.T) {
	const stall = 300 * time.Millisecond
	results := make(chan outResult, 1)
	client, closeIdle := h2cServer(t, func(ctx context.Context, stream *connect.BidiStream[v1.PtyRequest, v1.PtyResponse]) error {
		if _, err := stream.Receive(); err != nil {
			return err
		}
		out := newPtyOutput(stall, func(b []byte) error {
			return stream.Send(&v1.PtyResponse{Event: &v1.PtyResponse_Data{Data: b}})
		})
		// Random bytes: gzip (which the client accepts) must not shrink
		// them to nothing.
		chunk := make([]byte, 32<<10)
		rand.Read(chunk)
		var r outResult
		for r.pushed < 1<<30 {
			if r.pushErr = out.push(chunk); r.pushErr != nil {
				break
			}
			r.pushed += len(chunk)
		}
		r.sendErr = out.close(0, streamControl(ctx).reset)
		results <- r
		return r.pushErr
	})
	goroutines := runtime.NumGoroutine()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stream := client.CallBidiStream(ctx)
	if err := stream.Send(&v1.PtyRequest{Event: &v1.PtyRequest_Start{Start: &v1.PtyStart{}}}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var r outResult
	select {
	case r = <-results:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler of a caller that does not read never ended")
	}
	if !errdefs.IsResourceExhausted(r.pushErr) {
		t.Errorf("push: got %v after %d bytes, want ResourceExhausted", r.pushErr, r.pushed)
	}
	if r.sendErr == nil {
		t.Error("the blocked send returned no error")
	}
	t.Logf("stalled after %d bytes; ended %v after the start", r.pushed, time.Since(start).Round(time.Millisecond))
	stream.CloseRequest()
	stream.CloseResponse()
	cancel()
	deadline := time.Now().Add(20 * time.Second)
	for closeIdle(); runtime.NumGoroutine() > goroutines; closeIdle() {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("goroutines %d, before %d:\n%s", runtime.NumGoroutine(), goroutines, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestPtyOutputReadingCaller: a caller that reads gets everything pushed, in
// order, and close waits for it.
func TestPtyOutputReadingCaller(t *testing.T) {
	const n = 500
	client, _ := h2cServer(t, func(ctx context.Context, stream *connect.BidiStream[v1.PtyRequest, v1.PtyResponse]) error {
		if _, err := stream.Receive(); err != nil {
			return err
		}
		out := newPtyOutput(10*time.Second, func(b []byte) error {
			return stream.Send(&v1.PtyResponse{Event: &v1.PtyResponse_Data{Data: b}})
		})
		for i := 0; i < n; i++ {
			if err := out.push(bytes.Repeat([]byte{byte(i)}, 4096)); err != nil {
				return err
			}
		}
		return out.close(time.Minute, streamControl(ctx).reset)
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stream := client.CallBidiStream(ctx)
	if err := stream.Send(&v1.PtyRequest{Event: &v1.PtyRequest_Start{Start: &v1.PtyStart{}}}); err != nil {
		t.Fatal(err)
	}
	stream.CloseRequest()
	for i := 0; ; i++ {
		msg, err := stream.Receive()
		if err != nil {
			if i != n || !errors.Is(err, io.EOF) {
				t.Fatalf("after %d messages: %v", i, err)
			}
			break
		}
		if d := msg.GetData(); len(d) != 4096 || d[0] != byte(i) {
			t.Fatalf("message %d: got %d bytes of %d", i, len(d), d[0])
		}
	}
	stream.CloseResponse()
}

// TestStreamControlEndsReceive: endReceive makes a Receive blocked on a
// caller that sends nothing return, so ExecPty can join its reader.
func TestStreamControlEndsReceive(t *testing.T) {
	ended := make(chan error, 1)
	client, _ := h2cServer(t, func(ctx context.Context, stream *connect.BidiStream[v1.PtyRequest, v1.PtyResponse]) error {
		if _, err := stream.Receive(); err != nil {
			return err
		}
		recv := make(chan error, 1)
		go func() {
			_, err := stream.Receive()
			recv <- err
		}()
		if err := stream.Send(&v1.PtyResponse{Event: &v1.PtyResponse_Data{Data: []byte("started")}}); err != nil {
			return err
		}
		streamControl(ctx).endReceive()
		select {
		case err := <-recv:
			ended <- err
		case <-time.After(20 * time.Second):
			ended <- errors.New("Receive never returned")
		}
		return connect.NewError(connect.CodeInvalidArgument, errors.New("done"))
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stream := client.CallBidiStream(ctx)
	if err := stream.Send(&v1.PtyRequest{Event: &v1.PtyRequest_Start{Start: &v1.PtyStart{}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Receive(); err != nil {
		t.Fatal(err)
	}
	if err := <-ended; err == nil || err.Error() == "Receive never returned" {
		t.Errorf("Receive after endReceive: got %v, want an error at once", err)
	}
	// The error the handler returns still reaches the caller.
	if _, err := stream.Receive(); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("got %v, want the handler's InvalidArgument", err)
	}
	stream.CloseRequest()
	stream.CloseResponse()
}
