package ocicli

import (
	goruntime "runtime"

	"golang.org/x/sys/unix"
)

// OnOtherThread runs f in a fresh goroutine locked to an OS thread that is
// not the main thread, and lets that thread end with the goroutine (it is
// never unlocked): f may change the thread's kernel state (its namespaces,
// its fs) and nothing else will ever run on it. The drivers start runtime
// processes this way from a mount namespace that is not the daemon's.
func OnOtherThread(f func() error) error {
	errc := make(chan error, 1)
	go func() { errc <- LockedOffMain(f) }()
	return <-errc
}

// LockedOffMain locks the calling goroutine to its thread and runs f there,
// unless that thread is the main one: Go parks a main thread whose locked
// goroutine exits instead of ending it, so f's changes would outlive it
// (and the main thread is what /proc/self names). On the main thread it
// keeps the thread locked, which makes the scheduler put OnOtherThread's
// goroutine on another thread, and unlocks the untouched main thread when
// f is done. Off the main thread the caller's goroutine must exit after
// it, without unlocking.
func LockedOffMain(f func() error) error {
	goruntime.LockOSThread()
	if unix.Gettid() != unix.Getpid() {
		return f()
	}
	err := OnOtherThread(f)
	goruntime.UnlockOSThread()
	return err
}
