package runsc

// A held checkpoint: `runsc checkpoint --leave-running --hold-fd 3`, a flag
// of forkbox's runsc build (scripts/gvisor/checkpoint-hold.patch). The one
// command pauses the sandbox, saves it and keeps it paused until told, so
// the caller snapshots the filesystem in between; it then resumes it. A
// `runsc pause` before a live checkpoint and a `runsc resume` after it each
// cost a runsc start (about 12 ms) while the sandbox stood still, and the
// checkpoint command's own start fell in that time too. Here the sandbox
// runs while the command starts, and stands still only from its pause call
// to its resume call.
//
// The command and forkbox talk over a socket pair at the command's fd 3:
// it writes 'a' when it is about to pause the sandbox, 'p' once paused and
// 's' once saved, waits for a byte (or the end of the stream: a daemon that
// died lets it go), resumes the sandbox and writes 'r', or 'T' when its
// --hold-timeout let it go first. Its pause and resume are runsc pause's
// and resume's, state file included: a command killed while it holds the
// sandbox leaves one that runsc says is paused, which runsc resume (and
// the daemon's reconcile) take. A command that ends or is stuck after 'a'
// without 'r' may leave the sandbox paused: the caller learns so
// (Hold.Paused without Hold.Resumed).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/runtime"
)

var _ runtime.HeldCheckpointer = (*Runsc)(nil)

// holdTimeout bounds how long the command holds a sandbox paused after its
// save when forkbox does not say (a daemon that hangs). What forkbox does
// in that time (a ledger read and a snapshot) takes milliseconds.
const holdTimeout = 10 * time.Minute

// holdSupport caches whether a runsc binary has --hold-fd.
var holdSupport sync.Map // binary path -> bool

// canHold reports whether this runsc has --hold-fd (asked once per binary:
// `runsc help checkpoint` lists its flags).
func (r *Runsc) canHold(ctx context.Context) bool {
	bin := r.binary()
	if v, ok := holdSupport.Load(bin); ok {
		return v.(bool)
	}
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, "help", "checkpoint")
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		return false // not run at all: asked again next time
	}
	// help's exit status varies between builds; its text says.
	ok := strings.Contains(out.String(), "-hold-fd")
	holdSupport.Store(bin, ok)
	return ok
}

// CheckpointHeld implements runtime.HeldCheckpointer. id must be running;
// imageDir is as for Checkpoint. held runs while the sandbox stands still
// after its save; its error is returned (the sandbox is resumed whatever
// it returns). A runsc without --hold-fd is ErrNotImplemented, with nothing
// done.
func (r *Runsc) CheckpointHeld(ctx context.Context, id, imageDir string, held func(paused time.Time) error) (runtime.Hold, error) {
	if err := checkCheckpoint(id, imageDir); err != nil {
		return runtime.Hold{}, err
	}
	if !r.canHold(ctx) {
		return runtime.Hold{}, fmt.Errorf("runsc checkpoint %s: %s has no --hold-fd (not built by scripts/gvisor/build-runsc.sh): %w", id, r.binary(), errdefs.ErrNotImplemented)
	}
	if err := makeImageDir(id, imageDir); err != nil {
		return runtime.Hold{}, err
	}
	h, err := r.hold(ctx, id, imageDir, held)
	if err != nil && !h.Saved {
		os.RemoveAll(imageDir)
	}
	return h, err
}

// holdStep bounds each step of the command that is not the save itself:
// its start until it is about to pause the sandbox, the pause, and the
// resume (the daemon gave `runsc pause` and `runsc resume` as long). A
// variable: tests shorten it.
var holdStep = 30 * time.Second

// hold runs the held checkpoint command and follows it.
func (r *Runsc) hold(ctx context.Context, id, imageDir string, held func(paused time.Time) error) (runtime.Hold, error) {
	var h runtime.Hold
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err == nil {
		err = unix.SetNonblock(fds[0], true) // ours: read with deadlines
	}
	if err != nil {
		return h, fmt.Errorf("runsc checkpoint %s: socket pair: %v: %w", id, err, errdefs.ErrInternal)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "hold"), os.NewFile(uintptr(fds[1]), "hold-runsc")
	defer ours.Close()
	args := append(r.globalArgs(r.RootOf(id), id), "checkpoint", "--image-path", imageDir, "--leave-running",
		"--hold-fd", "3", "--hold-timeout", holdTimeout.String(), id)
	// Not tied to ctx: a caller that goes away must not stop the sandbox
	// for good. Its steps are bounded below and its hold by --hold-timeout.
	bin := r.binary()
	cmd := exec.Command(bin, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.ExtraFiles = []*os.File{theirs}
	cmd.WaitDelay = 5 * time.Second
	err = r.view.do(cmd.Start)
	theirs.Close()
	if err != nil {
		return h, fmt.Errorf("runsc checkpoint %s: %v: %w", id, err, errdefs.ErrInternal)
	}
	// next reads the command's next byte, within d (0: no bound).
	next := func(d time.Duration) (byte, error) {
		var deadline time.Time
		if d > 0 {
			deadline = time.Now().Add(d)
		}
		if err := ours.SetReadDeadline(deadline); err != nil {
			return 0, err
		}
		var b [1]byte
		_, err := io.ReadFull(ours, b[:])
		return b[0], err
	}
	// failed is the command's error once it has exited (or been killed,
	// when it did not get through step in time) without saying it did.
	failed := func(step string, err error) error {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return fmt.Errorf("runsc checkpoint %s: did not %s within %s: %w", id, step, holdStep, errdefs.ErrDeadlineExceeded)
		}
		if werr := cmd.Wait(); werr != nil {
			return r.wrap(ctx, "checkpoint", id, werr, stderr.String())
		}
		return fmt.Errorf("runsc checkpoint %s: exited without saying it did %s: %w", id, step, errdefs.ErrInternal)
	}
	if b, err := next(holdStep); b != 'a' {
		err = failed("start", err)
		if strings.Contains(stderr.String(), "flag provided but not defined") {
			// The binary was replaced by one without --hold-fd.
			holdSupport.Delete(bin)
			err = fmt.Errorf("%w: %w", err, errdefs.ErrNotImplemented)
		}
		return h, err // nothing was paused
	}
	h.Paused = true // from here on it may stand still
	if b, err := next(holdStep); b != 'p' {
		return h, failed("pause the sandbox", err)
	}
	paused := time.Now()
	b, err := next(0) // the save: as long as it takes, as before
	switch b {
	case 's':
	case 'r': // the save failed; the sandbox runs again
		h.Stood, h.Resumed = time.Since(paused), true
		return h, failed("save it", err)
	default:
		h.Stood = time.Since(paused)
		return h, failed("save it", err)
	}
	h.Saved, h.Save = true, time.Since(paused)
	herr := imageSaved(id, imageDir)
	if herr == nil {
		herr = held(paused)
	}
	_, _ = ours.Write([]byte{'g'})
	last, err := next(holdStep)
	h.Stood = time.Since(paused)
	switch last {
	case 'r':
		h.Resumed = true
		err = cmd.Wait() // it exits 0 once it has resumed, after a saved image
		if err != nil {
			err = r.wrap(ctx, "checkpoint", id, err, stderr.String())
		}
	case 'T':
		h.Resumed = true
		_ = cmd.Wait()
		// The sandbox ran before held was done: what held captured may not
		// match the image.
		err = fmt.Errorf("runsc checkpoint %s: resumed after its hold timeout (%s), before forkbox was done: %w", id, holdTimeout, errdefs.ErrInternal)
	default:
		err = failed("resume the sandbox", err)
	}
	return h, errors.Join(herr, err)
}
