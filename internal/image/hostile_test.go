package image

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
)

// testLimits are the unpack limits of the unpacker-level tests.
var testLimits = layerLimits{bytes: 8 << 20, entries: 1000, path: 4096}

// canaryPath in a header's Name or Linkname stands for the absolute path of
// the canary directory beside the layer.
const canaryPath = "@CANARY@"

// hostileCase is one layer of the hostile-image battery: the tar entries,
// the error class wanted (nil: imported), and what the layer must then hold.
type hostileCase struct {
	name  string
	hdrs  []*tar.Header
	raw   []byte // the layer, when tar.Writer cannot write it (hdrs is nil)
	lim   *layerLimits
	want  func(error) bool
	check func(t *testing.T, layer string)
}

var (
	invalid   = errdefs.IsInvalidArgument
	overLimit = errdefs.IsResourceExhausted
)

func reg(name, data string) *tar.Header {
	return &tar.Header{Typeflag: tar.TypeReg, Name: name, Linkname: data}
}
func dir(name string) *tar.Header { return &tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755} }
func sym(name, target string) *tar.Header {
	return &tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target}
}
func hard(name, target string) *tar.Header {
	return &tar.Header{Typeflag: tar.TypeLink, Name: name, Linkname: target}
}

// hostileCases is the battery. Every case is also a seed of FuzzUnpack.
func hostileCases() []hostileCase {
	small := layerLimits{bytes: 1 << 20, entries: 5, path: 4096}
	return []hostileCase{
		// Tar-slip.
		{name: "dotdot", hdrs: hs(reg("../evil", "x")), want: invalid},
		{name: "dotdot inside", hdrs: hs(reg("a/../../evil", "x")), want: invalid},
		{name: "dotdot after root", hdrs: hs(reg("/../evil", "x")), want: invalid},
		{name: "dotdot in hardlink", hdrs: hs(hard("h", "../canary/f")), want: invalid},
		{name: "absolute joined under root", hdrs: hs(reg("/evil", "x")), check: isFile("evil", "x")},
		{name: "root entry and absolute names (umoci)", hdrs: hs(dir("/"), dir("/etc/"), reg("/etc/x", "y")), check: isFile("etc/x", "y")},
		{name: "dot entry", hdrs: hs(dir("./"), reg("./a", "1")), check: isFile("a", "1")},
		{name: "file named like the root", hdrs: hs(reg(".", "x"), sym(".", "/etc"), reg("", "x")), check: isType(".", unix.S_IFDIR)},
		{name: "write through absolute symlink", hdrs: hs(sym("out", canaryPath), reg("out/evil", "x")), want: invalid},
		{name: "write through relative symlink", hdrs: hs(sym("out", "../canary"), reg("out/evil", "x")), want: invalid},
		{name: "mkdir through symlink", hdrs: hs(sym("out", "../canary"), dir("out/newdir")), want: invalid},
		{name: "symlink through symlink", hdrs: hs(sym("out", "../canary"), sym("out/l", "/")), want: invalid},
		{name: "symlink chain", hdrs: hs(sym("a", "b"), sym("b", "../canary"), reg("a/evil", "x")), want: invalid},
		{name: "symlink loop", hdrs: hs(sym("a", "a"), reg("a/x", "x")), want: invalid},
		{name: "dir swapped for symlink then written", hdrs: hs(dir("d"), reg("d/f", "1"), sym("d", "../canary"), reg("d/evil", "x")), want: invalid},
		{name: "dir swapped for symlink then whiteout", hdrs: hs(dir("d"), sym("d", canaryPath), reg("d/.wh.f", "")), want: invalid},
		{name: "dir swapped for symlink then opaque", hdrs: hs(dir("d"), sym("d", canaryPath), reg("d/.wh..wh..opq", "")), want: invalid},
		{name: "dir swapped for symlink then hardlinked from", hdrs: hs(dir("d"), reg("d/f", "1"), sym("d", "../canary"), hard("h", "d/f")), want: invalid},
		{name: "deep dir swapped for symlink", hdrs: hs(dir("a"), dir("a/b"), dir("a/b/c"), sym("a/b", "../../canary"), reg("a/b/c/evil", "x")), want: invalid},
		{name: "hardlink out, absolute", hdrs: hs(hard("h", canaryPath+"/f")), want: invalid},
		{name: "hardlink through symlink", hdrs: hs(sym("s", "../canary"), hard("h", "s/f")), want: invalid},
		{name: "hardlink to symlink pointing out", hdrs: hs(sym("s", canaryPath+"/f"), hard("h", "s"), reg("h", "overwritten")), check: isFile("h", "overwritten")},
		{name: "hardlink to symlink kept", hdrs: hs(sym("s", "../canary/f"), hard("h", "s")), check: isSymlink("h", "../canary/f")},
		{name: "hardlink to directory", hdrs: hs(dir("d"), hard("h", "d")), want: invalid},
		{name: "hardlink to root", hdrs: hs(hard("h", "/")), want: invalid},
		{name: "hardlink to missing", hdrs: hs(hard("h", "nope/x")), want: invalid},
		{name: "hardlink to itself", hdrs: hs(reg("f", "1"), hard("f", "f")), check: isFile("f", "1")},
		{name: "file over symlink pointing out", hdrs: hs(sym("x", canaryPath+"/f"), reg("x", "pwned")), check: isFile("x", "pwned")},
		{name: "dir over symlink pointing out", hdrs: hs(sym("x", canaryPath), dir("x"), reg("x/f", "in")), check: isFile("x/f", "in")},

		// Whiteouts.
		{name: "whiteout .wh.", hdrs: hs(reg(".wh.", "")), want: invalid},
		{name: "whiteout .wh..", hdrs: hs(reg(".wh..", "")), want: invalid},
		{name: "whiteout .wh...", hdrs: hs(reg(".wh...", "")), want: invalid},
		{name: "whiteout .wh... below", hdrs: hs(dir("a"), reg("a/.wh...", "")), want: invalid},
		{name: "whiteout ./.wh..", hdrs: hs(reg("./.wh..", "")), want: invalid},
		{name: "whiteout with trailing slash", hdrs: hs(dir(".wh./")), want: invalid},
		{name: "whiteout dir entry", hdrs: hs(dir("a/.wh.b/")), check: isWhiteout("a/b")},
		{name: "whiteout with a child", hdrs: hs(reg(".wh.x/y", "")), want: invalid},
		{name: "whiteout deep with a child", hdrs: hs(reg("a/.wh.b/c", "")), want: invalid},
		{name: "whiteout of a directory", hdrs: hs(dir("d"), reg("d/f", "1"), reg(".wh.d", "")), check: isWhiteout("d")},
		{name: "whiteout then file", hdrs: hs(reg(".wh.f", ""), reg("f", "back")), check: isFile("f", "back")},
		{name: "opaque at root", hdrs: hs(reg(".wh..wh..opq", "")), check: isOpaque(".")},
		{name: "opaque as a directory", hdrs: hs(dir("d/.wh..wh..opq/")), check: isOpaque("d")},
		{name: "opaque with a child", hdrs: hs(reg(".wh..wh..opq/x", "")), want: invalid},
		{name: "opaque marker as a directory", hdrs: hs(dir(".wh..wh..opq/"), dir("d/.wh..wh..opq")), check: isOpaque("d")},
		{name: "opaque below a whiteout", hdrs: hs(reg(".wh.d/.wh..wh..opq", "")), want: invalid},
		{name: "aufs metadata", hdrs: hs(dir(".wh..wh.plnk"), reg(".wh..wh.plnk/1.2", "x"), hard("h", ".wh..wh.plnk/1.2")), want: invalid},
		{name: "aufs metadata skipped", hdrs: hs(dir(".wh..wh.plnk"), reg(".wh..wh.plnk/1.2", "x")), check: absent(".wh..wh.plnk")},
		{name: "aufs metadata file", hdrs: hs(reg("a/.wh..wh.aufs", "")), check: absent("a/.wh..wh.aufs")},

		// Duplicates.
		{name: "file then dir", hdrs: hs(reg("f", "1"), dir("f"), reg("f/x", "2")), check: isFile("f/x", "2")},
		{name: "dir then file", hdrs: hs(dir("d"), reg("d/x", "1"), reg("d", "2")), check: isFile("d", "2")},
		{name: "dir then dir", hdrs: hs(dir("d"), reg("d/x", "1"), dir("d")), check: isFile("d/x", "1")},
		{name: "symlink then dir then file", hdrs: hs(sym("d", "../canary"), dir("d"), reg("d/f", "in")), check: isFile("d/f", "in")},

		// Devices, FIFOs, set-id bits.
		{name: "char device", hdrs: hs(&tar.Header{Typeflag: tar.TypeChar, Name: "dev/null", Devmajor: 1, Devminor: 3}), check: absent("dev/null")},
		{name: "block device", hdrs: hs(&tar.Header{Typeflag: tar.TypeBlock, Name: "sda", Devmajor: 8}), check: absent("sda")},
		{name: "fake whiteout device", hdrs: hs(&tar.Header{Typeflag: tar.TypeChar, Name: "w"}), check: absent("w")},
		{name: "hardlink to a device", hdrs: hs(&tar.Header{Typeflag: tar.TypeChar, Name: "c", Devmajor: 1, Devminor: 1}, hard("h", "c")), check: absent("h")},
		{name: "device over a file", hdrs: hs(reg("c", "1"), &tar.Header{Typeflag: tar.TypeChar, Name: "c", Devmajor: 1, Devminor: 1}), check: absent("c")},
		{name: "fifo", hdrs: hs(&tar.Header{Typeflag: tar.TypeFifo, Name: "p"}), check: isType("p", unix.S_IFIFO)},
		{name: "setuid root", hdrs: hs(&tar.Header{Typeflag: tar.TypeReg, Name: "su", Linkname: "x", Mode: 0o4755}), check: hasMode("su", 0o4755)},
		{name: "setgid dir", hdrs: hs(&tar.Header{Typeflag: tar.TypeDir, Name: "sg", Mode: 0o2775, Gid: 50}), check: hasMode("sg", 0o2775)},
		{name: "owner out of range", hdrs: hs(&tar.Header{Typeflag: tar.TypeReg, Name: "f", Uid: 1 << 33}), want: invalid},

		// Extended attributes.
		{name: "overlay and security xattrs", hdrs: hs(&tar.Header{Typeflag: tar.TypeReg, Name: "f", PAXRecords: map[string]string{
			"SCHILY.xattr.trusted.overlay.opaque":   "y",
			"SCHILY.xattr.trusted.overlay.redirect": "/etc",
			"SCHILY.xattr.trusted.other":            "x",
			"SCHILY.xattr.security.selinux":         "system_u:object_r:shadow_t:s0",
			"SCHILY.xattr.user.kept":                "v",
		}}), check: xattrsAre("f", "user.kept")},
		{name: "opaque xattr on a dir", hdrs: hs(&tar.Header{Typeflag: tar.TypeDir, Name: "d", PAXRecords: map[string]string{
			"SCHILY.xattr.trusted.overlay.opaque": "y",
		}}), check: xattrsAre("d")},

		// Names and limits.
		{name: "long name", hdrs: hs(reg(strings.Repeat("a/", 2100)+"f", "x")), want: invalid},
		{name: "long component", hdrs: hs(reg(strings.Repeat("a", 300), "x")), want: invalid},
		{name: "long symlink target", hdrs: hs(sym("s", strings.Repeat("a/", 2100))), want: invalid},
		{name: "empty symlink target", hdrs: hs(sym("s", "")), want: invalid},
		{name: "too many entries", hdrs: hs(reg("1", ""), reg("2", ""), reg("3", ""), reg("4", ""), reg("5", ""), reg("6", "")), lim: &small, want: overLimit},
		{name: "file over the byte limit", hdrs: hs(reg("big", strings.Repeat("x", 1<<20+1))), lim: &small, want: overLimit},
		{name: "sparse bomb", raw: sparseBomb(1 << 30), want: overLimit},
		{name: "sparse file within limits", raw: sparseBomb(64 << 10), check: isFile("sparse", "x"+strings.Repeat("\x00", 64<<10-1))},
		{name: "files over the byte limit together", hdrs: hs(reg("a", strings.Repeat("x", 600<<10)), reg("b", strings.Repeat("x", 600<<10))), lim: &small, want: overLimit},
	}
}

