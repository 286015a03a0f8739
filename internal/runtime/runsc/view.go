package runsc

// The runsc view: the mount namespace every runsc process of the driver
// runs in (Options.HideMountsUnder).
//
// Every live sandbox adds mounts to the host's table (its rootfs overlay,
// its netns), and runsc pays for each of them on every start: it copies
// the table into the gofer's and the sandbox's new mount namespaces, reads
// /proc/self/mountinfo five times (its cgroup lookup; about 6 ms a read
// beside 2,000 such mounts), and the gofer turns the copy into a slave and
// unmounts it again after pivot_root. Measured here at 1,000 live gVisor
// sandboxes: a tenant's `runsc create` + `start` in a pre-booted sandbox
// took 46-49 ms among the host's 2,000 extra mounts, 31-33 ms without them,
// and 30 ms with 20 sandboxes live.
//
// So runsc does not run in the host's mount namespace. New makes a copy of
// it once, a slave of the host's (the host's mounts and unmounts reach it;
// nothing done in it reaches the host), with each hidden directory cut
// from that propagation (on the host, a mount point out of its parent's
// peer group, boundary.go, so the sandboxes' mounts made below it later
// stay out; in the view, that mount point's copy and every mount below it,
// the sandboxes' rootfs mounts and netns files, detached: clearHidden),
// and with the host's mounts that no runsc of this driver needs
// detached too: overlays and namespace files (other daemons' sandboxes,
// other runtimes' containers), loop-backed file systems and other
// daemons' runsc stages, except those holding the driver's own directories
// (Options.KeepMountsUnder, its state root, stage and logs). Before a
// command that starts a sandbox's processes (run, create, restore) the
// driver attaches that sandbox's own rootfs and netns mounts (a clone of
// the host's, open_tree and move_mount) at the same paths, and detaches
// them when the command has returned: the processes runsc started hold
// copies of their own. So the view holds the host's base mounts, those
// the host made since outside the hidden directories (on a shared parent:
// another runtime's containers, another daemon's pool), and those of the
// starts under way.
//
// A file system the host unmounts leaves the view when the host's mount
// was shared (systemd makes every mount shared): a private one sends no
// event to any copy, so the view keeps it, busy, until the daemon stops.
// That is why the view drops the kinds above from the start: another
// daemon's snapshot pool stayed on its loop device until this one stopped.
// A host's plain umount (not a lazy one) of a mount fails busy, as it
// would for the host's own, while a process in the view holds its copy
// (runsc's files are in the driver's directories, its cwd the daemon's).
// When a hidden directory cannot be made a boundary (makeBoundaries: it
// has mounts below and is no mount point, or it shares its peer group on
// the host), or when the driver is told to leave the hidden directories'
// propagation as it is (Options.SharedHidden), the view is a private copy
// instead, which follows nothing.
//
// A thread enters the view (unshare CLONE_FS, setns) and never leaves it:
// its goroutine keeps it locked and it ends with the goroutine, so no other
// goroutine ever runs on a thread in the view, and the daemon's own mounts
// still go to the host's namespace. That thread is never the main thread
// (ocicli.OnOtherThread), which Go parks instead of ending.
//
import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/mount"
	"github.com/forkbox/forkbox/internal/runtime/ocicli"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// view is the mount namespace runsc runs in.
type view struct {
	cwd     string   // the process's working directory, entered with it
	hidden  []string // the hidden directories, resolved
	follows bool     // a slave of the host's mounts, behind boundaries

	nsMu sync.RWMutex // held (read) while a thread enters; close takes it
	ns   *os.File     // its /proc/thread-self/ns/mnt; nil once closed
	gone atomic.Bool  // closed: commands run in the host's namespace

	mu   sync.Mutex
	refs map[string]int // attached path → commands that hold it
}

