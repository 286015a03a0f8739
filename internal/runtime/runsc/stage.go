package runsc

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/mount"
)

// Staging runs runsc from a copy on huge pages.
//
// Every sandbox start, restore and wake execs runsc two or three times (the
// CLI, unless a standby serves it; the gofer, a re-exec of runsc; the
// Sentry, gvisor-bin/gvisor_sentry of a split build), and each exec maps a
// static binary of 50–100 MB whose pages the new process faults in one
// 4 KiB page table entry at a time. On hosts where page faults and page
// table updates are expensive (a VM with shadow or PVM paging) that is
// 30–40 ms per exec here, and about half of it goes when the binary sits
// on a tmpfs mounted with huge=always: its text is mapped 2 MiB at a time
// (ShmemPmdMapped in /proc/PID/smaps_rollup), `runsc --version` takes
// 18–22 ms instead of 35–39 (BenchmarkStagedExec). The file system the
// binary is installed on (ext4 here) keeps it in the page cache in small
// pages, and the host's shmem_enabled setting does not apply to a tmpfs
// mounted with its own huge= option.
//
// The copy is the daemon's: a tmpfs mounted on the stage directory,
// filled, sealed read-only, and detached by Close. Processes started from
// it (a running Sentry) keep their binary, and its memory, when it is
// detached. A daemon that crashed leaves the mount; the next New on the
// same directory takes it over if it holds the same files, and detaches it
// otherwise.

// stageFS names the stage's tmpfs in the host's mount table.
const stageFS = "forkbox-runsc"

// sidecarDir is where a split build of runsc keeps its Sentry and the
// Sentry's prewarmer, beside the runsc binary (scripts/gvisor/build-runsc.sh).
const sidecarDir = "gvisor-bin"

// hugePage is the size of a PMD mapping on x86-64 and arm64 (4 KiB pages).
const hugePage = 2 << 20

// staged is a stage made, or adopted, by stageBinaries.
type staged struct {
	dir    string // with its symlinks resolved, as the mount table names it
	binary string // the staged runsc
	// token is this stage's content of stageToken: the identity of the
	// files it copied (stageFiles), then a random line that tells it from
	// a later stage on the same directory (device numbers and mount IDs
	// of a detached mount are reused).
	token string
}

// stageToken is the file in a stage that names it.
const stageToken = ".forkbox-stage"

// stageBinaries copies the runsc binary bin, and the files of its sidecar
// directory if it has one, onto a tmpfs of huge pages mounted on dir, and
// returns the copy's runsc. A stage already on dir (a crashed daemon's) is
// taken over when it holds the same files (same identity of each source
// file), and detached otherwise. On failure nothing new stays mounted.
// One driver at a time may use a directory.
func stageBinaries(ctx context.Context, bin, dir string) (*staged, error) {
	if reason := hugeTmpfsRefused(); reason != "" {
		return nil, fmt.Errorf("runsc: staging on huge pages: %s: %w", reason, errdefs.ErrUnavailable)
	}
	real, err := filepath.EvalSymlinks(bin)
	if err != nil {
		return nil, fileErr("staging", bin, err)
	}
	files, size, ident, err := stageFiles(real)
	if err != nil {
		return nil, err
	}
	if dir, err = stageDir(dir); err != nil {
		return nil, err
	}
	s := &staged{dir: dir, binary: filepath.Join(dir, filepath.Base(real))}
	if tok, ok := s.current(); ok && strings.HasPrefix(tok, ident+"\n") {
		s.token = tok
		return s, nil
	}
	if err := detachStage(ctx, dir); err != nil {
		return nil, err
	}
	m := mount.Mount{Type: "tmpfs", Source: stageFS, Options: []string{"nosuid", "nodev", "noatime",
		"huge=always", "mode=0755", "size=" + strconv.FormatInt(size, 10)}}
	if err := mount.All(ctx, []mount.Mount{m}, dir); err != nil {
		return nil, fmt.Errorf("runsc: staging on huge pages: %w", err)
	}
	fail := func(err error) (*staged, error) {
		_ = mount.Unmount(ctx, dir)
		return nil, err
	}
	for rel, src := range files {
		if err := copyExecutable(src, filepath.Join(dir, rel)); err != nil {
			return fail(err)
		}
	}
	s.token = ident + "\n" + rand.Text()
	if err := os.WriteFile(filepath.Join(dir, stageToken), []byte(s.token), 0o444); err != nil {
		return fail(fileErr("writing", filepath.Join(dir, stageToken), err))
	}
	if err := mount.Remount(ctx, dir, []string{"ro", "nosuid", "nodev", "noatime"}); err != nil {
		return fail(fmt.Errorf("runsc: sealing the stage: %w", err))
	}
	return s, nil
}

// stageDir makes dir and returns its absolute path with symlinks resolved,
// as the mount table names the mounts on it.
func stageDir(dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fileErr("making", dir, err)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fileErr("resolving", dir, err)
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return "", fileErr("resolving", dir, err)
	}
	return real, nil
}

