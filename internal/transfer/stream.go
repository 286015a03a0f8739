package transfer

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"path"
	"strings"

	"github.com/forkbox/forkbox/errdefs"
	"golang.org/x/sys/unix"
)

// The btrfs send stream (version 1), from the kernel's fs/btrfs/send.h:
// "btrfs-stream\0", le32 version, then commands: le32 length of the
// attributes, le16 command, le32 crc32c, then attributes as le16 type,
// le16 length, value.
const (
	streamMagic   = "btrfs-stream\x00"
	streamHdrLen  = len(streamMagic) + 4
	cmdHdrLen     = 10
	maxCmdLen     = 1 << 20 // v1 commands carry at most 64 KiB of data
	cmdSubvol     = 1
	cmdSnapshot   = 2
	cmdMkfile     = 3
	cmdMknod      = 5
	cmdSymlink    = 8
	cmdRename     = 9
	cmdLink       = 10
	cmdUnlink     = 11
	cmdWrite      = 15
	cmdClone      = 16
	cmdTruncate   = 17
	cmdChmod      = 18
	cmdEnd        = 21
	cmdMaxV1      = 22 // UPDATE_EXTENT
	cmdUpdateExt  = 22
	attrUUID      = 1
	attrMode      = 5
	attrRdev      = 8
	attrPath      = 15
	attrPathTo    = 16
	attrPathLink  = 17
	attrCloneUUID = 20
	attrClonePath = 22
)

// expect is what a stream must carry: the subvolume Name with UUID (its
// received UUID once received), made from the subvolume ParentUUID when
// that is not "" (an incremental send), else from nothing.
type expect struct {
	Name, UUID, ParentUUID string
	// base is the local subvolume's own UUID of the agreed base (its
	// origin is ParentUUID): the received subvolume must be a snapshot
	// of it, not of another that claims the same origin. baseDir is
	// that subvolume's directory here.
	base, baseDir string
}

// streamCheck parses a send stream as it is written and passes each
// command to out only once it is checked, so btrfs receive never acts on
// a command that breaks the rules (see the package doc).
type streamCheck struct {
	want  expect
	out   io.Writer
	buf   []byte
	n     int64 // bytes written
	hdr   bool  // stream header seen
	sub   bool  // the subvolume's command seen
	ended bool
	// paths tells the symlinks among the paths it names (streamlinks.go).
	paths *pathTracker
}

func newStreamCheck(want expect, out io.Writer) *streamCheck {
	return &streamCheck{want: want, out: out, paths: newPathTracker(want.baseDir)}
}

func refuse(format string, args ...any) error {
	return fmt.Errorf("refused send stream: "+format+": %w", append(args, errdefs.ErrInvalidArgument)...)
}

// Write implements io.Writer.
func (c *streamCheck) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	if c.ended && len(p) > 0 {
		return 0, refuse("data after its end")
	}
	c.buf = append(c.buf, p...)
	off := 0
	if !c.hdr {
		if len(c.buf) < streamHdrLen {
			return len(p), nil
		}
		if string(c.buf[:len(streamMagic)]) != streamMagic {
			return 0, refuse("not a btrfs send stream")
		}
		if v := binary.LittleEndian.Uint32(c.buf[len(streamMagic):]); v != 1 {
			return 0, refuse("version %d, want 1", v)
		}
		c.hdr, off = true, streamHdrLen
	}
	for len(c.buf)-off >= cmdHdrLen {
		l := int(binary.LittleEndian.Uint32(c.buf[off:]))
		if l > maxCmdLen {
			return 0, refuse("a command of %d bytes", l)
		}
		if len(c.buf)-off < cmdHdrLen+l {
			break
		}
		cmd := binary.LittleEndian.Uint16(c.buf[off+4:])
		if err := c.check(cmd, c.buf[off+cmdHdrLen:off+cmdHdrLen+l]); err != nil {
			return 0, err
		}
		off += cmdHdrLen + l
		if c.ended && off != len(c.buf) {
			return 0, refuse("data after its end")
		}
	}
	if off > 0 {
		if _, err := c.out.Write(c.buf[:off]); err != nil {
			return 0, err
		}
		c.buf = append(c.buf[:0], c.buf[off:]...)
	}
	return len(p), nil
}

// Close reports whether the stream was complete.
func (c *streamCheck) Close() error {
	if !c.ended || len(c.buf) > 0 {
		return fmt.Errorf("the send stream ended before its end command (%d bytes): %w", c.n, errdefs.ErrUnavailable)
	}
	return nil
}