// newView makes the view: a copy of the caller's mount namespace without
// the mounts below the directories in hide, nor the ones of the kinds no
// runsc needs, unless they hold a directory in keep. With follow, it
// makes the hidden directories boundaries, and the view a slave.
func newView(hide, keep []string, follow bool) (*view, error) {
	cwd, err := os.Getwd()
	if err != nil {
		cwd = "/"
	}
	if hide, err = existing(hide); err != nil {
		return nil, err
	}
	// The calls attach needs (Linux 5.2): without them, no view.
	fd, err := unix.OpenTree(unix.AT_FDCWD, "/", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("runsc view: open_tree: %v: %w", err, errdefs.ErrUnavailable)
	}
	unix.Close(fd)
	follows := false
	var made []string
	if follow {
		if made, follows, err = makeBoundaries(hide); err != nil {
			return nil, err
		}
	}
	var ns *os.File
	err = ocicli.OnOtherThread(func() (err error) {
		ns, err = makeView(hide, resolved(keep), follows)
		return err
	})
	if err != nil {
		return nil, errors.Join(err, releaseBoundaries(made))
	}
	return &view{ns: ns, cwd: cwd, hidden: hide, follows: follows, refs: map[string]int{}}, nil
}

// makeView unshares the calling (locked, doomed) thread's mount namespace
// and makes it the view; it returns a handle on it. With follows, the
// hidden directories are mount points (boundaries), and the view a slave
// of the host's mounts but for them; without, a private copy.
func makeView(hide, keep []string, follows bool) (*os.File, error) {
	if err := unix.Unshare(unix.CLONE_FS | unix.CLONE_NEWNS); err != nil {
		return nil, fmt.Errorf("runsc view: unshare: %v: %w", err, errdefs.ErrUnavailable)
	}
	prop := uintptr(unix.MS_PRIVATE)
	if follows {
		prop = unix.MS_SLAVE
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|prop, ""); err != nil {
		return nil, fmt.Errorf("runsc view: make the copy a slave or private: %v: %w", err, errdefs.ErrInternal)
	}
	for _, d := range hide {
		if err := clearHidden(d, follows); err != nil {
			return nil, err
		}
	}
	infos, err := mount.List()
	if err != nil {
		return nil, fmt.Errorf("runsc view: %v: %w", err, errdefs.ErrInternal)
	}
	for i := len(infos) - 1; i >= 0; i-- { // children before parents
		m := infos[i].Mountpoint
		if !unneeded(infos[i]) || holds(m, keep) {
			continue
		}
		if err := detach(m); err != nil {
			return nil, err
		}
	}
	ns, err := os.Open("/proc/thread-self/ns/mnt")
	if err != nil {
		return nil, fmt.Errorf("runsc view: %v: %w", err, errdefs.ErrInternal)
	}
	return ns, nil
}

// clearHidden detaches, in the view (the calling thread's namespace),
// every mount below the hidden directory d, and d's own boundary (a bind
// of d onto itself): what the view needs there, attach brings. It goes
// round until none is left, since a detach by path takes the top mount
// only and reveals what it covered (a sandbox mount copied onto the
// parent's peer, below an earlier version's netns bind). Another mount on
// d (a disk of its own) stays, cut from the host's propagation when the
// view follows the host.
func clearHidden(d string, follows bool) error {
	for range 8 {
		infos, err := mount.List()
		if err != nil {
			return fmt.Errorf("runsc view: %v: %w", err, errdefs.ErrInternal)
		}
		var paths []string
		for i := len(infos) - 1; i >= 0; i-- { // children before parents
			if below(infos[i].Mountpoint, []string{d}) {
				paths = append(paths, infos[i].Mountpoint)
			}
		}
		if top := mount.Top(infos, d); top != nil && mount.SelfBind(infos, *top) {
			paths = append(paths, d)
		}
		if len(paths) == 0 {
			break
		}
		for _, m := range paths {
			if err := detach(m); err != nil {
				return err
			}
		}
	}
	if !follows {
		return nil
	}
	if mp, err := mount.IsMountPoint(d); err != nil || !mp {
		return err
	}
	if err := unix.Mount("", d, "", unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("runsc view: cut %s from the host's mounts: %v: %w", d, err, errdefs.ErrInternal)
	}
	return nil
}

