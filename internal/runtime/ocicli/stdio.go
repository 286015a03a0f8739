// The prologue and epilogue of a detached create (run, restore): checks on
// the id and bundle, the container's stdio, and cleanup after a failure.

package ocicli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/runtime"
)

// CheckNew checks what a create call needs before it starts the tool: a
// valid id (InvalidArgument), an absolute bundle (InvalidArgument) holding
// config.json (NotFound), and an id the runtime does not know yet
// (AlreadyExists; any error of state but NotFound is returned as is).
func CheckNew(ctx context.Context, state func(context.Context, string) (runtime.State, error), runtimeName, verb, id, bundle string) error {
	if err := ValidID(runtimeName, id); err != nil {
		return err
	}
	if !filepath.IsAbs(bundle) {
		return fmt.Errorf("%s %s %s: bundle %q must be absolute: %w", runtimeName, verb, id, bundle, errdefs.ErrInvalidArgument)
	}
	if _, err := os.Stat(filepath.Join(bundle, "config.json")); err != nil {
		return fmt.Errorf("%s %s %s: bundle %s: %v: %w", runtimeName, verb, id, bundle, err, errdefs.ErrNotFound)
	}
	if _, err := state(ctx, id); err == nil {
		return fmt.Errorf("%s %s %s: container exists: %w", runtimeName, verb, id, errdefs.ErrAlreadyExists)
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		return err
	}
	return nil
}

// Stdio is a container's stdio for a detached create: stdout and stderr
// appended to bundle/stdio.log, stdin from /dev/null. No pipe is handed to
// the tool, so nothing blocks once the tool exits.
type Stdio struct {
	Log     *os.File
	LogPath string
	Start   int64 // size of the log before this create: its output starts here
	Null    *os.File
}

// OpenStdio opens bundle's stdio log (created if missing) and /dev/null.
// Errors are Internal. The caller closes the Stdio.
func OpenStdio(bundle string) (*Stdio, error) {
	s := &Stdio{LogPath: filepath.Join(bundle, runtime.LogFileName)}
	var err error
	s.Log, err = os.OpenFile(s.LogPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open log: %v: %w", err, errdefs.ErrInternal)
	}
	s.Start, _ = s.Log.Seek(0, io.SeekEnd)
	s.Null, err = os.Open(os.DevNull)
	if err != nil {
		s.Log.Close()
		return nil, fmt.Errorf("%v: %w", err, errdefs.ErrInternal)
	}
	return s, nil
}

// Close closes both files.
func (s *Stdio) Close() error {
	return errors.Join(s.Log.Close(), s.Null.Close())
}

// ReadFrom returns what was appended to path after offset (at most 4 KiB
// from the end; "" if path is missing or shorter than off).
func ReadFrom(path string, off int64) string { return readTail(path, off, 4096) }

// Tail returns the last n bytes of the file at path ("" if it cannot be
// read), reading no more: the file may be whatever a sandbox wrote.
func Tail(path string, n int64) string { return readTail(path, 0, n) }

// readTail returns what path holds after off, its last n bytes at most.
func readTail(path string, off, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || fi.Size() < off {
		return ""
	}
	off = max(off, fi.Size()-n)
	b := make([]byte, fi.Size()-off)
	m, _ := f.ReadAt(b, off)
	return string(b[:m])
}

// CleanupFailed force-deletes container id after a failed create, with a
// fresh context (the caller's may be the reason the create failed), and
// logs a failure of the delete.
func CleanupFailed(ctx context.Context, log *slog.Logger, del func(context.Context, string, bool) error, verb, id string) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := del(cctx, id, true); err != nil {
		log.Warn("cleanup after failed "+verb, "sandbox", id, "err", err)
	}
}
