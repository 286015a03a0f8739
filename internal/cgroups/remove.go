package cgroups

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
)

// Removing a sandbox's cgroups. The runtimes make them (runsc and crun
// write their own cgroup files); what the daemon does is clean up after
// them: kill what is left in a sandbox's cgroup and remove its directories
// in every hierarchy, whichever of v1 (one hierarchy per controller, named
// hierarchies such as name=systemd), hybrid (v1 plus an empty unified
// hierarchy) or v2 the host mounts.
//
// containerd/cgroups v3 was considered: its cgroup1 package manages only
// the v1 controllers it knows (not the hybrid unified hierarchy), its
// Delete refuses a cgroup that still holds processes rather than killing
// them, and its cgroup2 manager assumes the unified hierarchy at Root. A
// sandbox cgroup on a hybrid host lives in all of them, so this small walk
// over the mounted hierarchies is kept.

// removeTimeout bounds how long Remove waits for a cgroup's processes to
// die (a task in uninterruptible sleep can take a while; one that never
// wakes must not hang a teardown).
const removeTimeout = 10 * time.Second

// Roots returns the mounted hierarchies: each directory below Root (v1
// controllers, named and hybrid unified hierarchies) and Root itself (v2).
// A symlinked alias (cpu -> cpu,cpuacct) is listed once.
func Roots() []string {
	dirs, _ := filepath.Glob(filepath.Join(Root, "*"))
	dirs = append(dirs, Root)
	var out []string
	seen := map[string]bool{}
	for _, d := range dirs {
		real, err := filepath.EvalSymlinks(d)
		if err != nil {
			continue
		}
		if st, err := os.Stat(real); err != nil || !st.IsDir() || seen[real] {
			continue
		}
		seen[real] = true
		out = append(out, d)
	}
	return out
}

// Children returns the names of the cgroups directly below path (relative
// to the hierarchy roots, e.g. "/forkbox") in any hierarchy, sorted.
func Children(path string) []string {
	seen := map[string]bool{}
	for _, root := range Roots() {
		ents, _ := os.ReadDir(filepath.Join(root, path))
		for _, e := range ents {
			if e.IsDir() {
				seen[e.Name()] = true
			}
		}
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// Remove removes the cgroup at path (relative to the hierarchy roots, e.g.
// "/forkbox/sb-1") and the cgroups below it from every hierarchy. A frozen
// cgroup is thawed first (frozen tasks ignore SIGKILL on v1), and processes
// still in it are killed: they belong to a sandbox being closed. A cgroup
// that does not exist is not an error.
func Remove(ctx context.Context, path string) error {
	if path = filepath.Clean("/" + path); path == "/" {
		return fmt.Errorf("cgroups: refusing to remove a hierarchy root: %w", errdefs.ErrInvalidArgument)
	}
	ctx, cancel := context.WithTimeout(ctx, removeTimeout)
	defer cancel()
	_ = Thaw(ctx, path)
	var errs []error
	for _, root := range Roots() {
		dir := filepath.Join(root, path)
		if _, err := os.Lstat(dir); err != nil {
			continue
		}
		if err := removeDir(ctx, dir); err != nil {
			errs = append(errs, fmt.Errorf("cgroup %s: %w", dir, err))
		}
	}
	return errors.Join(errs...)
}

// removeDir kills the processes in dir's tree and removes it, deepest
// directories first. A cgroup directory is removed with rmdir even though
// it lists files: they are the kernel's.
func removeDir(ctx context.Context, dir string) error {
	var dirs []string
	err := filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return err
		}
		if e.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		for attempt := 0; ; attempt++ {
			if err := Kill(ctx, dirs[i]); err != nil {
				return err
			}
			err := unix.Rmdir(dirs[i])
			if err == nil || errors.Is(err, unix.ENOENT) {
				break
			}
			// EBUSY: a process joined between the kill and the rmdir.
			if !errors.Is(err, unix.EBUSY) || attempt == 3 {
				return fmt.Errorf("remove %s: %w", dirs[i], err)
			}
		}
	}
	return nil
}

// Kill SIGKILLs every process in the cgroup directory dir (its
// cgroup.procs; not its sub-cgroups) and waits until each has exited. It
// repeats until the cgroup lists no process it has not already seen exit,
// so processes forked meanwhile die too. The wait is on the processes
// themselves (a pidfd becomes readable when its process exits), never a
// sleep; ctx bounds it.
func Kill(ctx context.Context, dir string) error {
	exited := map[int]bool{}
	for {
		pids, err := readProcs(filepath.Join(dir, "cgroup.procs"))
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		var fds []int
		for _, pid := range pids {
			if exited[pid] {
				continue
			}
			if pid <= 1 || pid == os.Getpid() {
				closeAll(fds)
				return fmt.Errorf("cgroup %s holds pid %d (init or this daemon); not killing it: %w", dir, pid, errdefs.ErrFailedPrecondition)
			}
			fd, err := unix.PidfdOpen(pid, 0)
			if err != nil {
				exited[pid] = true // ESRCH: gone already
				continue
			}
			if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
				unix.Close(fd)
				closeAll(fds)
				return fmt.Errorf("kill %d: %w", pid, err)
			}
			fds = append(fds, fd)
			exited[pid] = true // once the wait below returns
		}
		if len(fds) == 0 {
			return nil
		}
		err = waitExit(ctx, fds)
		closeAll(fds)
		if err != nil {
			return fmt.Errorf("cgroup %s: processes did not exit after SIGKILL: %w", dir, err)
		}
	}
}

// waitExit waits until every pidfd in fds is readable (its process
// exited). It looks at ctx between polls of at most 100 ms.
func waitExit(ctx context.Context, fds []int) error {
	pending := make([]unix.PollFd, len(fds))
	for i, fd := range fds {
		pending[i] = unix.PollFd{Fd: int32(fd), Events: unix.POLLIN}
	}
	for len(pending) > 0 {
		if err := ctx.Err(); err != nil {
			return errors.Join(err, errdefs.ErrUnavailable)
		}
		wait := 100 * time.Millisecond
		if dl, ok := ctx.Deadline(); ok {
			wait = min(wait, max(time.Until(dl), time.Millisecond))
		}
		n, err := unix.Poll(pending, int(wait.Milliseconds()))
		if errors.Is(err, unix.EINTR) || n == 0 {
			continue
		}
		if err != nil {
			return fmt.Errorf("poll pidfds: %w", err)
		}
		rest := pending[:0]
		for _, p := range pending {
			if p.Revents == 0 {
				rest = append(rest, unix.PollFd{Fd: p.Fd, Events: unix.POLLIN})
			}
		}
		pending = rest
	}
	return nil
}

func readProcs(file string) ([]int, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
