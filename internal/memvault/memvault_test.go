package memvault

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/loopdev"
	"github.com/forkbox/forkbox/internal/mount"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatal("the vault needs root (loop devices, mounts, fscrypt keys); CI runs as root")
	}
	t.Skip("needs root")
}

func newKey(t *testing.T) []byte {
	t.Helper()
	k := make([]byte, KeySize)
	rand.Read(k)
	return k
}

// openTestVault opens a new 64 MiB vault under a fresh key (needs root)
// and detaches it when the test ends.
func openTestVault(t *testing.T) (root string, key []byte, v *Vault) {
	t.Helper()
	needRoot(t)
	root = filepath.Join(t.TempDir(), "memvault")
	t.Cleanup(func() { Detach(context.Background(), root) })
	key = newKey(t)
	v, err := Open(context.Background(), root, key, 64<<20, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	return root, key, v
}

// The vault's images are ciphertext in its image file, plaintext through
// the open vault, locked once it is closed, open again with the same key,
// and refused under another.
func TestVaultEncryptsAtRest(t *testing.T) {
	ctx := context.Background()
	root, key, v := openTestVault(t)
	secret := []byte("forkbox-vault-marker-" + hex.EncodeToString(newKey(t)[:8]) + "\n")
	data := bytes.Repeat(secret, (1<<20)/len(secret))
	if err := os.MkdirAll(filepath.Join(v.Dir, "ck-1"), 0o700); err != nil {
		t.Fatal(err)
	}
	inside := filepath.Join(v.Dir, "ck-1", "pages.img")
	if err := os.WriteFile(inside, data, 0o600); err != nil {
		t.Fatal(err)
	}
	// The control: the same bytes outside the encrypted directory are
	// found in the image file, so the check below can see plaintext.
	if err := os.WriteFile(filepath.Join(v.Root, "control"), []byte(strings.ToUpper(string(secret))), 0o600); err != nil {
		t.Fatal(err)
	}
	syncfs(t, v.Root)
	raw, err := os.ReadFile(imagePath(root))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(raw, []byte(strings.ToUpper(string(secret)))) {
		t.Fatal("the control file's plaintext is not in the image file: the scan cannot see plaintext")
	}
	if bytes.Contains(raw, secret) {
		t.Fatal("an image's plaintext is in the vault's image file")
	}
	if bytes.Contains(raw, []byte("pages.img")) || bytes.Contains(raw, []byte("ck-1")) {
		t.Error("an image's file name is in the vault's image file")
	}
	if got, err := os.ReadFile(inside); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read through the open vault: %d bytes, %v", len(got), err)
	}

	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
	// Removing the key evicts the files it unlocked (none is open).
	if _, err := os.ReadFile(inside); err == nil {
		t.Error("an image is readable after the key was removed")
	}

	if _, err := Open(ctx, root, newKey(t), 0, slog.Default()); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("open with another key: %v, want FailedPrecondition", err)
	}
	v, err = Open(ctx, root, key, 0, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(inside); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read after opening again: %d bytes, %v", len(got), err)
	}
	v.Close()

	if err := Detach(ctx, root); err != nil {
		t.Fatal(err)
	}
	if !hasExt4(imagePath(root)) {
		t.Error("the vault's file has no ext4 superblock")
	}
	if mp, err := mount.IsMountPoint(root); err != nil || mp {
		t.Errorf("after Detach: mounted %v (%v)", mp, err)
	}
	if devs := loopdev.For(imagePath(root)); len(devs) > 0 {
		t.Errorf("after Detach: loop devices %v left", devs)
	}
}

