package image

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/forkbox/forkbox/errdefs"
)

// oldNameLen is the length of a layer directory's name in the old layout:
// the first 12 hex digits of the diff ID.
const oldNameLen = 12

// migrate renames layers of the old layout (l/<12 hex> with
// l/<12 hex>.diffid holding the full diff ID) to their full-digest names.
// Each step can be repeated, so a crash part-way is finished by the next
// Open: the directory is renamed first, then the new .diffid written, then
// the old one removed; an old directory whose full name is taken already,
// or that has no .diffid (never completed), is deleted. Running sandboxes
// keep their overlays (a rename does not disturb a mounted lower), and the
// garbage collector maps their old lowerdir names to the new directories.
func (s *Store) migrate(ctx context.Context) error {
	ents, err := os.ReadDir(s.layersDir())
	if err != nil {
		return fmt.Errorf("list layers: %v: %w", err, errdefs.ErrInternal)
	}
	moved := 0
	for _, e := range ents {
		short, ok := strings.CutSuffix(e.Name(), ".diffid")
		if !ok || len(short) != oldNameLen {
			continue
		}
		oldID := filepath.Join(s.layersDir(), e.Name())
		oldDir := filepath.Join(s.layersDir(), short)
		b, err := os.ReadFile(oldID)
		if err != nil {
			return fmt.Errorf("migrate layer %s: %v: %w", short, err, errdefs.ErrInternal)
		}
		diffID, _, _ := strings.Cut(string(b), " ")
		if !validDiffID(diffID) || !strings.HasPrefix(diffID, "sha256:"+short) {
			s.log.WarnContext(ctx, "migrate layers: dropping a layer with an unreadable record", "layer", short)
			if err := s.tombstone(oldDir, oldID); err != nil {
				return err
			}
			continue
		}
		newDir := s.layerDir(diffID)
		if _, err := os.Lstat(oldDir); err == nil {
			if _, err := os.Lstat(newDir); err == nil {
				if err := s.tombstone(oldDir); err != nil {
					return err
				}
			} else if err := os.Rename(oldDir, newDir); err != nil {
				return fmt.Errorf("migrate layer %s: %v: %w", short, err, errdefs.ErrInternal)
			}
		}
		if _, err := os.Lstat(newDir); err == nil {
			if err := writeFileAtomic(newDir+".diffid", b); err != nil {
				return fmt.Errorf("migrate layer %s: %v: %w", short, err, errdefs.ErrInternal)
			}
			moved++
		}
		if err := os.Remove(oldID); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("migrate layer %s: %v: %w", short, err, errdefs.ErrInternal)
		}
	}
	// Old directories without a record were never completed.
	for _, e := range ents {
		if n := e.Name(); len(n) == oldNameLen && isHex(n) {
			if _, err := os.Lstat(filepath.Join(s.layersDir(), n+".diffid")); errors.Is(err, fs.ErrNotExist) {
				if err := s.tombstone(filepath.Join(s.layersDir(), n)); err != nil {
					return err
				}
			}
		}
	}
	if moved > 0 {
		s.log.InfoContext(ctx, "image store migrated to full-digest layer names", "layers", moved)
	}
	return nil
}

// tombstone moves paths (if present) into tmp/, which Open empties next.
func (s *Store) tombstone(paths ...string) error {
	for _, p := range paths {
		if _, err := os.Lstat(p); err != nil {
			continue
		}
		d, err := os.MkdirTemp(s.tmpDir(), "rm-")
		if err == nil {
			err = os.Rename(p, filepath.Join(d, filepath.Base(p)))
		}
		if err != nil {
			return fmt.Errorf("remove %s: %v: %w", p, err, errdefs.ErrInternal)
		}
	}
	return nil
}

func validDiffID(d string) bool {
	h, ok := strings.CutPrefix(d, "sha256:")
	return ok && len(h) == 64 && isHex(h)
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return s != ""
}
