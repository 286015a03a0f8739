package transfer

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/snapshot/btrfs"
	"github.com/forkbox/forkbox/internal/store"
)

// hostile serves pulls with handler under node n's identity, so a client
// that pins n's certificate talks to it: a sender that lies.
func hostile(t *testing.T, n *node, trust Trust, handler http.HandlerFunc) Peer {
	t.Helper()
	s := httptest.NewUnstartedServer(handler)
	s.TLS = serverTLS(n.id, trust)
	s.StartTLS()
	t.Cleanup(s.Close)
	return Peer{Node: n.name, Endpoint: strings.TrimPrefix(s.URL, "https://"), CertPEM: n.id.CertPEM}
}

// sendOf is the btrfs send stream of subvolume path.
func sendOf(t *testing.T, path string) []byte {
	t.Helper()
	out, err := exec.Command("btrfs", "send", "-q", path).Output()
	if err != nil {
		t.Fatalf("btrfs send %s: %v", path, err)
	}
	return out
}

func frames(t *testing.T, w http.ResponseWriter, hd header, send []byte) {
	t.Helper()
	if err := writeJSON(w, frameHeader, hd); err != nil {
		return
	}
	for len(send) > 0 {
		n := min(len(send), sendChunk)
		if writeFrame(w, frameSend, send[:n]) != nil {
			return
		}
		send = send[n:]
	}
}

