package image

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/testimage"
)

// TestOverlayMergedView stacks the unpacked layers of a three-layer image
// with a whiteout and an opaque directory as a real overlay mount.
func TestOverlayMergedView(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	l1 := testimage.WithFilesT(t, testimage.BusyboxT(t), map[string]string{
		"etc/a": "1", "etc/b": "1", "d/x": "1", "d/y": "1", "keep/k": "1",
	})
	l2 := testimage.WithFilesT(t, l1, map[string]string{
		"etc/a": testimage.Whiteout, "d/": testimage.Opaque, "d/z": "2", "keep/k2": "2",
	})
	path := filepath.Join(t.TempDir(), "img.tar")
	if err := testimage.WriteOCIArchive(l2, "test/overlay:1", path); err != nil {
		t.Fatal(err)
	}
	img, err := s.Import(ctx, path, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	top := img.Layers[2]
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(top, "etc/a"), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Errorf("etc/a in top layer: mode %o rdev %d err %v, want a 0/0 char device", st.Mode, st.Rdev, err)
	}
	buf := make([]byte, 8)
	if n, err := unix.Lgetxattr(filepath.Join(top, "d"), "trusted.overlay.opaque", buf); err != nil || string(buf[:n]) != "y" {
		t.Errorf("d opaque xattr = %q, %v", buf[:n], err)
	}

	lowers := slices.Clone(img.Layers)
	slices.Reverse(lowers)
	mnt := t.TempDir()
	if err := unix.Mount("overlay", mnt, "overlay", unix.MS_RDONLY, "lowerdir="+strings.Join(lowers, ":")); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("overlay mount:", err)
		}
		t.Skip("overlay mount:", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
			t.Error("unmount:", err)
		}
	})
	ls := func(d string) []string {
		ents, err := os.ReadDir(filepath.Join(mnt, d))
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		return names
	}
	if got, want := ls("d"), []string{"z"}; !slices.Equal(got, want) {
		t.Errorf("merged d = %v, want %v (opaque)", got, want)
	}
	if got, want := ls("keep"), []string{"k", "k2"}; !slices.Equal(got, want) {
		t.Errorf("merged keep = %v, want %v", got, want)
	}
	etc := ls("etc")
	if slices.Contains(etc, "a") || !slices.Contains(etc, "b") || !slices.Contains(etc, "passwd") {
		t.Errorf("merged etc = %v, want b and passwd but no a", etc)
	}
	if _, err := os.Stat(filepath.Join(mnt, "bin/sh")); err != nil {
		t.Errorf("bin/sh through overlay: %v", err)
	}
}

// tarOf builds a tar from headers; a header's Linkname doubles as content
// for regular files.
func tarOf(t testing.TB, hdrs ...*tar.Header) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, h := range hdrs {
		var data []byte
		if h.Typeflag == tar.TypeReg {
			data = []byte(h.Linkname)
			h.Linkname, h.Size = "", int64(len(data))
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write(data)
	}
	tw.Close()
	return b.Bytes()
}

