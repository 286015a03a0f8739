package mount

import (
	"context"
	"os"
	"runtime"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// The main goroutine stays on the main thread (locked during init), and
// TestMain runs there, serving onMain: a test can put the main thread, the
// one /proc/self names, in a mount namespace of its own.
func init() { runtime.LockOSThread() }

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

// mountpoints returns the mount points of a mountinfo file.
func mountpoints(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	infos, err := parseMountinfo(b)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, in := range infos {
		out = append(out, in.Mountpoint)
	}
	return out
}

// List is the mount table the caller's mounts and unmounts act on, even
// when the main thread is in a private copy of it (as it was when crun's
// driver unshared a namespace there): that copy keeps every mount that
// existed when it was made, /proc/self/mountinfo reads it, and storage,
// told by it that an unmounted rootfs was still mounted, refused to remove
// the writable layer below.
func TestListIgnoresTheMainThreadsNamespace(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	target := t.TempDir()
	if err := All(ctx, []Mount{{Type: "tmpfs", Source: "tmpfs"}}, target); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Unmount(ctx, target) })

	var err error
	onMain(func() {
		var host int
		if host, err = unix.Open("/proc/thread-self/ns/mnt", unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
			return
		}
		if err = unix.Unshare(unix.CLONE_NEWNS); err != nil {
			unix.Close(host)
			return
		}
		err = unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, "")
		t.Cleanup(func() {
			onMain(func() {
				if err := unix.Setns(host, unix.CLONE_NEWNS); err != nil {
					t.Errorf("main thread back to the host's mount namespace: %v", err)
				}
				unix.Close(host)
			})
		})
	})
	if err != nil {
		t.Fatalf("main thread in a private mount namespace: %v", err)
	}

	if err := Unmount(ctx, target); err != nil {
		t.Fatal(err)
	}
	if mps := mountpoints(t, "/proc/self/mountinfo"); !slices.Contains(mps, target) {
		t.Fatalf("/proc/self/mountinfo does not list %s; want the main thread's stale copy (the test shows nothing otherwise)", target)
	}
	infos, err := List()
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range infos {
		if in.Mountpoint == target {
			t.Errorf("List after the unmount: %s listed, want gone", target)
		}
	}
	if under, err := Under(target); err != nil || len(under) != 0 {
		t.Errorf("Under(%s) after the unmount: got %v, %v, want none", target, under, err)
	}
}