// TestForeignSubvolumeRefused: a sender that streams another subvolume
// than the one asked for (another name, or the asked name on another
// subvolume) is refused before btrfs receive acts, and nothing is left.
func TestForeignSubvolumeRefused(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	trust := StaticTrust{}
	a, b := newNode(t, "a", trust), newNode(t, "b", trust)
	a.write(t, "sb-1", "", "f", mb)
	a.checkpoint(t, "ck-1", "sb-1", false)
	a.checkpoint(t, "ck-evil", "sb-1", false)
	// A subvolume named ck-1 that is not a's ck-1.
	other := filepath.Join(a.dir, "other")
	if err := os.MkdirAll(other, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("btrfs", "subvolume", "snapshot", "-r", a.snaps.CommittedPath("ck-evil"), filepath.Join(a.root(), "tmp", "ck-1")).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	rec, _ := json.Marshal(store.Checkpoint{ID: "ck-1", Kind: "filesystem"})
	hd := header{Checkpoint: "ck-1", UUID: a.uuid(t, "ck-1"), Record: rec}
	for name, stream := range map[string][]byte{
		"another name":      sendOf(t, a.snaps.CommittedPath("ck-evil")),
		"another subvolume": sendOf(t, filepath.Join(a.root(), "tmp", "ck-1")),
	} {
		t.Run(name, func(t *testing.T) {
			peer := hostile(t, a, trust, func(w http.ResponseWriter, r *http.Request) { frames(t, w, hd, stream) })
			_, err := b.client.Pull(ctx, peer, Request{Checkpoint: "ck-1", UUID: hd.UUID})
			if !isRefused(err) || !strings.Contains(err.Error(), "refused send stream") {
				t.Fatalf("pull of a foreign stream: got %v, want a refused send stream", err)
			}
			b.requireNothing(t, "ck-1")
			b.requireNothing(t, "ck-evil")
		})
	}
}

// honestStream makes nodes a and b, a checkpoint ck-1 of 4 MiB on a, and
// the send stream and header of it that a then serves, or cuts short.
func honestStream(t *testing.T) (a, b *node, trust StaticTrust, stream []byte, hd header) {
	t.Helper()
	requireRoot(t)
	trust = StaticTrust{}
	a, b = newNode(t, "a", trust), newNode(t, "b", trust)
	a.write(t, "sb-1", "", "f", 4*mb)
	a.checkpoint(t, "ck-1", "sb-1", false)
	stream = sendOf(t, a.snaps.CommittedPath("ck-1"))
	rec, _ := a.local.Ledger.Record(context.Background(), "ck-1")
	return a, b, trust, stream, header{Checkpoint: "ck-1", UUID: a.uuid(t, "ck-1"), Record: rec}
}

// TestCutStream: a sender that stops mid-stream (between frames, or in
// the middle of one, as a killed sender does) leaves nothing behind, and
// a pull from an honest sender afterwards succeeds.
func TestCutStream(t *testing.T) {
	ctx := context.Background()
	a, b, trust, stream, hd := honestStream(t)
	for name, h := range map[string]http.HandlerFunc{
		"between frames": func(w http.ResponseWriter, r *http.Request) { frames(t, w, hd, stream[:len(stream)/2]) },
		"mid-frame": func(w http.ResponseWriter, r *http.Request) {
			frames(t, w, hd, stream[:len(stream)/2])
			_ = writeFrame(w, frameSend, stream[len(stream)/2:])
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		},
		"no trailer": func(w http.ResponseWriter, r *http.Request) { frames(t, w, hd, stream) },
	} {
		t.Run(name, func(t *testing.T) {
			peer := hostile(t, a, trust, h)
			if _, err := b.client.Pull(ctx, peer, Request{Checkpoint: "ck-1"}); err == nil {
				t.Fatal("pull of a cut stream: got nil error")
			}
			b.requireNothing(t, "ck-1")
		})
	}
	a.grant(b, "ck-1")
	if _, err := b.client.Pull(ctx, a.peer(), Request{Checkpoint: "ck-1"}); err != nil {
		t.Fatalf("retry from an honest sender: %v", err)
	}
}

const crashEnv = "FORKBOX_TRANSFER_CRASH_CHILD"

// TestCrashChild is the receiving node of TestReceiverCrash, run in a
// process of its own so that it can be killed.
func TestCrashChild(t *testing.T) {
	dir := os.Getenv(crashEnv)
	if dir == "" {
		t.Skip("run by TestReceiverCrash")
	}
	ctx := context.Background()
	var peer Peer
	b, err := os.ReadFile(filepath.Join(dir, "peer.json"))
	if err != nil || json.Unmarshal(b, &peer) != nil {
		t.Fatalf("peer: %v", err)
	}
	n := &node{name: "b", dir: dir}
	n.open(t)
	if n.client.Identity, err = LoadOrCreateIdentity(filepath.Join(dir, "identity"), "b"); err != nil {
		t.Fatal(err)
	}
	_, err = n.client.Pull(ctx, peer, Request{Checkpoint: "ck-m"})
	t.Fatalf("the pull returned (%v): it should have been killed first", err)
}

// TestReceiverCrash: a receiving process killed mid-stream (in btrfs
// receive; while staging the memory image) leaves data that the next
// open of its store and the sweep of its memory images remove.
func TestReceiverCrash(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	trust := StaticTrust{}
	a, b := newNode(t, "a", trust), newNode(t, "b", trust)
	a.write(t, "sb-1", "", "f", 4*mb)
	a.checkpoint(t, "ck-m", "sb-1", true)
	stream := sendOf(t, a.snaps.CommittedPath("ck-m"))
	rec, _ := a.local.Ledger.Record(ctx, "ck-m")
	hd := header{Checkpoint: "ck-m", UUID: a.uuid(t, "ck-m"), Record: rec, Memory: true}
	stall := func(w http.ResponseWriter, r *http.Request) {
		w.(http.Flusher).Flush()
		// The server notices a gone client only once the body is read.
		_, _ = io.Copy(io.Discard, r.Body)
		<-r.Context().Done() // until the receiver dies
	}
	for name, c := range map[string]struct {
		h    http.HandlerFunc
		sign func() bool // the receiver got this far
	}{
		"in btrfs receive": {
			h: func(w http.ResponseWriter, r *http.Request) { frames(t, w, hd, stream[:len(stream)/2]); stall(w, r) },
			sign: func() bool {
				_, err := os.Stat(filepath.Join(b.snaps.CommittedPath("ck-m"), "upper"))
				return err == nil
			},
		},
		"staging the memory image": {
			h: func(w http.ResponseWriter, r *http.Request) {
				frames(t, w, hd, stream)
				_ = writeJSON(w, frameFile, fileHeader{Name: "mem/pages.img", Size: 4 * mb})
				_ = writeFrame(w, frameData, make([]byte, mb))
				stall(w, r)
			},
			sign: func() bool {
				m, _ := filepath.Glob(filepath.Join(b.local.MemRoot, stagingPrefix+"*", "mem", "pages.img"))
				return len(m) == 1
			},
		},
	} {
		t.Run(name, func(t *testing.T) {
			peer := hostile(t, a, trust, c.h)
			pj, _ := json.Marshal(peer)
			if err := os.WriteFile(filepath.Join(b.dir, "peer.json"), pj, 0o600); err != nil {
				t.Fatal(err)
			}
			b.close() // the child opens b's store (it takes its lock)
			cmd := exec.Command(os.Args[0], "-test.run", "^TestCrashChild$", "-test.v")
			cmd.Env = append(os.Environ(), crashEnv+"="+b.dir)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			deadline := time.After(time.Minute)
			for !c.sign() {
				select {
				case err := <-done:
					t.Fatalf("the receiver ended before it was killed (%v): %s", err, out.Bytes())
				case <-deadline:
					cmd.Process.Kill()
					<-done
					t.Fatalf("the receiver never got as far as it should: %s", out.Bytes())
				case <-time.After(20 * time.Millisecond): // poll interval
				}
			}
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			<-done
			waitNoReceive(t, b.root())
			b.open(t)
			if err := b.local.Sweep(ctx); err != nil {
				t.Fatal(err)
			}
			b.requireNothing(t, "ck-m")
			if _, err := btrfs.Subvolume(b.snaps.CommittedPath("ck-m")); !errdefs.IsNotFound(err) && err == nil {
				t.Errorf("a subvolume ck-m is left")
			}
		})
	}
	a.grant(b, "ck-m")
	if _, err := b.client.Pull(ctx, a.peer(), Request{Checkpoint: "ck-m"}); err != nil {
		t.Fatalf("pull after the crashes: %v", err)
	}
}

// waitNoReceive waits until no btrfs receive runs in root (the killed
// receiver's child dies of its parent's death, in its own time).
func waitNoReceive(t *testing.T, root string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		busy := false
		procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
		for _, p := range procs {
			b, _ := os.ReadFile(p)
			if bytes.Contains(b, []byte("receive")) && bytes.Contains(b, []byte(root)) {
				busy = true
			}
		}
		if !busy {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("btrfs receive in %s still runs", root)
		}
		time.Sleep(20 * time.Millisecond) // poll interval
	}
}

