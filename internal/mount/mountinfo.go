package mount

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Info is one line of a mountinfo file (proc(5)).
type Info struct {
	ID, Parent   int
	Root         string // root of the mount within its filesystem
	Mountpoint   string
	Options      string // per-mount options
	PeerGroup    int    // its peer group's ID (shared:N), 0 when not shared
	FSType       string
	Source       string
	SuperOptions string // per-superblock options, e.g. overlay's upperdir=
}

// List returns the mounts of the calling thread's mount namespace (the one
// this package's mount and unmount calls act on), in mountinfo order
// (parents before children).
//
// It reads /proc/thread-self/mountinfo, not /proc/self/mountinfo: /proc/self
// is the main thread, and a thread may have its own mount namespace (crun's
// driver unshares one on a locked thread). Were the main thread ever left in
// such a namespace, /proc/self/mountinfo would show its frozen private copy
// of the host's mounts: mounts unmounted since would still be listed there.
// The thread an unlocked goroutine runs on is in the daemon's namespace.
func List() ([]Info, error) {
	b, err := os.ReadFile(mountinfoPath)
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	return parseMountinfo(b)
}

// mountinfoPath is the calling thread's mount table (Linux 3.17+).
const mountinfoPath = "/proc/thread-self/mountinfo"

func parseMountinfo(b []byte) ([]Info, error) {
	var out []Info
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		pre, post, ok := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 6 || len(g) < 2 {
			return nil, fmt.Errorf("bad mountinfo line %q", line)
		}
		var in Info
		in.ID, _ = strconv.Atoi(f[0])
		in.Parent, _ = strconv.Atoi(f[1])
		in.Root, in.Mountpoint, in.Options = unescape(f[3]), unescape(f[4]), f[5]
		for _, opt := range f[6:] {
			if g, ok := strings.CutPrefix(opt, "shared:"); ok {
				in.PeerGroup, _ = strconv.Atoi(g)
			}
		}
		in.FSType, in.Source = g[0], unescape(g[1])
		if len(g) > 2 {
			in.SuperOptions = g[2]
		}
		out = append(out, in)
	}
	return out, sc.Err()
}

// unescape decodes mountinfo's octal escapes (\040 for space, ...).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Under returns the mount points at or below prefix, deepest first, so that
// unmounting them in order never hits a busy parent. A path mounted several
// times appears once per mount.
func Under(prefix string) ([]string, error) {
	prefix = filepath.Clean(prefix)
	if p, err := filepath.EvalSymlinks(prefix); err == nil {
		prefix = p
	}
	infos, err := List()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, in := range infos {
		if in.Mountpoint == prefix || strings.HasPrefix(in.Mountpoint, prefix+"/") || prefix == "/" {
			out = append(out, in.Mountpoint)
		}
	}
	// Deepest first; among equal paths, later (upper) mounts first.
	sorted := make([]string, 0, len(out))
	for i := len(out) - 1; i >= 0; i-- {
		sorted = append(sorted, out[i])
	}
	sort.SliceStable(sorted, func(a, b int) bool {
		return strings.Count(sorted[a], "/") > strings.Count(sorted[b], "/")
	})
	return sorted, nil
}

// IsMountPoint reports whether path is a mount point.
func IsMountPoint(path string) (bool, error) {
	path = filepath.Clean(path)
	if p, err := filepath.EvalSymlinks(path); err == nil {
		path = p
	} else if os.IsNotExist(err) {
		return false, nil
	}
	// Fast path: statx knows STATX_ATTR_MOUNT_ROOT.
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, unix.AT_SYMLINK_NOFOLLOW, 0, &st); err == nil &&
		st.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 {
		return st.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0, nil
	}
	infos, err := List()
	if err != nil {
		return false, err
	}
	for _, in := range infos {
		if in.Mountpoint == path {
			return true, nil
		}
	}
	return false, nil
}

// Shared reports whether in is in a peer group: mounts and unmounts below
// it propagate.
func (in Info) Shared() bool { return in.PeerGroup != 0 }

// Top returns the mount of infos that path resolves to when it is that
// mount's root (the topmost one on path, the one the calling thread sees),
// or nil when path is no mount point. A mount hidden below another, or
// copied by propagation onto a peer of the parent that something covers,
// can be listed after the visible one: the mount ID statx gives names the
// visible one.
func Top(infos []Info, path string) *Info {
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_MNT_ID, &st); err == nil && st.Mask&unix.STATX_MNT_ID != 0 {
		for i := range infos {
			if uint64(infos[i].ID) == st.Mnt_id {
				if infos[i].Mountpoint == path {
					return &infos[i]
				}
				return nil
			}
		}
	}
	for i := len(infos) - 1; i >= 0; i-- { // no STATX_MNT_ID (Linux < 5.8)
		if infos[i].Mountpoint == path {
			return &infos[i]
		}
	}
	return nil
}

// CountAt counts the mounts of infos on path: stacked ones, and hidden
// ones (copied onto a covered peer of the parent), each count.
func CountAt(infos []Info, path string) int {
	n := 0
	for _, in := range infos {
		if in.Mountpoint == path {
			n++
		}
	}
	return n
}

// HasBelow reports whether anything in infos is mounted strictly below path.
func HasBelow(infos []Info, path string) bool {
	for _, in := range infos {
		if strings.HasPrefix(in.Mountpoint, path+"/") {
			return true
		}
	}
	return false
}

// SelfBind reports whether in binds its own directory of its parent's file
// system onto itself (mount --bind d d).
func SelfBind(infos []Info, in Info) bool {
	for _, p := range infos {
		if p.ID != in.Parent {
			continue
		}
		rel, err := filepath.Rel(p.Mountpoint, in.Mountpoint)
		return err == nil && rel != ".." && !strings.HasPrefix(rel, "../") && p.Source == in.Source && p.FSType == in.FSType &&
			filepath.Join(p.Root, rel) == in.Root
	}
	return false
}

// GroupShared reports whether in is in a peer group with another mount of
// infos: mounts made below in then propagate to that one too, and to every
// copy of it.
func GroupShared(infos []Info, in Info) bool {
	if in.PeerGroup == 0 {
		return false
	}
	for _, o := range infos {
		if o.ID != in.ID && o.PeerGroup == in.PeerGroup {
			return true
		}
	}
	return false
}
