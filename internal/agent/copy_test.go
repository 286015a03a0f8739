package agent

import (
	"archive/tar"
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

func tarStream(t *testing.T, name string, body []byte) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o640, Size: int64(len(body))})
	tw.Write(body)
	tw.Close()
	return &buf
}

// TestUntarTar: a stream goes in and comes back out through the agent; a
// bad entry is refused with its class, and the connection's answer is not
// lost; both directions are bounded.
func TestUntarTar(t *testing.T) {
	c := startServer(t, Config{})
	ctx := testCtx(t)
	dir := filepath.Join(t.TempDir(), "dst")
	res, err := c.Untar(ctx, dir, tarStream(t, "f", []byte("hello")), 1<<20)
	if err != nil || res.Entries != 1 {
		t.Fatalf("untar: %+v %v", res, err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "f")); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("extracted f: %v %v", fi, err)
	}
	var out bytes.Buffer
	if _, err := c.Tar(ctx, filepath.Join(dir, "f"), &out, 1<<20); err != nil {
		t.Fatal(err)
	}
	h, err := tar.NewReader(&out).Next()
	if err != nil || h.Name != "f" || h.Size != 5 {
		t.Errorf("tar: %+v %v", h, err)
	}

	// A bad entry early in a long stream: the answer arrives, the rest is
	// not needed.
	big := tarStream(t, "../escape", bytes.Repeat([]byte("x"), 4<<20))
	if _, err := c.Untar(ctx, dir, big, 64<<20); !errdefs.IsInvalidArgument(err) {
		t.Errorf("../escape: got %v, want InvalidArgument", err)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(dir), "escape")); err == nil {
		t.Errorf("../escape was written")
	}
	// Bounds, in and out.
	if _, err := c.Untar(ctx, dir, tarStream(t, "g", bytes.Repeat([]byte("x"), 1<<20)), 64<<10); !errdefs.IsResourceExhausted(err) {
		t.Errorf("1 MiB in with a 64 KiB bound: got %v, want ResourceExhausted", err)
	}
	os.WriteFile(filepath.Join(dir, "h"), bytes.Repeat([]byte("x"), 1<<20), 0o644)
	if _, err := c.Tar(ctx, filepath.Join(dir, "h"), &bytes.Buffer{}, 64<<10); !errdefs.IsResourceExhausted(err) {
		t.Errorf("1 MiB out with a 64 KiB bound: got %v, want ResourceExhausted", err)
	}
	// Relative and ".." paths are refused before anything is read.
	for _, p := range []string{"rel", "/a/../b"} {
		if _, err := c.Untar(ctx, p, strings.NewReader(""), 1<<20); !errdefs.IsInvalidArgument(err) {
			t.Errorf("untar into %q: got %v, want InvalidArgument", p, err)
		}
	}
}

// gatedReader returns EOF once open is closed, or an error after a bound.
type gatedReader struct{ open <-chan struct{} }

func (g gatedReader) Read([]byte) (int, error) {
	select {
	case <-g.open:
		return 0, io.EOF
	case <-time.After(30 * time.Second):
		return 0, errors.New("the agent never saw the request's header")
	}
}

// Untar sends its header before it reads the stream: the agent drops a
// connection whose header takes over headerTimeout, and a slow stream (a
// pipe) may give nothing for longer. The stream here gives nothing until
// the agent has the header.
func TestUntarHeaderBeforeStream(t *testing.T) {
	gotHeader := make(chan struct{})
	addr := fakeAgent(t, func(conn net.Conn, br *bufio.Reader) {
		close(gotHeader)
		for {
			f, err := readFrame(br)
			if err != nil {
				return
			}
			if f.typ == frameEOF {
				(&frameWriter{w: conn}).writeJSON(frameResult, CopyResult{})
				return
			}
		}
	})
	c := NewClient(addr, testToken)
	if _, err := c.Untar(testCtx(t), "/dst", gatedReader{gotHeader}, 1<<20); err != nil {
		t.Fatal(err)
	}
}