// TestSpoofedUUIDRefused: a sender that names, for a checkpoint of its
// own, the subvolume UUID of one the receiver already holds (received,
// or captured there) is refused before anything is received: btrfs
// receive finds a base and clone sources by UUID, and the second
// subvolume could stand in for the first.
func TestSpoofedUUIDRefused(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	trust := StaticTrust{}
	a, b := newNode(t, "a", trust), newNode(t, "b", trust)
	a.write(t, "sb-1", "", "f", mb)
	a.checkpoint(t, "ck-1", "sb-1", false)
	a.checkpoint(t, "ck-evil", "sb-1", false)
	a.grant(b, "ck-1")
	if _, err := b.client.Pull(ctx, a.peer(), Request{Checkpoint: "ck-1", UUID: a.uuid(t, "ck-1")}); err != nil {
		t.Fatal(err)
	}
	b.write(t, "sb-b", "", "g", mb)
	b.checkpoint(t, "ck-own", "sb-b", false)
	stream := sendOf(t, a.snaps.CommittedPath("ck-evil"))
	rec, _ := json.Marshal(store.Checkpoint{ID: "ck-evil", Kind: "filesystem"})
	for name, uuid := range map[string]string{"a received one's": b.uuid(t, "ck-1"), "one captured there": b.uuid(t, "ck-own")} {
		t.Run(name, func(t *testing.T) {
			hd := header{Checkpoint: "ck-evil", UUID: uuid, Record: rec}
			peer := hostile(t, a, trust, func(w http.ResponseWriter, r *http.Request) { frames(t, w, hd, stream) })
			_, err := b.client.Pull(ctx, peer, Request{Checkpoint: "ck-evil", UUID: uuid})
			if !isRefused(err) || !strings.Contains(err.Error(), "is already checkpoint") {
				t.Fatalf("pull naming a UUID held here: got %v, want it refused", err)
			}
			b.requireNothing(t, "ck-evil")
		})
	}
}

// TestDeviceNodeRefused: a checkpoint whose layer holds a device node
// (another node's could name this host's disks) is refused before btrfs
// receive makes it, and nothing is left; one with an overlay whiteout (a
// deleted file: char 0:0) and a fifo comes through as it was.
func TestDeviceNodeRefused(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	trust := StaticTrust{}
	a, b := newNode(t, "a", trust), newNode(t, "b", trust)
	mknod := func(key, name string, mode uint32, dev int) {
		t.Helper()
		if err := syscall.Mknod(filepath.Join(a.root(), "active", key, "upper", name), mode, dev); err != nil {
			t.Fatal(err)
		}
	}
	a.write(t, "sb-1", "", "f", mb)
	mknod("sb-1", "gone", syscall.S_IFCHR, 0)
	mknod("sb-1", "fifo", syscall.S_IFIFO|0o600, 0)
	a.checkpoint(t, "ck-1", "sb-1", false)
	a.write(t, "sb-2", "", "f", mb)
	mknod("sb-2", "mem", syscall.S_IFCHR|0o600, 1<<8|1)
	a.checkpoint(t, "ck-char", "sb-2", false)
	a.write(t, "sb-3", "", "f", mb)
	mknod("sb-3", "loop", syscall.S_IFBLK|0o600, 7<<8)
	a.checkpoint(t, "ck-block", "sb-3", false)
	a.grant(b, "ck-1", "ck-char", "ck-block")
	for _, id := range []string{"ck-char", "ck-block"} {
		_, err := b.client.Pull(ctx, a.peer(), Request{Checkpoint: id})
		if !isRefused(err) || !strings.Contains(err.Error(), "a device node") {
			t.Errorf("pull of %s: got %v, want its device node refused", id, err)
		}
		b.requireNothing(t, id)
	}
	if _, err := b.client.Pull(ctx, a.peer(), Request{Checkpoint: "ck-1"}); err != nil {
		t.Fatalf("pull of a whiteout and a fifo: %v", err)
	}
	for name, want := range map[string]uint32{"gone": syscall.S_IFCHR, "fifo": syscall.S_IFIFO} {
		var st syscall.Stat_t
		if err := syscall.Lstat(filepath.Join(b.snaps.CommittedPath("ck-1"), "upper", name), &st); err != nil {
			t.Fatal(err)
		}
		if st.Mode&syscall.S_IFMT != want || st.Rdev != 0 {
			t.Errorf("received %s: mode %o rdev %d", name, st.Mode, st.Rdev)
		}
	}
}

