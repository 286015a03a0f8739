package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/internal/memvault"
	"github.com/forkbox/forkbox/internal/snapshot/btrfs"
)

// TestMemoryImagesEncrypted: with --memory-image-key, the memory image of
// a memory fork holds a secret of the source's process (read through the
// daemon's vault), and the vault's file on disk does not; the child runs
// from it, and a sandbox hibernated into the vault wakes from it after the
// daemon was restarted (the key left the kernel at stop and came back at
// start). The daemon runs on a state dir of its own for the test.
func TestMemoryImagesEncrypted(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	key := make([]byte, memvault.KeySize)
	rand.Read(key)
	keyFile := filepath.Join(dir, "mem.key")
	if err := os.WriteFile(keyFile, key, 0o600); err != nil {
		t.Fatal(err)
	}
	// Registered first, so it runs last: after the daemon is back on the
	// suite's state dir, this one's loop-backed filesystems go.
	t.Cleanup(func() {
		ctx := context.Background()
		if err := memvault.Detach(ctx, filepath.Join(state, "memvault")); err != nil {
			t.Errorf("detach the vault: %v", err)
		}
		if err := btrfs.Detach(ctx, filepath.Join(state, "snapshots")); err != nil {
			t.Errorf("detach the snapshot pool: %v", err)
		}
	})
	flags := []string{"--state-dir", state, "--memory-image-key", keyFile, "--memory-vault-size", "1Gi"}
	withDaemonFlags(t, flags...)
	if _, err := env.c.ImportImage(ctx, filepath.Join(env.dir, "busybox.tar"), "", nil); err != nil {
		t.Fatal(err)
	}
	secret := "fbx-secret-" + hex.EncodeToString(key[:6])
	o := clientOpts()
	o.Runtime = "gvisor"
	src := newSandbox(t, o)
	// The secret is in the shell's memory (its script), nowhere on disk.
	if _, err := src.Start(ctx, client.ExecOptions{Shell: "S=" + secret + "-held; while :; do sleep 1; done"}); err != nil {
		t.Fatal(err)
	}
	res, err := src.Fork(ctx, client.ForkOptions{Count: 1, Memory: true})
	if err != nil {
		t.Fatal(err)
	}
	kids := res.Sandboxes()
	closeAll(t, kids)
	if len(kids) != 1 {
		t.Fatalf("memory fork: %+v", res.Children)
	}
	if got := mustSh(t, kids[0], "ps -o args | grep -c '"+secret+"-hel[d]'"); strings.TrimSpace(got) != "1" {
		t.Errorf("child: the source's process is not there (%q)", got)
	}

	vault := filepath.Join(state, "memvault")
	// The control: through the open vault the image holds the secret.
	atRest(t, state, filepath.Join(vault, "images", "checkpoints", res.Checkpoint.Id), []byte(secret))
	if err := src.Hibernate(ctx); err != nil {
		t.Fatal(err)
	}
	atRest(t, state, filepath.Join(vault, "images", "hibernate", src.ID), []byte(secret))
	restartDaemon(t, syscall.SIGTERM) // the key leaves the kernel at stop, and comes back at start
	if got := mustSh(t, src, "ps -o args | grep -c '"+secret+"-hel[d]'"); strings.TrimSpace(got) != "1" {
		t.Errorf("woken from the vault: the process is not there (%q)", got)
	}
	// Gone with what they belong to: the woken sandbox's image, and the
	// checkpoint's once its child is closed and it is deleted.
	if _, err := os.Stat(filepath.Join(vault, "images", "hibernate", src.ID)); !os.IsNotExist(err) {
		t.Errorf("the hibernation image of a woken sandbox: %v, want it gone", err)
	}
	if err := kids[0].Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := env.c.DeleteCheckpoint(ctx, res.Checkpoint.Id); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(vault, "images", "checkpoints", res.Checkpoint.Id)); !os.IsNotExist(err) {
		t.Errorf("the image of a deleted checkpoint: %v, want it gone", err)
	}
}

// atRest checks that the memory image in dir (in the vault at
// <state>/memvault) holds secret when read through the vault, that the
// vault's file on disk does not, and that no image is kept outside it.
func atRest(t *testing.T, state, dir string, secret []byte) {
	t.Helper()
	if !treeContains(t, dir, secret) {
		t.Fatalf("the memory image in %s does not hold the secret: the check below could not fail", dir)
	}
	vault := filepath.Join(state, "memvault")
	syncFS(t, vault)
	if fileContains(t, vault+".img", secret) {
		t.Errorf("the secret of %s is in the vault's file on disk: memory images are not encrypted", dir)
	}
	for _, plain := range []string{"memimages", "hibernate"} {
		if ents, _ := os.ReadDir(filepath.Join(state, plain)); len(ents) > 0 {
			t.Errorf("memory images outside the vault, in %s: %d", plain, len(ents))
		}
	}
}

func syncFS(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		t.Fatal(err)
	}
}

// treeContains reports whether a file under dir holds b.
func treeContains(t *testing.T, dir string, b []byte) bool {
	t.Helper()
	found := false
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || found {
			return err
		}
		found = fileContains(t, p, b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

// fileContains scans a file for b in chunks (the vault's file is sparse).
func fileContains(t *testing.T, path string, b []byte) bool {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 8<<20)
	var carry []byte
	for {
		n, err := f.Read(buf)
		chunk := append(carry, buf[:n]...)
		if bytes.Contains(chunk, b) {
			return true
		}
		if len(chunk) >= len(b) {
			carry = append([]byte(nil), chunk[len(chunk)-len(b)+1:]...)
		}
		if err == io.EOF {
			return false
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}