// detach lazily unmounts the top mount on m in the calling thread's
// namespace; one already gone (or never there) is no error.
func detach(m string) error {
	if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("runsc view: detach %s: %v: %w", m, err, errdefs.ErrInternal)
	}
	return nil
}

// unneeded reports whether m is of a kind no runsc of this driver needs
// from the host: a sandbox's or container's root (overlay), a namespace
// file (nsfs), a loop-backed file system (a snapshot pool, a memory
// vault), a runsc stage. The root mount is always needed.
func unneeded(m mount.Info) bool {
	if m.Mountpoint == "/" {
		return false
	}
	switch {
	case m.FSType == "overlay", m.FSType == "nsfs", strings.HasPrefix(m.Source, "/dev/loop"), m.Source == stageFS:
		return true
	}
	return false
}

// below reports whether path is strictly below one of dirs.
func below(path string, dirs []string) bool {
	for _, d := range dirs {
		if strings.HasPrefix(path, d+"/") {
			return true
		}
	}
	return false
}

// holds reports whether a mount on mountpoint holds one of dirs: is at or
// below one of them, or above one.
func holds(mountpoint string, dirs []string) bool {
	for _, d := range dirs {
		if mountpoint == d || strings.HasPrefix(mountpoint, d+"/") || strings.HasPrefix(d, mountpoint+"/") {
			return true
		}
	}
	return false
}

// resolved returns dirs absolute, cleaned and with symlinks resolved (as
// the mount table names them); empty ones dropped.
func resolved(dirs []string) []string {
	var out []string
	for _, d := range dirs {
		if d == "" {
			continue
		}
		abs, err := filepath.Abs(d)
		if err != nil {
			continue
		}
		if p, err := filepath.EvalSymlinks(abs); err == nil {
			abs = p
		}
		out = append(out, filepath.Clean(abs))
	}
	return out
}

// enter moves the calling goroutine's thread into the view for good: it
// locks it and never unlocks it, so the thread ends with the goroutine.
// The main thread is refused (Go would park it, in the view, for good).
func (v *view) enter() error {
	goruntime.LockOSThread()
	if unix.Gettid() == unix.Getpid() {
		return fmt.Errorf("runsc view: not entered from the main thread: %w", errdefs.ErrInternal)
	}
	return v.enterLocked()
}

// enterLocked is enter on a thread already locked, not the main one.
func (v *view) enterLocked() error {
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("runsc view: unshare fs: %v: %w", err, errdefs.ErrInternal)
	}
	v.nsMu.RLock()
	defer v.nsMu.RUnlock()
	if v.ns == nil {
		return fmt.Errorf("runsc view: closed: %w", errdefs.ErrFailedPrecondition)
	}
	if err := unix.Setns(int(v.ns.Fd()), unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("runsc view: enter: %v: %w", err, errdefs.ErrInternal)
	}
	if unix.Chdir(v.cwd) != nil { // gone since: runsc's paths are absolute
		_ = unix.Chdir("/")
	}
	return nil
}

// do runs fn on a thread in the view (one that ends with fn), or on the
// caller's own locked thread without a view. fn's processes are forked
// from that thread and stay its children for Pdeathsig's sake until fn
// returns.
func (v *view) do(fn func() error) error {
	if v == nil || v.gone.Load() {
		goruntime.LockOSThread()
		defer goruntime.UnlockOSThread()
		return fn()
	}
	return v.within(fn)
}

// within runs fn on a thread in the view, never in the host's namespace:
// mounts made or removed there are the view's.
func (v *view) within(fn func() error) error {
	return ocicli.OnOtherThread(func() error {
		if err := v.enterLocked(); err != nil {
			return err
		}
		return fn()
	})
}

// close lets the view go once its last process has exited, and unmounts
// the host's boundaries with nothing left below them.
func (v *view) close() error {
	if v == nil || v.gone.Swap(true) {
		return nil
	}
	v.nsMu.Lock()
	defer v.nsMu.Unlock()
	err := v.ns.Close()
	v.ns = nil
	if v.follows {
		err = errors.Join(err, releaseBoundaries(v.hidden))
	}
	return err
}

