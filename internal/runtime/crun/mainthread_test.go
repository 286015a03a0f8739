package crun

import (
	"os"
	goruntime "runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// The main goroutine stays on the main thread (locked during init), and
// TestMain runs there, serving onMain: tests can run code on the main
// thread, the one a stray namespace would be stuck on for good.
func init() { goruntime.LockOSThread() }

var mainThread = make(chan func())

func TestMain(m *testing.M) {
	code := make(chan int, 1)
	go func() { code <- m.Run() }()
	for {
		select {
		case f := <-mainThread:
			f()
		case c := <-code:
			os.Exit(c)
		}
	}
}

// onMain runs f on the process's main thread.
func onMain(f func()) {
	done := make(chan struct{})
	mainThread <- func() { f(); close(done) }
	<-done
}

func mountNS(t *testing.T, path string) string {
	t.Helper()
	ns, err := os.Readlink(path)
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

// Called on the main thread, lockedOffMain runs f (which unshares a mount
// namespace, as crun's start does) on another thread, and the main thread,
// which /proc/self names, stays in the host's mount namespace.
func TestLockedOffMainSparesTheMainThread(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("unshare needs root")
		}
		t.Skip("unshare needs root")
	}
	host := mountNS(t, "/proc/thread-self/ns/mnt")
	var onMainTid, fTid int
	var err error
	onMain(func() {
		onMainTid = unix.Gettid()
		err = lockedOffMain(func() error {
			fTid = unix.Gettid()
			return unix.Unshare(unix.CLONE_NEWNS)
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	if pid := os.Getpid(); onMainTid != pid {
		t.Fatalf("onMain ran on thread %d, want the main thread %d (the test cannot show anything)", onMainTid, pid)
	}
	if fTid == os.Getpid() {
		t.Errorf("f ran on the main thread %d, want another thread", fTid)
	}
	if got := mountNS(t, "/proc/self/ns/mnt"); got != host {
		t.Errorf("main thread's mount namespace: got %s, want the host's %s", got, host)
	}
	// The main thread was given back: it still serves onMain.
	onMain(func() { onMainTid = unix.Gettid() })
	if onMainTid != os.Getpid() {
		t.Errorf("after lockedOffMain, onMain ran on thread %d, want %d", onMainTid, os.Getpid())
	}
}

// Many concurrent starts: none runs on the main thread, and none leaves a
// thread other than its own in a private namespace.
func TestOnOtherThreadConcurrent(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("unshare needs root")
		}
		t.Skip("unshare needs root")
	}
	host := mountNS(t, "/proc/thread-self/ns/mnt")
	const n = 32
	tids := make(chan int, n)
	errs := make(chan error, n)
	for range n {
		go func() {
			errs <- onOtherThread(func() error {
				tids <- unix.Gettid()
				return unix.Unshare(unix.CLONE_NEWNS)
			})
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
		if tid := <-tids; tid == os.Getpid() {
			t.Errorf("f ran on the main thread %d", tid)
		}
	}
	if got := mountNS(t, "/proc/thread-self/ns/mnt"); got != host {
		t.Errorf("an unlocked goroutine's mount namespace: got %s, want the host's %s", got, host)
	}
	if got := mountNS(t, "/proc/self/ns/mnt"); got != host {
		t.Errorf("main thread's mount namespace: got %s, want the host's %s", got, host)
	}
}