// current returns the token of the stage mounted on s.dir, if the
// topmost mount there is a stage.
func (s *staged) current() (string, bool) {
	top, err := topMount(s.dir)
	if err != nil || top == nil || top.FSType != "tmpfs" || top.Source != stageFS {
		return "", false
	}
	b, err := os.ReadFile(filepath.Join(s.dir, stageToken))
	return string(b), err == nil
}

// stageFiles lists what a stage of runsc holds, by path in the stage, the
// tmpfs size it needs (every file rounded up to huge pages, plus one), and
// the identity of the source files (path, device, inode, size, mtime),
// which tells a stage of these files from one of others.
func stageFiles(bin string) (files map[string]string, size int64, ident string, err error) {
	files = map[string]string{filepath.Base(bin): bin}
	side := filepath.Join(filepath.Dir(bin), sidecarDir)
	ents, err := os.ReadDir(side)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, 0, "", fileErr("staging", side, err)
	}
	for _, e := range ents {
		if e.Type().IsRegular() {
			files[filepath.Join(sidecarDir, e.Name())] = filepath.Join(side, e.Name())
		}
	}
	size = hugePage
	var lines []string
	for rel, src := range files {
		var st unix.Stat_t
		if err := unix.Stat(src, &st); err != nil {
			return nil, 0, "", fileErr("staging", src, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFREG {
			return nil, 0, "", fmt.Errorf("runsc: staging %s: not a regular file: %w", src, errdefs.ErrFailedPrecondition)
		}
		size += (st.Size + hugePage - 1) / hugePage * hugePage
		lines = append(lines, fmt.Sprintf("%s %s %d %d %d %d", rel, src, st.Dev, st.Ino, st.Size, st.Mtim.Nano()))
	}
	sort.Strings(lines)
	return files, size, strings.Join(lines, ";"), nil
}

// copyExecutable copies src to dst, a new file, read and execute only, and
// checks that it copied the whole of the file it opened.
func copyExecutable(src, dst string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fileErr("staging", filepath.Dir(dst), err)
	}
	in, err := os.Open(src)
	if err != nil {
		return fileErr("staging", src, err)
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return fileErr("staging", src, err)
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o555)
	if err != nil {
		return fileErr("staging", dst, err)
	}
	n, err := io.Copy(out, in)
	// Closed before anyone execs it: a file open for writing is ETXTBSY.
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fileErr("staging", src, err)
	}
	if n != fi.Size() {
		return fmt.Errorf("runsc: staging %s: copied %d bytes of %d (the file changed): %w", src, n, fi.Size(), errdefs.ErrUnavailable)
	}
	return nil
}

// fileErr classifies a file operation's error.
func fileErr(op, path string, err error) error {
	class := errdefs.ErrInternal
	switch {
	case errors.Is(err, os.ErrNotExist):
		class = errdefs.ErrNotFound
	case errors.Is(err, os.ErrPermission):
		class = errdefs.ErrPermissionDenied
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.ENOMEM):
		class = errdefs.ErrResourceExhausted
	}
	return fmt.Errorf("runsc: %s %s: %v: %w", op, path, err, class)
}

// topMount returns the topmost mount on dir (nil when none).
func topMount(dir string) (*mount.Info, error) {
	infos, err := mount.List()
	if err != nil {
		return nil, fmt.Errorf("runsc: stage: %v: %w", err, errdefs.ErrInternal)
	}
	var top *mount.Info
	for i := range infos {
		if infos[i].Mountpoint == dir {
			top = &infos[i]
		}
	}
	return top, nil
}

// detachStage detaches every stage mount on dir (a crashed daemon's, or
// several after repeated crashes) and nothing else: a mount there that is
// not a stage is an error.
func detachStage(ctx context.Context, dir string) error {
	for range 16 {
		top, err := topMount(dir)
		if err != nil {
			return err
		}
		if top == nil {
			return nil
		}
		if top.FSType != "tmpfs" || top.Source != stageFS {
			return fmt.Errorf("runsc: stage directory %s has a %s mount of %s on it, not a stage: %w", dir, top.FSType, top.Source, errdefs.ErrFailedPrecondition)
		}
		if err := mount.Unmount(ctx, dir); err != nil { // detached if busy
			return fmt.Errorf("runsc: removing the stage: %w", err)
		}
	}
	return fmt.Errorf("runsc: stage directory %s: mounts keep coming: %w", dir, errdefs.ErrInternal)
}

// unstage detaches s's mount if it is still the one on its directory.
// Running processes keep the binaries they were started from.
func (s *staged) unstage(ctx context.Context) error {
	if tok, ok := s.current(); !ok || tok != s.token {
		return nil // gone, or another stage replaced it
	}
	return detachStage(ctx, s.dir)
}

// hugeTmpfsRefused says why a tmpfs cannot have huge pages on this host
// ("" when it can): a kernel without transparent huge pages, or one whose
// shmem_enabled is deny (every tmpfs refused).
func hugeTmpfsRefused() string {
	b, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
	if err != nil {
		return "the kernel has no transparent huge pages"
	}
	if strings.Contains(string(b), "[deny]") {
		return "the host's shmem_enabled is deny"
	}
	return ""
}