// TestStalledSenderGivenUp: a sender that stops sending mid-stream, and
// keeps the connection open, is given up after Limits.Idle (DeadlineExceeded,
// saying so), not after the whole pull's Timeout, and nothing is left.
func TestStalledSenderGivenUp(t *testing.T) {
	ctx := context.Background()
	a, b, trust, stream, hd := honestStream(t)
	release := make(chan struct{})
	defer close(release)
	peer := hostile(t, a, trust, func(w http.ResponseWriter, r *http.Request) {
		frames(t, w, hd, stream[:len(stream)/2])
		w.(http.Flusher).Flush()
		select { // holds the connection, sending nothing
		case <-release:
		case <-r.Context().Done():
		}
	})
	b.client.Limits = Limits{Idle: 300 * time.Millisecond, Timeout: 20 * time.Second} // Timeout: what ends it otherwise
	_, err := b.client.Pull(ctx, peer, Request{Checkpoint: "ck-1"})
	if !errdefs.IsDeadlineExceeded(err) || !strings.Contains(err.Error(), "sent nothing for 300ms") {
		t.Fatalf("pull from a stalled sender: got %v, want DeadlineExceeded saying it sent nothing", err)
	}
	b.requireNothing(t, "ck-1")
	// The whole pull's bound, reached first, says so too.
	b.client.Limits = Limits{Idle: 20 * time.Second, Timeout: 300 * time.Millisecond}
	_, err = b.client.Pull(ctx, peer, Request{Checkpoint: "ck-1"})
	if !errdefs.IsDeadlineExceeded(err) || !strings.Contains(err.Error(), "took longer than 300ms") {
		t.Fatalf("pull past its Timeout: got %v, want DeadlineExceeded saying so", err)
	}
	b.requireNothing(t, "ck-1")
}

// TestPullBoundedByRoom: a pull writes no more than the receiver has room
// for (its pool's free space less a reserve): a sender's stream past it
// is refused, ResourceExhausted, and nothing is left; it does not fill
// the node's disk for the other sandboxes there.
func TestPullBoundedByRoom(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	trust := StaticTrust{}
	a, b := newNode(t, "a", trust), newNode(t, "b", trust)
	a.write(t, "sb-1", "", "f", 200*mb)
	a.checkpoint(t, "ck-1", "sb-1", false)
	a.grant(b, "ck-1")
	// b's pool keeps about 60 MiB of room, for a stream of 200.
	room, err := b.local.room()
	if err != nil {
		t.Fatal(err)
	}
	fill := filepath.Join(b.root(), "fill")
	if out, err := exec.Command("fallocate", "-l", fmt.Sprint(room-60*mb), fill).CombinedOutput(); err != nil {
		t.Fatalf("fallocate: %v: %s", err, out)
	}
	exec.Command("sync").Run()
	if room, err = b.local.room(); err != nil || room <= 0 || room > 150*mb {
		t.Fatalf("room after the fill: %d MiB, %v; want some, well under 200", room>>20, err)
	}
	_, err = b.client.Pull(ctx, a.peer(), Request{Checkpoint: "ck-1"})
	if !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "past its limit") {
		t.Fatalf("a 200 MiB pull into %d MiB of room: got %v, want ResourceExhausted past the limit", room>>20, err)
	}
	b.requireNothing(t, "ck-1")
	if err := os.Remove(fill); err != nil {
		t.Fatal(err)
	}
	exec.Command("sync").Run()
	if _, err := b.client.Pull(ctx, a.peer(), Request{Checkpoint: "ck-1"}); err != nil {
		t.Fatalf("the same pull with room: %v", err)
	}
}
