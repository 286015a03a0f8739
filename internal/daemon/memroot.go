package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/memvault"
)

// Memory images hold what their sandboxes' processes held in memory:
// those of memory checkpoints (memRoot) and of hibernated sandboxes
// (hibRoot). They live in <state>/memimages and <state>/hibernate (0700, in
// the 0700 state dir), or, with Config.MemoryImageKey, in the encrypted
// directory of a vault (internal/memvault) mounted at <state>/memvault, as
// its checkpoints/ and hibernate/. A daemon does not switch between the two
// over images it already has: it refuses to start instead.

func (d *Daemon) plainMemRoot() string { return filepath.Join(d.cfg.StateDir, "memimages") }
func (d *Daemon) plainHibRoot() string { return filepath.Join(d.cfg.StateDir, "hibernate") }
func (d *Daemon) vaultRoot() string    { return filepath.Join(d.cfg.StateDir, "memvault") }

// imageRoots returns memRoot and hibRoot; on a Daemon made without open
// (unit tests), the plain ones.
func (d *Daemon) imageRoots() (mem, hib string) {
	if d.memRoot == "" {
		return d.plainMemRoot(), d.plainHibRoot()
	}
	return d.memRoot, d.hibRoot
}

// openMemRoot sets memRoot, opening the vault when the daemon has a key.
func (d *Daemon) openMemRoot(ctx context.Context) error {
	hasVault := memvault.Exists(d.vaultRoot())
	if d.cfg.MemoryImageKey == nil {
		if hasVault {
			return fmt.Errorf("%s holds encrypted memory images: start with --memory-image-key (the key they were written with): %w",
				d.vaultRoot(), errdefs.ErrFailedPrecondition)
		}
		d.memRoot, d.hibRoot = d.plainMemRoot(), d.plainHibRoot()
		return nil
	}
	for _, dir := range []string{d.plainMemRoot(), d.plainHibRoot()} {
		ents, err := os.ReadDir(dir)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("memory images: %v: %w", err, errdefs.ErrInternal)
		}
		if len(ents) > 0 {
			return fmt.Errorf("%d memory images are kept unencrypted in %s (memory checkpoints, hibernated sandboxes): start without --memory-image-key, or close or delete what holds them first: %w",
				len(ents), dir, errdefs.ErrFailedPrecondition)
		}
	}
	v, err := memvault.Open(ctx, d.vaultRoot(), d.cfg.MemoryImageKey, d.cfg.MemoryVaultSize, d.log)
	if err != nil {
		return err
	}
	// The kernel holds it now; the daemon needs only its identifier (to
	// remove it at Close).
	clear(d.cfg.MemoryImageKey)
	d.vault, d.memRoot, d.hibRoot = v, filepath.Join(v.Dir, "checkpoints"), filepath.Join(v.Dir, "hibernate")
	for _, dir := range []string{d.memRoot, d.hibRoot} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return errors.Join(fmt.Errorf("memory vault: %v: %w", err, errdefs.ErrInternal), d.closeMemRoot())
		}
	}
	return nil
}

// closeMemRoot locks the vault (its key leaves the kernel), if open.
func (d *Daemon) closeMemRoot() error {
	if d.vault == nil {
		return nil
	}
	busy, err := d.vault.CloseBusy()
	if busy {
		d.log.Warn("memory vault locked with images still open: those stay readable through their handles until closed")
	}
	d.vault = nil
	return err
}