func hs(h ...*tar.Header) []*tar.Header { return h }

// sparseBomb is a tar (old GNU sparse format, which tar.Writer cannot
// write) of one file "sparse" of logical size size: a one-block fragment
// ("x" and zeros) and a hole. Its stream is 2.5 KiB, whatever size is.
func sparseBomb(size int64) []byte {
	h := make([]byte, 512)
	octal := func(b []byte, v int64) { copy(b, fmt.Sprintf("%0*o\x00", len(b)-1, v)) }
	copy(h[0:], "sparse")
	octal(h[100:108], 0o644)
	octal(h[108:116], 0)
	octal(h[116:124], 0)
	octal(h[124:136], 512) // bytes stored in the archive
	octal(h[136:148], 0)
	h[156] = 'S'
	copy(h[257:], "ustar  \x00")
	octal(h[386:398], 0)   // fragment offset
	octal(h[398:410], 512) // fragment length
	octal(h[483:495], size)
	copy(h[148:156], "        ")
	var sum int64
	for _, c := range h {
		sum += int64(c)
	}
	copy(h[148:156], fmt.Sprintf("%06o\x00 ", sum))
	data := make([]byte, 512)
	data[0] = 'x'
	return append(append(h, data...), make([]byte, 1024)...)
}

// resolve puts the canary's absolute path into a case's headers.
func resolve(hdrs []*tar.Header, canary string) []*tar.Header {
	out := make([]*tar.Header, len(hdrs))
	for i, h := range hdrs {
		c := *h
		c.Name = strings.ReplaceAll(c.Name, canaryPath, canary)
		c.Linkname = strings.ReplaceAll(c.Linkname, canaryPath, canary)
		out[i] = &c
	}
	return out
}

