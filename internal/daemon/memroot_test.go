package daemon

import (
	"context"
	"crypto/rand"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/memvault"
)

// Where memory images go, and the switches a daemon refuses: a key over
// plaintext images, no key over a vault.
func TestMemRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("the vault needs root; CI runs as root")
		}
		t.Skip("needs root")
	}
	state := t.TempDir()
	t.Cleanup(func() { memvault.Detach(context.Background(), filepath.Join(state, "memvault")) })
	key := make([]byte, memvault.KeySize)
	rand.Read(key)
	daemon := func(key []byte) *Daemon {
		return &Daemon{cfg: Config{StateDir: state, MemoryImageKey: key, MemoryVaultSize: 64 << 20}, log: slog.Default()}
	}
	ctx := context.Background()

	d := daemon(nil)
	if err := d.openMemRoot(ctx); err != nil || d.memImageDir("ck-1") != filepath.Join(state, "memimages", "ck-1") {
		t.Fatalf("no key: %v, images in %s", err, d.memImageDir("ck-1"))
	}
	for _, dir := range []string{d.memImageDir("ck-1"), d.hibernateDir("sb-1")} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := daemon(key).openMemRoot(ctx); !errdefs.IsFailedPrecondition(err) {
			t.Fatalf("a key over plaintext images in %s: %v, want FailedPrecondition", dir, err)
		}
		os.Remove(dir)
	}

	d = daemon(key)
	if err := d.openMemRoot(ctx); err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(state, "memvault", "images", "checkpoints", "ck-2"); d.memImageDir("ck-2") != want {
		t.Errorf("with a key: images in %s, want %s", d.memImageDir("ck-2"), want)
	}
	if want := filepath.Join(state, "memvault", "images", "hibernate", "sb-1"); d.hibernateDir("sb-1") != want {
		t.Errorf("with a key: hibernation images in %s, want %s", d.hibernateDir("sb-1"), want)
	}
	if err := d.closeMemRoot(); err != nil {
		t.Fatal(err)
	}
	if err := daemon(nil).openMemRoot(ctx); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("no key over a vault: %v, want FailedPrecondition", err)
	}
}