// bundleMounts returns the host paths of bundle's own mounts (s is its
// spec) that runsc needs to see to start it: its rootfs and its network
// namespace, when each is a mount point.
func bundleMounts(bundle string, s *specs.Spec) []string {
	var paths []string
	if s.Root != nil && s.Root.Path != "" {
		p := s.Root.Path
		if !filepath.IsAbs(p) {
			p = filepath.Join(bundle, p)
		}
		paths = append(paths, p)
	}
	if s.Linux != nil {
		for _, ns := range s.Linux.Namespaces {
			if ns.Type == "network" && ns.Path != "" {
				paths = append(paths, ns.Path)
			}
		}
	}
	return paths
}

// attach makes the host's mounts on paths visible in the view at the same
// paths, for one command, and returns what detaches them again after it.
// A path that is no mount point on the host is left alone; one attached
// for another command already is shared with it.
func (v *view) attach(paths []string) (release func(), err error) {
	if v == nil || v.gone.Load() {
		return func() {}, nil
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	var trees []*os.File // clones of the host's mounts, detached
	var targets, held []string
	defer func() {
		for _, t := range trees {
			t.Close()
		}
	}()
	for _, p := range paths {
		abs, err := filepath.Abs(p)
		if err != nil {
			return nil, fmt.Errorf("runsc view: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		if slices.Contains(held, abs) {
			continue
		}
		if v.refs[abs] > 0 { // attached for another command: shared
			held = append(held, abs)
			continue
		}
		if !hostMount(abs) {
			continue // nothing to attach; nothing to detach after
		}
		held = append(held, abs)
		// On this goroutine's thread, which is the host's namespace's.
		fd, err := unix.OpenTree(unix.AT_FDCWD, abs, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
		if err != nil {
			return nil, fmt.Errorf("runsc view: clone the mount on %s: %v: %w", abs, err, errdefs.ErrInternal)
		}
		trees = append(trees, os.NewFile(uintptr(fd), abs))
		targets = append(targets, abs)
	}
	if len(trees) > 0 {
		err := v.within(func() error {
			for i, t := range trees {
				err := unix.MoveMount(int(t.Fd()), "", unix.AT_FDCWD, targets[i], unix.MOVE_MOUNT_F_EMPTY_PATH)
				if err == nil {
					// Out of the host mount's peer group: nothing done
					// to it in the view reaches the host, nor back.
					if err = unix.Mount("", targets[i], "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
						_ = unix.Unmount(targets[i], unix.MNT_DETACH)
					}
				}
				if err != nil {
					for _, done := range targets[:i] {
						_ = unix.Unmount(done, unix.MNT_DETACH)
					}
					return fmt.Errorf("runsc view: attach %s: %v: %w", targets[i], err, errdefs.ErrInternal)
				}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	for _, p := range held {
		v.refs[p]++
	}
	return func() { v.release(held) }, nil
}

// release drops one command's hold on paths and detaches those it held
// last.
func (v *view) release(paths []string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	var last []string
	for _, p := range paths {
		if v.refs[p]--; v.refs[p] <= 0 {
			delete(v.refs, p)
			last = append(last, p)
		}
	}
	if len(last) == 0 {
		return
	}
	_ = v.within(func() error {
		for _, p := range last { // each one attach put there
			_ = unix.Unmount(p, unix.MNT_DETACH)
		}
		return nil
	})
}

// hostMount reports whether path is a mount point in the calling thread's
// namespace (the host's, where attach calls it): a directory mounted on, or
// a file with a namespace bound on it.
func hostMount(path string) bool {
	var st unix.Statfs_t
	if unix.Statfs(path, &st) == nil && st.Type == unix.NSFS_MAGIC {
		return true
	}
	mp, err := mount.IsMountPoint(path)
	return err == nil && mp
}
