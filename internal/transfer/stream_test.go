package transfer

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// cmdBytes encodes one send stream command with its attributes.
func cmdBytes(cmd uint16, attrs ...any) []byte {
	var a bytes.Buffer
	for i := 0; i < len(attrs); i += 2 {
		v := attrs[i+1].([]byte)
		binary.Write(&a, binary.LittleEndian, attrs[i].(uint16))
		binary.Write(&a, binary.LittleEndian, uint16(len(v)))
		a.Write(v)
	}
	var b bytes.Buffer
	binary.Write(&b, binary.LittleEndian, uint32(a.Len()))
	binary.Write(&b, binary.LittleEndian, cmd)
	binary.Write(&b, binary.LittleEndian, uint32(0))
	b.Write(a.Bytes())
	return b.Bytes()
}

func uuidBytes(s string) []byte {
	b, _ := hex.DecodeString(strings.ReplaceAll(s, "-", ""))
	return b
}

const (
	uSelf   = "11111111-1111-1111-1111-111111111111"
	uParent = "22222222-2222-2222-2222-222222222222"
	uOther  = "33333333-3333-3333-3333-333333333333"
)

func streamOf(cmds ...[]byte) []byte {
	out := []byte(streamMagic + "\x01\x00\x00\x00")
	for _, c := range cmds {
		out = append(out, c...)
	}
	return out
}