func TestUnpackRejectsEscapes(t *testing.T) {
	needRoot(t)
	for _, tc := range []struct {
		name string
		hdrs []*tar.Header
	}{
		{"dotdot", []*tar.Header{{Typeflag: tar.TypeReg, Name: "../evil"}}},
		{"dotdot inside", []*tar.Header{{Typeflag: tar.TypeReg, Name: "a/../../evil"}}},
		{"through symlink", []*tar.Header{
			{Typeflag: tar.TypeSymlink, Name: "out", Linkname: "OUTSIDE"},
			{Typeflag: tar.TypeReg, Name: "out/evil", Linkname: "x"},
		}},
		{"hardlink out", []*tar.Header{{Typeflag: tar.TypeLink, Name: "h", Linkname: "../OUTSIDE/f"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parent := t.TempDir()
			outside := filepath.Join(parent, "OUTSIDE")
			os.Mkdir(outside, 0o755)
			os.WriteFile(filepath.Join(outside, "f"), []byte("f"), 0o644)
			dir := filepath.Join(parent, "layer")
			os.Mkdir(dir, 0o755)
			// Make the symlink case point at the real outside dir.
			for _, h := range tc.hdrs {
				if h.Linkname == "OUTSIDE" {
					h.Linkname = outside
				}
			}
			err := unpackTar(context.Background(), bytes.NewReader(tarOf(t, tc.hdrs...)), dir, testLimits)
			if !errdefs.IsInvalidArgument(err) {
				t.Errorf("got %v, want InvalidArgument", err)
			}
			if ents, _ := os.ReadDir(outside); len(ents) != 1 {
				t.Errorf("something was written outside the layer: %d entries", len(ents))
			}
			if _, err := os.Stat(filepath.Join(parent, "evil")); err == nil {
				t.Error("../evil written")
			}
		})
	}
}

func TestUnpackEntryKinds(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	mt := time.Date(2020, 2, 3, 4, 5, 6, 0, time.UTC)
	data := tarOf(t,
		&tar.Header{Typeflag: tar.TypeDir, Name: "./", Mode: 0o755},
		&tar.Header{Typeflag: tar.TypeDir, Name: "./dir/", Mode: 0o750, Uid: 1000, Gid: 1001, ModTime: mt},
		&tar.Header{Typeflag: tar.TypeReg, Name: "./dir/suid", Linkname: "x", Mode: 0o4755, Uid: 1000, ModTime: mt,
			PAXRecords: map[string]string{"SCHILY.xattr.user.test": "v"}},
		&tar.Header{Typeflag: tar.TypeLink, Name: "./dir/hard", Linkname: "dir/suid"},
		&tar.Header{Typeflag: tar.TypeSymlink, Name: "./dir/sym", Linkname: "/etc/passwd"},
		&tar.Header{Typeflag: tar.TypeChar, Name: "./null", Devmajor: 1, Devminor: 3, Mode: 0o666}, // not created
		&tar.Header{Typeflag: tar.TypeFifo, Name: "./fifo", Mode: 0o600},
		&tar.Header{Typeflag: tar.TypeReg, Name: "implicit/parent/file", Linkname: "y"},
		&tar.Header{Typeflag: tar.TypeReg, Name: "replaced", Linkname: "old"},
		&tar.Header{Typeflag: tar.TypeSymlink, Name: "replaced", Linkname: "dir"},
	)
	if err := unpackTar(context.Background(), bytes.NewReader(data), dir, testLimits); err != nil {
		t.Fatal(err)
	}
	var st, st2 unix.Stat_t
	p := func(n string) string { return filepath.Join(dir, n) }
	if err := unix.Lstat(p("dir/suid"), &st); err != nil || st.Mode&0o7777 != 0o4755 || st.Uid != 1000 {
		t.Errorf("suid: mode %o uid %d err %v", st.Mode&0o7777, st.Uid, err)
	}
	unix.Lstat(p("dir/hard"), &st2)
	if st.Ino != st2.Ino || st.Nlink != 2 {
		t.Errorf("hardlink: ino %d vs %d nlink %d", st.Ino, st2.Ino, st.Nlink)
	}
	if fi, err := os.Stat(p("dir")); err != nil || !fi.ModTime().Equal(mt) || fi.Mode().Perm() != 0o750 {
		t.Errorf("dir: %v %v", fi, err)
	}
	if l, _ := os.Readlink(p("dir/sym")); l != "/etc/passwd" {
		t.Errorf("symlink -> %q", l)
	}
	if err := unix.Lstat(p("null"), &st); err == nil {
		t.Errorf("null: mode %o rdev %d, want no device node on the host", st.Mode, st.Rdev)
	}
	if unix.Lstat(p("fifo"), &st); st.Mode&unix.S_IFMT != unix.S_IFIFO {
		t.Errorf("fifo: mode %o", st.Mode)
	}
	if b, err := os.ReadFile(p("implicit/parent/file")); err != nil || string(b) != "y" {
		t.Errorf("implicit parent: %q %v", b, err)
	}
	if l, _ := os.Readlink(p("replaced")); l != "dir" {
		t.Errorf("replaced -> %q", l)
	}
	buf := make([]byte, 8)
	if n, err := unix.Lgetxattr(p("dir/suid"), "user.test", buf); err == nil && string(buf[:n]) != "v" {
		t.Errorf("xattr = %q", buf[:n])
	}
}

func TestErrorClasses(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	host := testimage.ServeRegistry(t)
	// A port nothing listens on.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()

	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.tar")
	os.WriteFile(garbage, bytes.Repeat([]byte("not a tar "), 200), 0o644)
	good := filepath.Join(dir, "good.tar")
	if err := testimage.WriteDockerArchive(testimage.BusyboxT(t), "a/b:c", good); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(good)
	truncated := filepath.Join(dir, "truncated.tar")
	os.WriteFile(truncated, b[:len(b)/2], 0o644)
	unnamed := filepath.Join(dir, "unnamed.tar")
	if err := testimage.WriteOCIArchive(testimage.BusyboxT(t), "", unnamed); err != nil {
		t.Fatal(err)
	}
	emptyTar := filepath.Join(dir, "empty.tar")
	os.WriteFile(emptyTar, tarOf(t, &tar.Header{Typeflag: tar.TypeReg, Name: "hello", Linkname: "x"}), 0o644)

	for _, tc := range []struct {
		name string
		err  error
		want func(error) bool
	}{
		{"pull bad ref", pullErr(s, "UPPER/Case::bad"), errdefs.IsInvalidArgument},
		{"pull unknown repo", pullErr(s, host+"/no/such:tag"), errdefs.IsNotFound},
		{"pull unreachable", pullErr(s, dead+"/x/y:z"), errdefs.IsUnavailable},
		{"get unknown", getErr(s, "nope:latest"), errdefs.IsNotFound},
		{"get unknown digest", getErr(s, "sha256:0000000000000000000000000000000000000000000000000000000000000000"), errdefs.IsNotFound},
		{"get bad name", getErr(s, "Bad::Name"), errdefs.IsInvalidArgument},
		{"remove unknown", s.Remove(ctx, "nope"), errdefs.IsNotFound},
		{"import garbage", importErr(s, garbage, "x"), errdefs.IsInvalidArgument},
		{"import truncated", importErr(s, truncated, ""), errdefs.IsInvalidArgument},
		{"import unnamed", importErr(s, unnamed, ""), errdefs.IsInvalidArgument},
		{"import neither format", importErr(s, emptyTar, "x"), errdefs.IsInvalidArgument},
		{"import missing file", importErr(s, filepath.Join(dir, "missing.tar"), "x"), errdefs.IsNotFound},
	} {
		if !tc.want(tc.err) {
			t.Errorf("%s: got %v (class %v)", tc.name, tc.err, errdefs.Class(tc.err))
		}
	}
	if list, _ := s.List(ctx); len(list) != 0 {
		t.Errorf("failed calls left %d images", len(list))
	}
	if ents, _ := os.ReadDir(s.tmpDir()); len(ents) != 0 {
		t.Errorf("tmp not empty: %d", len(ents))
	}
}

func pullErr(s *Store, ref string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := s.Pull(ctx, ref, true, nil)
	return err
}

func getErr(s *Store, ref string) error {
	_, err := s.Get(context.Background(), ref)
	return err
}

func importErr(s *Store, path, name string) error {
	_, err := s.Import(context.Background(), path, name, nil)
	return err
}

// BenchmarkUnpack50MB unpacks a 50 MB layer of 1 MB random files.
func BenchmarkUnpack50MB(b *testing.B) {
	needRoot(b)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	chunk := make([]byte, 1<<20)
	for i := range 50 {
		io.ReadFull(rand.Reader, chunk)
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: filepath.Join("d", string(rune('a'+i%26)), "f"+string(rune('a'+i))), Mode: 0o644, Size: int64(len(chunk))})
		tw.Write(chunk)
	}
	tw.Close()
	data := buf.Bytes()
	root := b.TempDir()
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		dir := filepath.Join(root, "l", string(rune('a'+i%26))+time.Now().Format("150405.000000000"))
		os.MkdirAll(dir, 0o755)
		if err := unpackTar(context.Background(), bytes.NewReader(data), dir, testLimits); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		os.RemoveAll(dir)
		b.StartTimer()
	}
}

// TestUnpackCanceled: a cancelled unpack is Canceled, not a bad layer.
func TestUnpackCanceled(t *testing.T) {
	needRoot(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := unpackTar(ctx, bytes.NewReader(tarOf(t, reg("f", "x"))), t.TempDir(), testLimits)
	if !errors.Is(err, errdefs.ErrCanceled) {
		t.Errorf("got %v (class %v), want Canceled", err, errdefs.Class(err))
	}
}
