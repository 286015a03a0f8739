package transfer

import (
	"os"
	"path/filepath"
	"strings"
)

// btrfs receive runs chrooted in the directory every received checkpoint
// shares, and resolves each command's path with the usual calls, which
// follow symlinks: through a link to "/" a stream could take files from,
// or write them into, any other checkpoint there. btrfs send never names
// a path through a symlink, nor writes, truncates, chmods or clones into
// or out of one (it names a link itself only to rename, link, unlink,
// chown, or set its times or extended attributes, whose calls do not
// follow it). So the stream check refuses a path with a symlink among its
// parents, and one that is a symlink for those other commands: the
// symlinks the stream made, followed through its renames, hard links and
// unlinks, and those the agreed base holds (its tenant made them), looked
// up in the base under the name they had there.

// pathTracker knows which of the paths a stream names are symlinks. The
// paths the stream made or moved are kept as a tree, so that a rename
// moves a directory with all it holds at once (btrfs send makes every
// new file under a temporary name and renames it into place).
type pathTracker struct {
	base string // the agreed base's directory here ("" for a full send)
	root *pnode
	// baseLinks caches which base paths are symlinks.
	baseLinks map[string]bool
}

// pnode is one path component; set when the stream made the path or
// moved it from the base (unset: only a way to what lies below).
type pnode struct {
	kids map[string]*pnode
	set  bool
	link bool   // made as a symlink (or a hard link of one)
	from string // moved from this path of the base ("" if made)
}

func newPathTracker(base string) *pathTracker {
	return &pathTracker{base: base, root: &pnode{}, baseLinks: map[string]bool{}}
}

// check refuses command cmd when it would follow a symlink, and then
// records what it makes, moves and removes.
func (t *pathTracker) check(cmd uint16, a map[uint16][]byte, want expect) error {
	if cmd == cmdSubvol || cmd == cmdSnapshot {
		return nil
	}
	// mkfile is creat(): it follows a symlink in the way, unlike the other
	// calls that make a path (EEXIST).
	follows := cmd == cmdMkfile || cmd == cmdWrite || cmd == cmdTruncate || cmd == cmdChmod || cmd == cmdClone || cmd == cmdUpdateExt
	names := []uint16{attrPath, attrPathTo}
	if cmd == cmdLink {
		names = append(names, attrPathLink) // else a symlink's target, which receive does not resolve
	}
	for _, n := range names {
		if p, ok := a[n]; ok {
			if err := t.through(cmd, string(p), follows, false); err != nil {
				return err
			}
		}
	}
	if p, ok := a[attrClonePath]; ok {
		switch uuidOf(a[attrCloneUUID]) {
		case want.UUID:
			if err := t.through(cmd, string(p), true, false); err != nil {
				return err
			}
		case want.ParentUUID: // a path of the base as it is
			if err := t.through(cmd, string(p), true, true); err != nil {
				return err
			}
		}
	}
	t.record(cmd, a)
	return nil
}

// through refuses path p when a parent of it, or (whole) p itself, is a
// symlink: as the stream has named things so far, or (inBase) in the base
// as it is. It walks p once, the shortest prefix first, so that no lookup
// goes through a link.
func (t *pathTracker) through(cmd uint16, p string, whole, inBase bool) error {
	n, near, nearLen := t.root, (*pnode)(nil), 0
	for i := 0; i <= len(p) && p != ""; {
		j := strings.IndexByte(p[i:], '/')
		if j < 0 {
			j = len(p) - i
		}
		end := i + j
		last := end == len(p)
		if !last || whole {
			var link bool
			if inBase {
				link = t.baseLink(p[:end])
			} else {
				if n != nil {
					n = n.kids[p[i:end]]
				}
				link = t.linkOf(p[:end], n, near, nearLen)
				if n != nil && n.set {
					near, nearLen = n, end
				}
			}
			if link && !last {
				return refuse("path %q goes through the symlink %q", p, p[:end])
			}
			if link {
				return refuse("command %d follows the symlink %q", cmd, p)
			}
		}
		i = end + 1
	}
	return nil
}

