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
// it once, private (the host's mounts made later do not propagate into it),
// with every mount below the hidden directories (the sandboxes' rootfs
// mounts and netns files) detached. Before a command that starts a
// sandbox's processes (run, create, restore) the driver attaches that
// sandbox's own rootfs and netns mounts (a clone of the host's, open_tree
// and move_mount) at the same paths, and detaches them when the command
// has returned: the processes runsc started hold copies of their own. So
// the view holds the host's base mounts plus those of the starts under way.
//
// A thread enters the view (unshare CLONE_FS, setns) and never leaves it:
// its goroutine keeps it locked and it ends with the goroutine, so no other
// goroutine ever runs on a thread in the view, and the daemon's own mounts
// still go to the host's namespace.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/mount"
	"github.com/forkbox/forkbox/internal/runtime/spec"
)

// view is the mount namespace runsc runs in.
type view struct {
	ns  *os.File // its /proc/thread-self/ns/mnt
	cwd string   // the process's working directory, entered with it

	mu   sync.Mutex
	refs map[string]int // attached path → commands that need it

	gone atomic.Bool // closed: commands run in the host's namespace
}

// newView makes the view: a private copy of the caller's mount namespace
// without the mounts below the directories in hide.
func newView(hide []string) (*view, error) {
	cwd, err := os.Getwd()
	if err != nil {
		return nil, fmt.Errorf("runsc view: %v: %w", err, errdefs.ErrInternal)
	}
	type result struct {
		ns  *os.File
		err error
	}
	done := make(chan result, 1)
	go func() {
		// Never unlocked: the thread ends with this goroutine.
		goruntime.LockOSThread()
		ns, err := makeView(hide)
		done <- result{ns, err}
	}()
	r := <-done
	if r.err != nil {
		return nil, r.err
	}
	return &view{ns: r.ns, cwd: cwd, refs: map[string]int{}}, nil
}

// makeView unshares the calling (locked, doomed) thread's mount namespace
// and makes it the view; it returns a handle on it.
func makeView(hide []string) (*os.File, error) {
	if err := unix.Unshare(unix.CLONE_FS | unix.CLONE_NEWNS); err != nil {
		return nil, fmt.Errorf("runsc view: unshare: %v: %w", err, errdefs.ErrUnavailable)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return nil, fmt.Errorf("runsc view: make private: %v: %w", err, errdefs.ErrInternal)
	}
	for _, dir := range hide {
		if dir == "" {
			continue
		}
		under, err := mount.Under(dir)
		if err != nil {
			return nil, fmt.Errorf("runsc view: %v: %w", err, errdefs.ErrInternal)
		}
		clean := filepath.Clean(dir)
		if p, err := filepath.EvalSymlinks(clean); err == nil {
			clean = p
		}
		for _, m := range under { // deepest first
			if m == clean {
				continue // the directory's own mount stays: paths below it must resolve
			}
			if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				return nil, fmt.Errorf("runsc view: detach %s: %v: %w", m, err, errdefs.ErrInternal)
			}
		}
	}
	ns, err := os.Open("/proc/thread-self/ns/mnt")
	if err != nil {
		return nil, fmt.Errorf("runsc view: %v: %w", err, errdefs.ErrInternal)
	}
	return ns, nil
}

// enter moves the calling goroutine's thread into the view for good: it
// locks it and never unlocks it, so the thread ends with the goroutine.
func (v *view) enter() error {
	goruntime.LockOSThread()
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("runsc view: unshare fs: %v: %w", err, errdefs.ErrInternal)
	}
	if err := unix.Setns(int(v.ns.Fd()), unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("runsc view: enter: %v: %w", err, errdefs.ErrInternal)
	}
	if err := unix.Chdir(v.cwd); err != nil {
		return fmt.Errorf("runsc view: chdir %s: %v: %w", v.cwd, err, errdefs.ErrInternal)
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
	if v.gone.Load() {
		return fmt.Errorf("runsc view: closed: %w", errdefs.ErrFailedPrecondition)
	}
	errc := make(chan error, 1)
	go func() {
		if err := v.enter(); err != nil {
			errc <- err
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// close lets the view go once its last process has exited.
func (v *view) close() error {
	if v == nil || v.gone.Swap(true) {
		return nil
	}
	return v.ns.Close()
}

// bundleMounts returns the host paths of bundle's own mounts that runsc
// needs to see to start it: its rootfs and its network namespace, when
// each is a mount point.
func bundleMounts(bundle string) ([]string, error) {
	s, err := spec.ReadBundle(bundle)
	if err != nil {
		return nil, err
	}
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
	return paths, nil
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
		held = append(held, abs)
		if v.refs[abs] > 0 {
			continue
		}
		if !hostMount(abs) {
			continue
		}
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
				if err := unix.MoveMount(int(t.Fd()), "", unix.AT_FDCWD, targets[i], unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
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
		for _, p := range last {
			// Only what attach put there: a path it left alone is no
			// mount point in the view (its mounts were detached at New).
			if viewMount(p) {
				_ = unix.Unmount(p, unix.MNT_DETACH)
			}
		}
		return nil
	})
}

// hostMount reports whether path is a mount point (in the calling thread's
// namespace): a directory mounted on, or a file with a namespace bound on it.
func hostMount(path string) bool {
	var st unix.Statfs_t
	if unix.Statfs(path, &st) == nil && st.Type == unix.NSFS_MAGIC {
		return true
	}
	mp, err := mount.IsMountPoint(path)
	return err == nil && mp
}

// viewMount is hostMount in the view, for a path attach may have attached.
func viewMount(path string) bool { return hostMount(path) }