func (c *streamCheck) check(cmd uint16, attrs []byte) error {
	a, err := parseAttrs(attrs)
	if err != nil {
		return err
	}
	if cmd == 0 || cmd > cmdMaxV1 {
		return refuse("unknown command %d", cmd)
	}
	if !c.sub && cmd != cmdSubvol && cmd != cmdSnapshot {
		return refuse("command %d before the subvolume's", cmd)
	}
	for _, t := range []uint16{attrPath, attrPathTo, attrClonePath} {
		if p, ok := a[t]; ok {
			if err := relPath(p); err != nil {
				return err
			}
		}
	}
	switch cmd {
	case cmdSubvol, cmdSnapshot:
		if c.sub {
			return refuse("a second subvolume %q", a[attrPath])
		}
		c.sub = true
		if got := string(a[attrPath]); got != c.want.Name {
			return refuse("it carries subvolume %q, not %q", got, c.want.Name)
		}
		if got := uuidOf(a[attrUUID]); c.want.UUID != "" && got != c.want.UUID {
			return refuse("it carries subvolume UUID %s, not %s", got, c.want.UUID)
		}
		if cmd == cmdSubvol && c.want.ParentUUID != "" {
			return refuse("a full send where an incremental one from %s was agreed", c.want.ParentUUID)
		}
		if cmd == cmdSnapshot {
			if c.want.ParentUUID == "" {
				return refuse("an incremental send where a full one was agreed")
			}
			if got := uuidOf(a[attrCloneUUID]); got != c.want.ParentUUID {
				return refuse("incremental from %s, not from the agreed %s", got, c.want.ParentUUID)
			}
		}
	case cmdLink:
		if err := relPath(a[attrPathLink]); err != nil {
			return err
		}
	case cmdMknod:
		if err := notDevice(a); err != nil {
			return err
		}
	}
	if err := c.paths.check(cmd, a, c.want); err != nil {
		return err
	}
	switch cmd {
	case cmdClone:
		// A clone names its source by UUID: only this subvolume and its
		// agreed base may lend data, never another tenant's checkpoint.
		got := uuidOf(a[attrCloneUUID])
		if got == "" || (got != c.want.UUID && got != c.want.ParentUUID) {
			return refuse("a clone from subvolume %s", got)
		}
	case cmdEnd:
		c.ended = true
	}
	return nil
}

// notDevice refuses a mknod of a device node: nothing a checkpoint needs
// is one (image layers never make them on the host), and another node's
// could name this host's disks or memory. The pool is mounted nodev and
// every sandbox's device rules deny them, but they are not let in at all.
// An overlay whiteout (a char device 0:0, which marks a deleted file in a
// writable layer) is the one let through; fifos and sockets have their
// own commands.
func notDevice(a map[uint16][]byte) error {
	mode, rdev := a[attrMode], a[attrRdev]
	if len(mode) != 8 || len(rdev) != 8 {
		return refuse("a mknod of %q without its mode and device", a[attrPath])
	}
	m, r := binary.LittleEndian.Uint64(mode), binary.LittleEndian.Uint64(rdev)
	if m&unix.S_IFMT == unix.S_IFCHR && r == 0 {
		return nil
	}
	return refuse("a device node %q (mode %o, device %d:%d)", a[attrPath], m, unix.Major(r), unix.Minor(r))
}

func parseAttrs(b []byte) (map[uint16][]byte, error) {
	out := map[uint16][]byte{}
	for len(b) > 0 {
		if len(b) < 4 {
			return nil, refuse("a truncated attribute")
		}
		t, l := binary.LittleEndian.Uint16(b), int(binary.LittleEndian.Uint16(b[2:]))
		if len(b) < 4+l {
			return nil, refuse("attribute %d overruns its command", t)
		}
		out[t] = b[4 : 4+l]
		b = b[4+l:]
	}
	return out, nil
}

// maxPath bounds a path in the stream: PATH_MAX, past which btrfs receive
// fails anyway.
const maxPath = 4096

// relPath refuses a path that is absolute, steps out with "..", is not
// clean (btrfs send names every path cleanly: "" is the subvolume's root,
// never "." nor a trailing "/", which receive would strip and the symlink
// check would not) or is longer than maxPath.
func relPath(p []byte) error {
	s := string(p)
	if s == "" {
		return nil
	}
	if len(s) >= maxPath {
		return refuse("a path of %d bytes", len(s))
	}
	if strings.HasPrefix(s, "/") || bytes.IndexByte(p, 0) >= 0 {
		return refuse("path %q", s)
	}
	for _, part := range strings.Split(s, "/") {
		if part == ".." {
			return refuse("path %q leaves the subvolume", s)
		}
	}
	if path.Clean(s) != s || s == "." {
		return refuse("path %q is not clean", s)
	}
	return nil
}

// uuidOf formats a 16-byte UUID attribute as btrfs prints it.
func uuidOf(b []byte) string {
	if len(b) != 16 {
		return ""
	}
	h := hex.EncodeToString(b)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}