// find walks to p: its node (nil if none), and the nearest set node on
// the way (p's own when set) with the length of its path.
func (t *pathTracker) find(p string) (n, near *pnode, nearLen int) {
	n = t.root
	for i := 0; n != nil && i <= len(p); {
		j := strings.IndexByte(p[i:], '/')
		if j < 0 {
			j = len(p) - i
		}
		n = n.kids[p[i:i+j]]
		if n != nil && n.set {
			near, nearLen = n, i+j
		}
		i += j + 1
	}
	return n, near, nearLen
}

// isLink says whether p, as the stream has named things so far, is a
// symlink.
func (t *pathTracker) isLink(p string) bool {
	n, near, l := t.find(p)
	return t.linkOf(p, n, near, l)
}

// linkOf says whether path q is a symlink, given its node n (nil if none)
// and the nearest set node above it, near, whose path is q[:nearLen]: a
// link the stream made, else what the base holds where q came from.
func (t *pathTracker) linkOf(q string, n, near *pnode, nearLen int) bool {
	if n != nil && n.set {
		if n.from == "" {
			return n.link
		}
		return t.baseLink(n.from)
	}
	return t.baseLink(whereInBase(q, near, nearLen))
}

// basePath is where p is in the base (whereInBase).
func (t *pathTracker) basePath(p string) string {
	_, near, l := t.find(p)
	return whereInBase(p, near, l)
}

// whereInBase is where q is in the base, given the nearest set node at or
// above it, near, whose path is q[:nearLen]: under where the stream moved
// that one from, else q itself ("" under one the stream made, where the
// base has nothing).
func whereInBase(q string, near *pnode, nearLen int) string {
	switch {
	case near == nil:
		return q
	case near.from == "":
		return ""
	}
	return near.from + q[nearLen:]
}

// baseLink says whether path p of the base is a symlink.
func (t *pathTracker) baseLink(p string) bool {
	if t.base == "" || p == "" {
		return false
	}
	if l, ok := t.baseLinks[p]; ok {
		return l
	}
	st, err := os.Lstat(filepath.Join(t.base, p)) // its parents are checked first: no link among them
	l := err == nil && st.Mode()&os.ModeSymlink != 0
	t.baseLinks[p] = l
	return l
}

// record notes what cmd made, moved or removed.
func (t *pathTracker) record(cmd uint16, a map[uint16][]byte) {
	p := string(a[attrPath])
	switch cmd {
	case 3, 4, 5, 6, 7: // mkfile, mkdir, mknod, mkfifo, mksock
		t.put(p, &pnode{set: true})
	case cmdSymlink:
		t.put(p, &pnode{set: true, link: true})
	case cmdLink:
		t.put(p, &pnode{set: true, link: t.isLink(string(a[attrPathLink]))})
	case cmdUnlink, 12: // unlink, rmdir
		t.detach(p)
	case cmdRename:
		to := string(a[attrPathTo])
		if p == to {
			return
		}
		from := t.basePath(p)
		n := t.detach(p)
		if n == nil {
			n = &pnode{}
		}
		if !n.set {
			n.set, n.from = true, from
		}
		t.put(to, n)
	}
}

// put sets n at p, replacing what was there.
func (t *pathTracker) put(p string, n *pnode) {
	dir, name := t.root, p
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		for _, c := range strings.Split(p[:i], "/") {
			next := dir.kids[c]
			if next == nil {
				next = &pnode{}
				if dir.kids == nil {
					dir.kids = map[string]*pnode{}
				}
				dir.kids[c] = next
			}
			dir = next
		}
		name = p[i+1:]
	}
	if dir.kids == nil {
		dir.kids = map[string]*pnode{}
	}
	dir.kids[name] = n
}

// detach takes p's node, with what lies under it, out of the tree.
func (t *pathTracker) detach(p string) *pnode {
	dir, name := t.root, p
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		d, _, _ := t.find(p[:i])
		if d == nil {
			return nil
		}
		dir, name = d, p[i+1:]
	}
	n := dir.kids[name]
	delete(dir.kids, name)
	return n
}
