package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// tarOf builds a tar stream of entries (name, type, body or link target).
func tarOf(t *testing.T, ents ...[3]string) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := &tar.Header{Name: e[0], Typeflag: e[1][0], Mode: 0o644, ModTime: time.Now()}
		switch h.Typeflag {
		case tar.TypeReg:
			h.Size = int64(len(e[2]))
		case tar.TypeSymlink, tar.TypeLink:
			h.Linkname = e[2]
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(e[2]))
		}
	}
	tw.Close()
	return &buf
}

// TestCopy: `forkbox cp` round-trips a directory with a file, a subdir, a
// symlink, modes and mtimes; hostile tar streams are refused and write
// nothing outside the target; a copy past the sandbox's disk limit is
// ResourceExhausted.
func TestCopy(t *testing.T) {
	forEachRuntime(t, func(t *testing.T) {
		ctx := context.Background()
		o := clientOpts()
		o.Resources.Disk = "32Mi"
		sb := newSandbox(t, o)
		src := filepath.Join(t.TempDir(), "tree")
		os.MkdirAll(filepath.Join(src, "sub"), 0o755)
		os.WriteFile(filepath.Join(src, "run.sh"), []byte("#!/bin/sh\necho ran\n"), 0o750)
		os.WriteFile(filepath.Join(src, "sub", "data"), []byte("payload"), 0o600)
		os.Symlink("sub/data", filepath.Join(src, "link"))
		mtime := time.Date(2021, 6, 7, 8, 9, 10, 0, time.UTC)
		os.Chtimes(filepath.Join(src, "run.sh"), mtime, mtime)
		os.Chmod(filepath.Join(src, "sub"), 0o710)

		if out, errs, code := cli(t, "cp", src, sb.ID+":/work"); code != 0 {
			t.Fatalf("cp in: exit %d: %s %s", code, out, errs)
		}
		got := mustSh(t, sb, "stat -c '%a %Y' /work/run.sh /work/sub /work/sub/data; readlink /work/link; cat /work/link; /work/run.sh")
		want := "750 " + itoa(mtime.Unix()) + "\n710 "
		if !strings.HasPrefix(got, want) || !strings.Contains(got, "600 ") || !strings.HasSuffix(got, "sub/data\npayloadran\n") {
			t.Errorf("in the sandbox: got %q, want modes 750/710/600, mtime %d, link to sub/data", got, mtime.Unix())
		}
		// Into an existing directory: /work/tree.
		if out, errs, code := cli(t, "cp", src, sb.ID+":/work/"); code != 0 {
			t.Fatalf("cp into a directory: exit %d: %s %s", code, out, errs)
		}
		mustSh(t, sb, "test -f /work/tree/sub/data")

		back := filepath.Join(t.TempDir(), "back")
		if out, errs, code := cli(t, "cp", sb.ID+":/work", back); code != 0 {
			t.Fatalf("cp out: exit %d: %s %s", code, out, errs)
		}
		fi, err := os.Stat(filepath.Join(back, "run.sh"))
		if err != nil || fi.Mode().Perm() != 0o750 || !fi.ModTime().Equal(mtime) {
			t.Errorf("copied back run.sh: %v %v", fi, err)
		}
		if fi, err := os.Stat(filepath.Join(back, "sub")); err != nil || fi.Mode().Perm() != 0o710 {
			t.Errorf("copied back sub: %v %v", fi, err)
		}
		if l, err := os.Readlink(filepath.Join(back, "link")); err != nil || l != "sub/data" {
			t.Errorf("copied back link: %q %v", l, err)
		}
		if b, err := os.ReadFile(filepath.Join(back, "link")); err != nil || string(b) != "payload" {
			t.Errorf("copied back data: %q %v", b, err)
		}

		// Hostile streams.
		mustSh(t, sb, "mkdir -p /target /outside")
		for name, stream := range map[string]*bytes.Buffer{
			"dotdot":        tarOf(t, [3]string{"../outside/escape", "0", "x"}),
			"absolute":      tarOf(t, [3]string{"/outside/escape", "0", "x"}),
			"symlink-write": tarOf(t, [3]string{"l", "2", "/outside"}, [3]string{"l/escape", "0", "x"}),
			"hardlink-out":  tarOf(t, [3]string{"h", "1", "../outside/x"}),
			"device":        tarOf(t, [3]string{"null", "3", ""}),
		} {
			_, err := sb.CopyTo(ctx, "/target", stream)
			if !errdefs.IsInvalidArgument(err) {
				t.Errorf("%s: got %v, want InvalidArgument", name, err)
			}
		}
		if out := mustSh(t, sb, "ls -A /outside; ls /escape 2>/dev/null; echo end"); out != "end\n" {
			t.Errorf("written outside the target: %q", out)
		}
		// A symlink already in the target is replaced, not written through.
		mustSh(t, sb, "echo keep > /outside/kept; ln -s /outside/kept /target/f")
		if _, err := sb.CopyTo(ctx, "/target", tarOf(t, [3]string{"f", "0", "new"})); err != nil {
			t.Fatal(err)
		}
		if out := mustSh(t, sb, "cat /outside/kept /target/f"); out != "keep\nnew" {
			t.Errorf("over a symlink: got %q", out)
		}

		// Past the disk limit: the agent's write fails with EDQUOT.
		pr, pw := io.Pipe()
		go func() {
			tw := tar.NewWriter(pw)
			tw.WriteHeader(&tar.Header{Name: "big", Typeflag: tar.TypeReg, Mode: 0o644, Size: 64 << 20})
			_, err := io.Copy(tw, io.LimitReader(zeros{}, 64<<20))
			if err == nil {
				err = tw.Close()
			}
			pw.CloseWithError(err)
		}()
		_, err = sb.CopyTo(ctx, "/target", pr)
		pr.Close()
		if !errdefs.IsResourceExhausted(err) {
			t.Errorf("64 MiB into a 32 MiB disk: got %v, want ResourceExhausted", err)
		}
		mustSh(t, sb, "rm -f /target/big; echo ok")
	})
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// TestCopyBounded: a stream past --max-copy-size is ResourceExhausted both
// ways, and the sandbox keeps working.
func TestCopyBounded(t *testing.T) {
	withDaemonFlags(t, "--max-copy-size", "16Mi")
	forEachRuntime(t, func(t *testing.T) {
		ctx := context.Background()
		sb := newSandbox(t, clientOpts())
		big := tarOf(t, [3]string{"big", "0", strings.Repeat("x", 20<<20)})
		if _, err := sb.CopyTo(ctx, "/t", big); !errdefs.IsResourceExhausted(err) {
			t.Errorf("20 MiB in: got %v, want ResourceExhausted", err)
		}
		mustSh(t, sb, "head -c 20971520 /dev/zero > /big")
		if err := sb.CopyFrom(ctx, "/big", io.Discard); !errdefs.IsResourceExhausted(err) {
			t.Errorf("20 MiB out: got %v, want ResourceExhausted", err)
		}
		if out := mustSh(t, sb, "echo alive"); out != "alive\n" {
			t.Errorf("after: %q", out)
		}
	})
}