// TestStreamCheck: what the send stream parser lets through to btrfs
// receive and what it refuses.
func TestStreamCheck(t *testing.T) {
	p := func(s string) []byte { return []byte(s) }
	subvol := cmdBytes(cmdSubvol, uint16(attrPath), p("ck-1"), uint16(attrUUID), uuidBytes(uSelf))
	snap := cmdBytes(cmdSnapshot, uint16(attrPath), p("ck-1"), uint16(attrUUID), uuidBytes(uSelf), uint16(attrCloneUUID), uuidBytes(uParent))
	end := cmdBytes(cmdEnd)
	mkfile := func(path string) []byte { return cmdBytes(3, uint16(attrPath), p(path)) }
	clone := func(u string) []byte {
		return cmdBytes(cmdClone, uint16(attrPath), p("a"), uint16(attrCloneUUID), uuidBytes(u), uint16(attrClonePath), p("b"))
	}
	mkdir := func(path string) []byte { return cmdBytes(4, uint16(attrPath), p(path)) }
	symlink := func(path, target string) []byte {
		return cmdBytes(cmdSymlink, uint16(attrPath), p(path), uint16(attrPathLink), p(target))
	}
	rename := func(from, to string) []byte {
		return cmdBytes(cmdRename, uint16(attrPath), p(from), uint16(attrPathTo), p(to))
	}
	u64 := func(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }
	mknod := func(path string, mode, rdev uint64) []byte {
		return cmdBytes(cmdMknod, uint16(attrPath), p(path), uint16(attrRdev), u64(rdev), uint16(attrMode), u64(mode))
	}
	full, incr := expect{Name: "ck-1", UUID: uSelf}, expect{Name: "ck-1", UUID: uSelf, ParentUUID: uParent}
	for _, c := range []struct {
		name   string
		want   expect
		stream []byte
		ok     bool
	}{
		{"full", full, streamOf(subvol, mkfile("upper/x"), cmdBytes(18, uint16(attrPath), p("")), end), true},
		{"incremental with clones", incr, streamOf(snap, clone(uParent), clone(uSelf), end), true},
		{"another name", expect{Name: "ck-2", UUID: uSelf}, streamOf(subvol, end), false},
		{"another UUID", expect{Name: "ck-1", UUID: uOther}, streamOf(subvol, end), false},
		{"a second subvolume", full, streamOf(subvol, end[:0], subvol, end), false},
		{"full where incremental was agreed", incr, streamOf(subvol, end), false},
		{"incremental where full was agreed", full, streamOf(snap, end), false},
		{"incremental from another base", expect{Name: "ck-1", UUID: uSelf, ParentUUID: uOther}, streamOf(snap, end), false},
		{"a clone from another subvolume", incr, streamOf(snap, clone(uOther), end), false},
		{"a path up and out", full, streamOf(subvol, mkfile("upper/../../x"), end), false},
		{"an absolute path", full, streamOf(subvol, mkfile("/etc/x"), end), false},
		{"a hard link out", full, streamOf(subvol, cmdBytes(cmdLink, uint16(attrPath), p("a"), uint16(attrPathLink), p("../b")), end), false},
		{"a command before the subvolume", full, streamOf(mkfile("x"), subvol, end), false},
		{"data after the end", full, append(streamOf(subvol, end), 0), false},
		{"an unknown command", full, streamOf(subvol, cmdBytes(99), end), false},
		{"not a send stream", full, []byte("tar archive, honest\x00\x00\x00\x00"), false},
		{"cut before the end", full, streamOf(subvol, mkfile("x")), false},
		// Symlinks the stream makes are not followed (btrfs receive runs
		// chrooted where every received checkpoint is).
		{"a symlink used as a link", full, streamOf(subvol, symlink("o257-1-0", "/"), rename("o257-1-0", "upper/l"),
			cmdBytes(19, uint16(attrPath), p("upper/l")), cmdBytes(20, uint16(attrPath), p("upper/l")), rename("upper/l", "upper/m"),
			cmdBytes(cmdUnlink, uint16(attrPath), p("upper/m")), mkdir("upper/m"), mkfile("upper/m/x"), rename("upper/m/x", "upper/m/x"), end), true},
		{"a path through a symlink it made", full, streamOf(subvol, symlink("upper/s", "/"), mkfile("upper/s/victim/x"), end), false},
		{"a write into a symlink it made", full, streamOf(subvol, symlink("upper/f", "/victim/upper/f"), cmdBytes(cmdWrite, uint16(attrPath), p("upper/f")), end), false},
		{"a clone out of a symlink it made", full, streamOf(subvol, symlink("upper/s", "/"),
			cmdBytes(cmdClone, uint16(attrPath), p("a"), uint16(attrCloneUUID), uuidBytes(uSelf), uint16(attrClonePath), p("upper/s/victim/upper/secret")), end), false},
		{"a symlink made under a temporary name", full, streamOf(subvol, symlink("o257-1-0", "/"), rename("o257-1-0", "upper/s"), mkdir("upper/s/x"), end), false},
		{"a symlink moved with its directory", full, streamOf(subvol, mkdir("d"), symlink("d/s", "/"), rename("d", "e"), mkfile("e/s/x"), end), false},
		{"a hard link of a symlink", full, streamOf(subvol, symlink("a", "/"), cmdBytes(cmdLink, uint16(attrPath), p("b"), uint16(attrPathLink), p("a")), mkfile("b/x"), end), false},
		{"a symlink renamed onto itself", full, streamOf(subvol, symlink("s", "/"), rename("s", "s"), mkfile("s/x"), end), false},
		{"a rename into a symlink it made", full, streamOf(subvol, symlink("s", "/"), mkfile("f"), rename("f", "s/victim/f"), end), false},
		// Found by an attacker's review: receive strips a trailing "/",
		// and creat() follows a symlink.
		{"a symlink named with a trailing slash", full, streamOf(subvol, symlink("upper/l/", "/"), mkfile("upper/l/evil"), end), false},
		{"a symlink renamed to a trailing slash", full, streamOf(subvol, symlink("o1", "/"), rename("o1", "upper/m/"), mkfile("upper/m/evil"), end), false},
		{"a symlink hard-linked to a trailing slash", full, streamOf(subvol, symlink("o1", "/"),
			cmdBytes(cmdLink, uint16(attrPath), p("upper/m/"), uint16(attrPathLink), p("o1")), mkfile("upper/m/evil"), end), false},
		{"a file made over a symlink it made", full, streamOf(subvol, symlink("upper/s", "/evil"), mkfile("upper/s"),
			cmdBytes(cmdWrite, uint16(attrPath), p("upper/s")), end), false},
		{"the path .", full, streamOf(subvol, cmdBytes(cmdChmod, uint16(attrPath), p(".")), end), false},
		{"an overlay whiteout", full, streamOf(subvol, mknod("upper/gone", 0o20000, 0), end), true},
		{"a char device", full, streamOf(subvol, mknod("upper/mem", 0o20600, 1<<8|1), end), false},
		{"a block device", full, streamOf(subvol, mknod("upper/sda", 0o60600, 8<<8), end), false},
		{"a mknod without its device", full, streamOf(subvol, cmdBytes(cmdMknod, uint16(attrPath), p("upper/x"), uint16(attrMode), u64(0o20000)), end), false},
		{"a path past PATH_MAX", full, streamOf(subvol, mkfile(strings.Repeat("a/", 2048)+"x"), end), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			var out bytes.Buffer
			sc := newStreamCheck(c.want, &out)
			var err error
			// Fed in small pieces, as frames arrive.
			for s := c.stream; len(s) > 0 && err == nil; {
				n := min(len(s), 7)
				_, err = sc.Write(s[:n])
				s = s[n:]
			}
			if err == nil {
				err = sc.Close()
			}
			if c.ok != (err == nil) {
				t.Fatalf("got %v, want ok=%v", err, c.ok)
			}
			if c.ok && !bytes.Equal(out.Bytes(), c.stream) {
				t.Errorf("passed %d bytes, want all %d", out.Len(), len(c.stream))
			}
			// A cut stream is valid as far as it goes: btrfs receive is
			// stopped and its subvolume deleted. The others are refused
			// before they all reach it.
			if !c.ok && c.name != "cut before the end" && bytes.Equal(out.Bytes(), c.stream) {
				t.Errorf("a refused stream was passed on whole")
			}
		})
	}
}

