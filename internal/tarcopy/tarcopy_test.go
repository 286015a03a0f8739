package tarcopy

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

func TestRoundTrip(t *testing.T) {
	ctx := context.Background()
	src := filepath.Join(t.TempDir(), "tree")
	mtime := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, d := range []string{src, filepath.Join(src, "sub")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(src, "run.sh"), []byte("#!/bin/sh\necho hi\n"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "sub", "data"), []byte("data"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("sub/data", filepath.Join(src, "link")); err != nil {
		t.Fatal(err)
	}
	os.Chtimes(filepath.Join(src, "run.sh"), mtime, mtime)
	os.Chmod(filepath.Join(src, "sub"), 0o710)
	var buf bytes.Buffer
	wres, err := Write(ctx, &buf, src, "copy", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	dst := t.TempDir()
	res, err := Extract(ctx, &buf, dst, ExtractOptions{MaxBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if res.Entries != 5 || wres.Entries != 5 {
		t.Errorf("entries: got %d written, %d extracted, want 5", wres.Entries, res.Entries)
	}
	fi, err := os.Stat(filepath.Join(dst, "copy", "run.sh"))
	if err != nil || fi.Mode().Perm() != 0o750 || !fi.ModTime().Equal(mtime) {
		t.Errorf("run.sh: got %v %v %v, want 0750 and %v", fi.Mode(), fi.ModTime(), err, mtime)
	}
	if fi, err := os.Stat(filepath.Join(dst, "copy", "sub")); err != nil || fi.Mode().Perm() != 0o710 {
		t.Errorf("sub: got %v %v, want 0710", fi, err)
	}
	if l, err := os.Readlink(filepath.Join(dst, "copy", "link")); err != nil || l != "sub/data" {
		t.Errorf("link: got %q %v, want sub/data", l, err)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "copy", "link")); err != nil || string(b) != "data" {
		t.Errorf("through link: got %q %v", b, err)
	}
}

type entry struct {
	name, link string
	typ        byte
	body       string
}

func mkTar(t *testing.T, ents ...entry) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: 0o644, Size: int64(len(e.body)), ModTime: time.Now()}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			tw.Write([]byte(e.body))
		}
	}
	tw.Close()
	return &buf
}

// TestExtractAbuse: streams that try to write outside the target get an
// InvalidArgument (or ResourceExhausted past the bound) and write nothing
// outside it.
func TestExtractAbuse(t *testing.T) {
	cases := []struct {
		name  string
		ents  []entry
		class error
	}{
		{"dotdot", []entry{{name: "../escape", typ: tar.TypeReg, body: "x"}}, errdefs.ErrInvalidArgument},
		{"dotdot inside", []entry{{name: "a/../../escape", typ: tar.TypeReg, body: "x"}}, errdefs.ErrInvalidArgument},
		{"absolute", []entry{{name: "/escape", typ: tar.TypeReg, body: "x"}}, errdefs.ErrInvalidArgument},
		{"symlink then write through it", []entry{{name: "l", link: "OUTSIDE", typ: tar.TypeSymlink}, {name: "l/escape", typ: tar.TypeReg, body: "x"}}, errdefs.ErrInvalidArgument},
		{"symlink then dir through it", []entry{{name: "l", link: "OUTSIDE", typ: tar.TypeSymlink}, {name: "l/d/", typ: tar.TypeDir}}, errdefs.ErrInvalidArgument},
		{"hard link out", []entry{{name: "h", link: "../x", typ: tar.TypeLink}}, errdefs.ErrInvalidArgument},
		{"hard link absolute", []entry{{name: "h", link: "/etc/passwd", typ: tar.TypeLink}}, errdefs.ErrInvalidArgument},
		{"device", []entry{{name: "null", typ: tar.TypeChar}}, errdefs.ErrInvalidArgument},
		{"oversized", []entry{{name: "big", typ: tar.TypeReg, body: strings.Repeat("x", 8192)}}, errdefs.ErrResourceExhausted},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			base := t.TempDir()
			outside := filepath.Join(base, "outside")
			os.Mkdir(outside, 0o755)
			dst := filepath.Join(base, "in", "dst")
			for i := range c.ents {
				c.ents[i].link = strings.ReplaceAll(c.ents[i].link, "OUTSIDE", outside)
			}
			_, err := Extract(context.Background(), mkTar(t, c.ents...), dst, ExtractOptions{MaxBytes: 4096})
			if errdefs.Class(err) != c.class {
				t.Errorf("got %v (class %s), want %s", err, errdefs.ClassName(err), errdefs.ClassName(c.class))
			}
			for _, dir := range []string{outside, filepath.Join(base, "in")} {
				ents, _ := os.ReadDir(dir)
				for _, e := range ents {
					if e.Name() != "dst" {
						t.Errorf("%s: %s was written outside the target", dir, e.Name())
					}
				}
			}
		})
	}
}

// TestExtractReplacesSymlink: a file entry over an existing symlink
// replaces the link; its target is not written.
func TestExtractReplacesSymlink(t *testing.T) {
	base := t.TempDir()
	target := filepath.Join(base, "target")
	os.WriteFile(target, []byte("keep"), 0o644)
	dst := filepath.Join(base, "dst")
	os.Mkdir(dst, 0o755)
	os.Symlink(target, filepath.Join(dst, "f"))
	if _, err := Extract(context.Background(), mkTar(t, entry{name: "f", typ: tar.TypeReg, body: "new"}), dst, ExtractOptions{MaxBytes: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(target); string(b) != "keep" {
		t.Errorf("symlink target: got %q, want keep", b)
	}
	if fi, err := os.Lstat(filepath.Join(dst, "f")); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("f: got %v %v, want a regular file", fi, err)
	}
}

// TestWriteBounded: a stream past its bound is ResourceExhausted; a
// symlink given as the source is sent as a link.
func TestWriteBounded(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "big"), bytes.Repeat([]byte("x"), 64<<10), 0o644)
	if _, err := Write(context.Background(), &bytes.Buffer{}, filepath.Join(dir, "big"), "", 16<<10); !errdefs.IsResourceExhausted(err) {
		t.Errorf("oversized: got %v, want ResourceExhausted", err)
	}
	os.Symlink("/etc", filepath.Join(dir, "l"))
	var buf bytes.Buffer
	if _, err := Write(context.Background(), &buf, filepath.Join(dir, "l"), "", 1<<20); err != nil {
		t.Fatal(err)
	}
	h, err := tar.NewReader(&buf).Next()
	if err != nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "/etc" || h.Name != "l" {
		t.Errorf("symlink source: got %+v %v", h, err)
	}
}
