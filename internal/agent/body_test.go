package agent

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
)

// Errors sent before a large body was read still reach the client with
// their class, not as a reset connection (Unavailable).
func TestErrorBeforeBodyRead(t *testing.T) {
	c := startServer(t, Config{})
	ctx := testCtx(t)
	dir := t.TempDir()
	big := bytes.Repeat([]byte("x"), 4<<20)
	bad := NewClient(c.addr, "wrong")
	for i := range 5 {
		if err := c.WriteFile(ctx, "relative/path", big, 0); !errdefs.IsInvalidArgument(err) {
			t.Errorf("#%d WriteFile to a relative path: got %v, want InvalidArgument", i, err)
		}
		if err := c.WriteFile(ctx, dir, big, 0); !errdefs.IsInvalidArgument(err) {
			t.Errorf("#%d WriteFile to a directory: got %v, want InvalidArgument", i, err)
		}
		if err := bad.WriteFile(ctx, filepath.Join(dir, "f"), big, 0); !errdefs.IsUnauthenticated(err) {
			t.Errorf("#%d WriteFile with a bad token: got %v, want Unauthenticated", i, err)
		}
		_, err := c.Exec(ctx, ExecRequest{Argv: []string{"no-such-binary-forkbox"}, Stdin: big}, nil, nil)
		if !errdefs.IsNotFound(err) {
			t.Errorf("#%d Exec of a missing binary with 4 MiB stdin: got %v, want NotFound", i, err)
		}
		_, err = c.Exec(ctx, ExecRequest{Argv: []string{"true"}, Cwd: "/nonexistent-forkbox", Stdin: big}, nil, nil)
		if !errdefs.IsNotFound(err) {
			t.Errorf("#%d Exec in a missing cwd with 4 MiB stdin: got %v, want NotFound", i, err)
		}
		// A process that exits without reading its stdin still gets its result.
		res, err := c.Exec(ctx, ExecRequest{Argv: []string{"true"}, Stdin: big}, nil, nil)
		if err != nil || res.ExitCode != 0 {
			t.Errorf("#%d Exec of true with 4 MiB stdin: got %+v, %v; want exit 0", i, res, err)
		}
	}
	// The agent still writes files after all that.
	if err := c.WriteFile(ctx, filepath.Join(dir, "ok"), big, 0); err != nil {
		t.Fatal(err)
	}
}

// Reading a FIFO is refused at once instead of blocking, as are devices.
func TestReadNonRegular(t *testing.T) {
	c := startServer(t, Config{})
	ctx := testCtx(t)
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := unix.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := c.ReadFile(ctx, fifo); !errdefs.IsInvalidArgument(err) {
		t.Errorf("ReadFile(fifo): got %v, want InvalidArgument", err)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("ReadFile(fifo) took %v: it blocked on the fifo until the context's end", d)
	}
	if _, err := c.ReadFile(ctx, os.DevNull); !errdefs.IsInvalidArgument(err) {
		t.Errorf("ReadFile(/dev/null): got %v, want InvalidArgument", err)
	}
	if _, err := c.ReadFile(ctx, filepath.Dir(fifo)); !errdefs.IsInvalidArgument(err) {
		t.Errorf("ReadFile(dir): got %v, want InvalidArgument", err)
	}
	// Regular files still read, and the descriptor is blocking again.
	f := filepath.Join(filepath.Dir(fifo), "f")
	os.WriteFile(f, []byte("hello"), 0o644)
	if b, err := c.ReadFile(ctx, f); err != nil || string(b) != "hello" {
		t.Errorf("ReadFile(regular): got %q, %v", b, err)
	}
	if b, err := c.ReadFile(ctx, "/proc/self/status"); err != nil || !bytes.Contains(b, []byte("Name:")) {
		t.Errorf("ReadFile(/proc/self/status): got %d bytes, %v", len(b), err)
	}
}

// rawCall sends req and a body of n bytes (data frames, then an EOF frame)
// on one connection, and returns the first frame of the reply and the error
// that ended the connection after it.
func rawCall(t *testing.T, addr string, req request, n int) (frame, error) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	// The whole request in one write, so that the body arrives right
	// behind the header and is unread when the agent refuses the request.
	var buf bytes.Buffer
	fw := &frameWriter{w: &buf}
	req.Token = testToken
	fw.writeJSON(frameHeader, req)
	chunk := make([]byte, chunkSize)
	for sent := 0; sent < n; sent += chunkSize {
		fw.write(frameData, streamStdin, chunk)
	}
	fw.write(frameEOF, streamStdin, nil)
	go conn.Write(buf.Bytes())
	br := bufio.NewReader(conn)
	f, err := readFrame(br)
	if err != nil {
		t.Fatalf("%s: no reply: %v", req.Op, err)
	}
	_, err = io.Copy(io.Discard, br)
	if err == nil {
		err = io.EOF
	}
	return f, err
}

// The agent reads a refused request's body before it closes the
// connection, so the close is a clean FIN, not a reset that could destroy
// the error frame on its way.
func TestBodyDrainedBeforeClose(t *testing.T) {
	c := startServer(t, Config{})
	for _, tc := range []struct {
		name  string
		req   request
		class error
	}{
		{"write relative", request{Op: opWrite, Path: "relative", Size: 4 << 20}, errdefs.ErrInvalidArgument},
		{"exec missing", request{Op: opExec, Exec: &ExecRequest{Argv: []string{"no-such-binary-forkbox"}}, HasStdin: true}, errdefs.ErrNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := rawCall(t, c.addr, tc.req, 4<<20)
			if f.typ != frameError {
				t.Fatalf("got frame %q, want an error frame", f.typ)
			}
			var we wireError
			json.Unmarshal(f.payload, &we)
			if errdefs.Class(we.err()) != tc.class {
				t.Errorf("got %+v, want class %v", we, tc.class)
			}
			if err != io.EOF {
				t.Errorf("connection ended with %v, want a clean close (EOF)", err)
			}
		})
	}
}