// TestStreamCheckBaseLinks: an incremental stream may not make btrfs
// receive follow a symlink the agreed base holds (its tenant made it),
// under the name it has in the base or one the stream moved it to; a
// base symlink the stream replaced is no longer one.
func TestStreamCheckBaseLinks(t *testing.T) {
	base := t.TempDir()
	for _, d := range []string{"upper/d", "upper/dir"} {
		if err := os.MkdirAll(filepath.Join(base, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for at, to := range map[string]string{"upper/s": "/", "upper/d/t": "/", "upper/py": "/usr/bin/python3"} {
		if err := os.Symlink(to, filepath.Join(base, at)); err != nil {
			t.Fatal(err)
		}
	}
	p := func(s string) []byte { return []byte(s) }
	snap := cmdBytes(cmdSnapshot, uint16(attrPath), p("ck-1"), uint16(attrUUID), uuidBytes(uSelf), uint16(attrCloneUUID), uuidBytes(uParent))
	end := cmdBytes(cmdEnd)
	mkfile := func(path string) []byte { return cmdBytes(3, uint16(attrPath), p(path)) }
	mkdir := func(path string) []byte { return cmdBytes(4, uint16(attrPath), p(path)) }
	rename := func(from, to string) []byte {
		return cmdBytes(cmdRename, uint16(attrPath), p(from), uint16(attrPathTo), p(to))
	}
	write := func(path string) []byte { return cmdBytes(cmdWrite, uint16(attrPath), p(path)) }
	clone := func(u, path string) []byte {
		return cmdBytes(cmdClone, uint16(attrPath), p("upper/dir/f"), uint16(attrCloneUUID), uuidBytes(u), uint16(attrClonePath), p(path))
	}
	want := expect{Name: "ck-1", UUID: uSelf, ParentUUID: uParent, baseDir: base}
	for _, c := range []struct {
		name   string
		stream []byte
		ok     bool
	}{
		{"files in the base's directories", streamOf(snap, mkfile("upper/dir/f"), write("upper/dir/f"), clone(uParent, "upper/dir/g"), end), true},
		{"a base symlink replaced by a directory", streamOf(snap, cmdBytes(cmdUnlink, uint16(attrPath), p("upper/s")), mkdir("o1-1-0"),
			rename("o1-1-0", "upper/s"), mkfile("upper/s/x"), write("upper/s/x"), end), true},
		{"a base symlink moved aside, a directory in its place", streamOf(snap, rename("upper/s", "o9-1-0"), mkdir("o1-1-0"),
			rename("o1-1-0", "upper/s"), mkfile("upper/s/x"), end), true},
		{"a base symlink renamed, as send does", streamOf(snap, rename("upper/py", "upper/py3"), cmdBytes(19, uint16(attrPath), p("upper/py3")), end), true},
		{"through a base symlink", streamOf(snap, mkfile("upper/s/victim"), end), false},
		{"a write into a base symlink", streamOf(snap, write("upper/py"), end), false},
		{"a clone out of the base through its symlink", streamOf(snap, mkfile("upper/dir/f"), clone(uParent, "upper/s/victim/upper/secret"), end), false},
		{"through a base symlink renamed", streamOf(snap, rename("upper/s", "upper/r"), mkfile("upper/r/x"), end), false},
		{"through a base symlink in a renamed directory", streamOf(snap, rename("upper/d", "upper/e"), mkfile("upper/e/t/x"), end), false},
		{"a base symlink hard-linked", streamOf(snap, cmdBytes(cmdLink, uint16(attrPath), p("upper/l"), uint16(attrPathLink), p("upper/s")), mkfile("upper/l/x"), end), false},
		{"a base symlink moved into a new directory", streamOf(snap, mkdir("upper/n"), rename("upper/s", "upper/n/s"), mkfile("upper/n/s/x"), end), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			sc := newStreamCheck(want, io.Discard)
			_, err := sc.Write(c.stream)
			if err == nil {
				err = sc.Close()
			}
			if c.ok != (err == nil) {
				t.Fatalf("got %v, want ok=%v", err, c.ok)
			}
		})
	}
}
