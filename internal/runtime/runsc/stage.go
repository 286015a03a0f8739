package runsc

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
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
// 30–35 ms per exec here, and most of it goes when the binary sits on a
// tmpfs mounted with huge=always: its text is mapped 2 MiB at a time
// (ShmemPmdMapped in /proc/PID/smaps_rollup), `runsc --version` takes
// 25 ms instead of 35 and `gvisor_sentry --help` 20 instead of 31 (half the
// CPU). The file system the binary is installed on (ext4 here) keeps it in
// the page cache in small pages, and the host's shmem_enabled setting does
// not apply to a tmpfs mounted with its own huge= option.
//
// The copy is the daemon's: a tmpfs mounted on the stage directory,
// filled, sealed read-only, and detached by Close. Processes started from
// it (a running Sentry) keep their binary when it is detached. A daemon
// that crashed leaves the mount; the next New on the same directory
// detaches it first.

// stageFS names the stage's tmpfs in the host's mount table.
const stageFS = "forkbox-runsc"

// sidecarDir is where a split build of runsc keeps its Sentry and the
// Sentry's prewarmer, beside the runsc binary (scripts/gvisor/build-runsc.sh).
const sidecarDir = "gvisor-bin"

// hugePage is the size of a PMD mapping on x86-64 and arm64 (4 KiB pages).
const hugePage = 2 << 20

// staged is a stage made by stageBinaries.
type staged struct {
	dir    string
	binary string // the staged runsc
	// token is this stage's content of stageToken, which tells it from a
	// later stage on the same directory (device numbers and mount IDs of
	// a detached mount are reused).
	token string
}

// stageToken is the file in a stage that names it.
const stageToken = ".forkbox-stage"

// stageBinaries copies the runsc binary bin, and the files of its sidecar
// directory if it has one, onto a tmpfs of huge pages mounted on dir, and
// returns the copy's runsc. A mount already on dir (a crashed daemon's) is
// detached first. On failure nothing stays mounted.
func stageBinaries(ctx context.Context, bin, dir string) (*staged, error) {
	if reason := hugeTmpfsRefused(); reason != "" {
		return nil, fmt.Errorf("runsc: staging on huge pages: %s: %w", reason, errdefs.ErrUnavailable)
	}
	real, err := filepath.EvalSymlinks(bin)
	if err != nil {
		return nil, fmt.Errorf("runsc: staging %s: %w", bin, errdefs.ErrNotFound)
	}
	files, size, err := stageFiles(real)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("runsc: stage directory: %v: %w", err, errdefs.ErrInternal)
	}
	if err := detachStage(ctx, dir); err != nil {
		return nil, err
	}
	m := mount.Mount{Type: "tmpfs", Source: stageFS, Options: []string{"nosuid", "nodev", "noatime",
		"huge=always", "mode=0755", "size=" + strconv.FormatInt(size, 10)}}
	if err := mount.All(ctx, []mount.Mount{m}, dir); err != nil {
		return nil, fmt.Errorf("runsc: staging on huge pages: %w", err)
	}
	for rel, src := range files {
		if err := copyExecutable(src, filepath.Join(dir, rel)); err != nil {
			_ = mount.Unmount(ctx, dir)
			return nil, err
		}
	}
	token := rand.Text()
	if err := os.WriteFile(filepath.Join(dir, stageToken), []byte(token), 0o444); err != nil {
		_ = mount.Unmount(ctx, dir)
		return nil, fmt.Errorf("runsc: stage: %v: %w", err, errdefs.ErrInternal)
	}
	if err := mount.Remount(ctx, dir, []string{"ro", "nosuid", "nodev", "noatime"}); err != nil {
		_ = mount.Unmount(ctx, dir)
		return nil, fmt.Errorf("runsc: sealing the stage: %w", err)
	}
	return &staged{dir: dir, binary: filepath.Join(dir, filepath.Base(real)), token: token}, nil
}

// stageFiles lists what a stage of runsc holds, by path in the stage, and
// the tmpfs size it needs: every file rounded up to huge pages, plus one.
func stageFiles(bin string) (map[string]string, int64, error) {
	files := map[string]string{filepath.Base(bin): bin}
	side := filepath.Join(filepath.Dir(bin), sidecarDir)
	ents, err := os.ReadDir(side)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, 0, fmt.Errorf("runsc: staging %s: %v: %w", side, err, errdefs.ErrInternal)
	}
	for _, e := range ents {
		if e.Type().IsRegular() {
			files[filepath.Join(sidecarDir, e.Name())] = filepath.Join(side, e.Name())
		}
	}
	size := int64(hugePage)
	for _, src := range files {
		fi, err := os.Stat(src)
		if err != nil {
			return nil, 0, fmt.Errorf("runsc: staging %s: %v: %w", src, err, errdefs.ErrNotFound)
		}
		if !fi.Mode().IsRegular() {
			return nil, 0, fmt.Errorf("runsc: staging %s: not a regular file: %w", src, errdefs.ErrFailedPrecondition)
		}
		size += (fi.Size() + hugePage - 1) / hugePage * hugePage
	}
	return files, size, nil
}

// copyExecutable copies src to dst, a new file, read and execute only.
func copyExecutable(src, dst string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("runsc: stage: %v: %w", err, errdefs.ErrInternal)
	}
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("runsc: staging %s: %v: %w", src, err, errdefs.ErrNotFound)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o555)
	if err != nil {
		return fmt.Errorf("runsc: stage: %v: %w", err, errdefs.ErrInternal)
	}
	_, err = io.Copy(out, in)
	// Closed before anyone execs it: a file open for writing is ETXTBSY.
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.ENOMEM) {
			return fmt.Errorf("runsc: staging %s: %v: %w", src, err, errdefs.ErrResourceExhausted)
		}
		return fmt.Errorf("runsc: staging %s: %v: %w", src, err, errdefs.ErrInternal)
	}
	return nil
}

// detachStage detaches every stage mount on dir (a crashed daemon's, or
// several after repeated crashes) and nothing else: a mount there that is
// not a stage is an error.
func detachStage(ctx context.Context, dir string) error {
	for range 16 {
		infos, err := mount.List()
		if err != nil {
			return fmt.Errorf("runsc: stage: %v: %w", err, errdefs.ErrInternal)
		}
		top := -1
		for i, in := range infos {
			if in.Mountpoint == dir {
				top = i
			}
		}
		if top < 0 {
			return nil
		}
		if in := infos[top]; in.FSType != "tmpfs" || in.Source != stageFS {
			return fmt.Errorf("runsc: stage directory %s has a %s mount of %s on it, not a stage: %w", dir, in.FSType, in.Source, errdefs.ErrFailedPrecondition)
		}
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("runsc: detaching the stage on %s: %v: %w", dir, err, errdefs.ErrInternal)
		}
	}
	return fmt.Errorf("runsc: stage directory %s: mounts keep coming: %w", dir, errdefs.ErrInternal)
}

// unstage detaches s's mount if it is still the one on its directory.
// Running processes keep the binaries they were started from.
func (s *staged) unstage(ctx context.Context) error {
	if b, err := os.ReadFile(filepath.Join(s.dir, stageToken)); err != nil || string(b) != s.token {
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