// sandboxDirs makes a store-like tree: parent/tmp/layer (the layer being
// unpacked), parent/tmp/canary and parent/canary beside it.
func sandboxDirs(t testing.TB) (parent, layer, canary string) {
	parent = t.TempDir()
	layer = filepath.Join(parent, "tmp", "layer")
	canary = filepath.Join(parent, "tmp", "canary")
	for _, d := range []string{layer, filepath.Join(canary, "d"), filepath.Join(parent, "canary")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{filepath.Join(canary, "f"), filepath.Join(parent, "canary", "f")} {
		if err := os.WriteFile(f, []byte("canary"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return parent, layer, canary
}

// treeState describes every file under root except skip and what is below
// it: type, mode, owner, size, mtime, content digest, link target, xattrs.
func treeState(t testing.TB, root, skip string) map[string]string {
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == skip {
			return filepath.SkipDir
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		desc := fmt.Sprintf("mode=%o uid=%d gid=%d size=%d mtime=%d.%d rdev=%d", st.Mode, st.Uid, st.Gid, st.Size, st.Mtim.Sec, st.Mtim.Nsec, st.Rdev)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			b, _ := os.ReadFile(p)
			desc += fmt.Sprintf(" sha=%x", sha256.Sum256(b))
		case unix.S_IFLNK:
			l, _ := os.Readlink(p)
			desc += " link=" + l
		}
		desc += " xattrs=" + strings.Join(listXattrs(p), ",")
		out[p] = desc
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func listXattrs(p string) []string {
	buf := make([]byte, 4096)
	n, err := unix.Llistxattr(p, buf)
	if err != nil || n == 0 {
		return nil
	}
	var names []string
	for _, x := range strings.Split(string(buf[:n]), "\x00") {
		if x != "" {
			names = append(names, x)
		}
	}
	sort.Strings(names)
	return names
}

func diffStates(t testing.TB, before, after map[string]string) {
	t.Helper()
	for p, b := range before {
		if a, ok := after[p]; !ok {
			t.Errorf("outside the layer: %s removed", p)
		} else if a != b {
			t.Errorf("outside the layer: %s changed:\n  was %s\n  now %s", p, b, a)
		}
	}
	for p := range after {
		if _, ok := before[p]; !ok {
			t.Errorf("outside the layer: %s created", p)
		}
	}
}

func TestHostileLayers(t *testing.T) {
	needRoot(t)
	testHostileLayers(t)
}

// TestHostileLayersWithoutOpenat2 runs the battery with the walk that
// stands in for openat2 on kernels older than 5.6.
func TestHostileLayersWithoutOpenat2(t *testing.T) {
	needRoot(t)
	useOpenat2 = false
	defer func() { useOpenat2 = true }()
	testHostileLayers(t)
}

func testHostileLayers(t *testing.T) {
	for _, tc := range hostileCases() {
		t.Run(tc.name, func(t *testing.T) {
			parent, layer, canary := sandboxDirs(t)
			lim := testLimits
			if tc.lim != nil {
				lim = *tc.lim
			}
			data := tc.raw
			if data == nil {
				data = tarOf(t, resolve(tc.hdrs, canary)...)
			}
			before := treeState(t, parent, layer)
			err := unpackTar(context.Background(), bytes.NewReader(data), layer, lim)
			switch {
			case tc.want == nil && err != nil:
				t.Errorf("got %v, want success", err)
			case tc.want != nil && !tc.want(err):
				t.Errorf("got %v (class %v), want %s", err, errdefs.Class(err), wantName(tc.want))
			}
			diffStates(t, before, treeState(t, parent, layer))
			if fi, err := os.Lstat(layer); err != nil || !fi.IsDir() {
				t.Fatalf("layer dir: %v, %v", fi, err)
			}
			checkLayerInvariants(t, layer)
			if err == nil && tc.check != nil {
				tc.check(t, layer)
			}
		})
	}
}

func wantName(f func(error) bool) string {
	if f(errdefs.ErrResourceExhausted) {
		return "ResourceExhausted"
	}
	return "InvalidArgument"
}

// checkLayerInvariants holds for any layer, however hostile its tar: no
// device node but overlay whiteouts, no trusted.* or security.* xattr but
// the opaque marker we set and file capabilities.
func checkLayerInvariants(t testing.TB, layer string) {
	t.Helper()
	filepath.WalkDir(layer, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		var st unix.Stat_t
		if unix.Lstat(p, &st) != nil {
			return nil
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFBLK:
			t.Errorf("%s: block device in a layer", p)
		case unix.S_IFCHR:
			if st.Rdev != 0 {
				t.Errorf("%s: device %d:%d in a layer", p, unix.Major(st.Rdev), unix.Minor(st.Rdev))
			}
		}
		for _, x := range listXattrs(p) {
			if strings.HasPrefix(x, "user.") || x == "security.capability" {
				continue
			}
			if x == "trusted.overlay.opaque" && st.Mode&unix.S_IFMT == unix.S_IFDIR {
				buf := make([]byte, 8)
				if n, _ := unix.Lgetxattr(p, x, buf); string(buf[:n]) == "y" {
					continue
				}
			}
			t.Errorf("%s: xattr %s in a layer", p, x)
		}
		return nil
	})
}

func isFile(rel, content string) func(*testing.T, string) {
	return func(t *testing.T, layer string) {
		p := filepath.Join(layer, rel)
		if fi, err := os.Lstat(p); err != nil || !fi.Mode().IsRegular() {
			t.Fatalf("%s: %v, %v; want a regular file", rel, fi, err)
		}
		if b, _ := os.ReadFile(p); string(b) != content {
			t.Errorf("%s = %q, want %q", rel, b, content)
		}
	}
}

func isSymlink(rel, target string) func(*testing.T, string) {
	return func(t *testing.T, layer string) {
		if l, err := os.Readlink(filepath.Join(layer, rel)); err != nil || l != target {
			t.Errorf("%s -> %q, %v; want -> %q", rel, l, err, target)
		}
	}
}

func isType(rel string, typ uint32) func(*testing.T, string) {
	return func(t *testing.T, layer string) {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(layer, rel), &st); err != nil || st.Mode&unix.S_IFMT != typ {
			t.Errorf("%s: mode %o, %v; want type %o", rel, st.Mode, err, typ)
		}
	}
}

func isWhiteout(rel string) func(*testing.T, string) {
	return func(t *testing.T, layer string) {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(layer, rel), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
			t.Errorf("%s: mode %o rdev %d, %v; want a 0/0 char device", rel, st.Mode, st.Rdev, err)
		}
	}
}

func isOpaque(rel string) func(*testing.T, string) {
	return func(t *testing.T, layer string) {
		buf := make([]byte, 8)
		if n, err := unix.Lgetxattr(filepath.Join(layer, rel), "trusted.overlay.opaque", buf); err != nil || string(buf[:n]) != "y" {
			t.Errorf("%s: opaque xattr %q, %v; want y", rel, buf[:max(n, 0)], err)
		}
	}
}

func absent(rel string) func(*testing.T, string) {
	return func(t *testing.T, layer string) {
		if _, err := os.Lstat(filepath.Join(layer, rel)); !os.IsNotExist(err) {
			t.Errorf("%s: %v; want absent", rel, err)
		}
	}
}

func hasMode(rel string, mode uint32) func(*testing.T, string) {
	return func(t *testing.T, layer string) {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(layer, rel), &st); err != nil || st.Mode&0o7777 != mode {
			t.Errorf("%s: mode %o, %v; want %o", rel, st.Mode&0o7777, err, mode)
		}
	}
}

func xattrsAre(rel string, want ...string) func(*testing.T, string) {
	return func(t *testing.T, layer string) {
		if got := listXattrs(filepath.Join(layer, rel)); strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("%s: xattrs %v, want %v", rel, got, want)
		}
	}
}