// A key file: 64 raw bytes or 128 hex digits, readable by its owner only.
func TestReadKey(t *testing.T) {
	dir := t.TempDir()
	k := newKey(t)
	write := func(name string, b []byte, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, mode)
		return p
	}
	if got, err := ReadKey(write("raw", k, 0o600)); err != nil || !bytes.Equal(got, k) {
		t.Errorf("raw key: %v", err)
	}
	if got, err := ReadKey(write("hex", []byte(hex.EncodeToString(k)+"\n"), 0o400)); err != nil || !bytes.Equal(got, k) {
		t.Errorf("hex key: %v", err)
	}
	for name, c := range map[string]struct {
		b    []byte
		mode os.FileMode
	}{
		"short":       {k[:32], 0o600},
		"others-read": {k, 0o644},
		"bad-hex":     {[]byte(strings.Repeat("zz", KeySize)), 0o600},
	} {
		if _, err := ReadKey(write(name, c.b, c.mode)); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
	if os.Geteuid() == 0 {
		p := write("other-owner", k, 0o600)
		if err := os.Chown(p, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadKey(p); !errdefs.IsInvalidArgument(err) {
			t.Errorf("a key owned by another user: %v, want InvalidArgument", err)
		}
	}
	if _, err := ReadKey(filepath.Join(dir, "missing")); !errdefs.IsInvalidArgument(err) {
		t.Errorf("missing: %v, want InvalidArgument", err)
	}
}

func syncfs(t *testing.T, path string) {
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

// hasExt4 reports whether image holds an ext4 superblock (magic 0xEF53,
// little-endian, at 1024 + 56).
func hasExt4(image string) bool {
	f, err := os.Open(image)
	if err != nil {
		return false
	}
	defer f.Close()
	b := make([]byte, 2)
	if _, err := f.ReadAt(b, 1024+56); err != nil {
		return false
	}
	return b[0] == 0x53 && b[1] == 0xef
}

// keyPresent reports whether the key with identifier id is in root's
// filesystem.
func keyPresent(t *testing.T, root string, id [unix.FSCRYPT_KEY_IDENTIFIER_SIZE]byte) bool {
	t.Helper()
	f, err := os.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	arg := unix.FscryptGetKeyStatusArg{}
	arg.Key_spec.Type = unix.FSCRYPT_KEY_SPEC_TYPE_IDENTIFIER
	copy(arg.Key_spec.U[:], id[:])
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.FS_IOC_GET_ENCRYPTION_KEY_STATUS, uintptr(unsafe.Pointer(&arg))); errno != 0 {
		t.Fatalf("key status: %v", errno)
	}
	return arg.Status == unix.FSCRYPT_KEY_STATUS_PRESENT
}

// What a crash or a wrong start leaves: an images directory made without
// its policy takes it at the next open; an open refused for another key
// leaves that key out of the kernel; Close says whether files were open.
func TestVaultRecovers(t *testing.T) {
	ctx := context.Background()
	root, key, v := openTestVault(t)
	// The crash between mkdir and the policy.
	if err := os.Remove(v.Dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(v.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	v.Close()
	v, err := Open(ctx, root, key, 0, slog.Default())
	if err != nil {
		t.Fatalf("open over an images directory without its policy: %v", err)
	}
	if id, ok, err := policyKey(v.Dir); err != nil || !ok || id != v.keyID {
		t.Fatalf("the images directory after that open: policy %v, key %x (want %x), %v", ok, id[:4], v.keyID[:4], err)
	}
	f, err := os.Create(filepath.Join(v.Dir, "open"))
	if err != nil {
		t.Fatal(err)
	}
	if busy, err := v.CloseBusy(); err != nil || !busy {
		t.Errorf("close with a file open: busy %v, %v; want busy", busy, err)
	}
	f.Close()

	// Another key: refused, and not left in the kernel.
	other := newKey(t)
	otherID, err := addKey(root, other)
	if err != nil {
		t.Fatal(err)
	}
	(&Vault{Root: root, keyID: otherID}).Close()
	if keyPresent(t, root, otherID) {
		t.Fatal("the other key is present before the test's open")
	}
	if _, err := Open(ctx, root, other, 0, slog.Default()); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("open with another key: %v, want FailedPrecondition", err)
	}
	if keyPresent(t, root, otherID) {
		t.Error("a refused open left its key in the kernel")
	}

	// A file that is not blank and holds no ext4 is never formatted over.
	if err := Detach(ctx, root); err != nil {
		t.Fatal(err)
	}
	junk := filepath.Join(t.TempDir(), "junk")
	if err := os.MkdirAll(junk, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(imagePath(junk), bytes.Repeat([]byte("x"), 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(ctx, junk, key, 0, slog.Default()); err == nil {
		Detach(ctx, junk)
		t.Fatal("a vault file holding something else was opened")
	}
	if b, _ := os.ReadFile(imagePath(junk)); !bytes.Equal(b, bytes.Repeat([]byte("x"), 1<<20)) {
		t.Error("a vault file holding something else was written to")
	}
}
