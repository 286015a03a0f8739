package image

import (
	"context"
	"os"
	"path/filepath"
	"strings"
)

// Layer collection: deleting the unpacked layers that no image, pull in
// flight or outside user (SetInUse) references.

// Collect deletes the layers that no image, pull in flight or outside user
// (SetInUse) references: those a Remove cut short by a crash left, between
// the index's save and its collection, which no later Remove would take
// (no image names them). Call it once SetInUse's function knows every
// sandbox (after a daemon's reconcile).
func (s *Store) Collect(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gcLocked(ctx)
}

// gcLocked deletes layer dirs that no image, pull in flight or outside user
// references: rename to a tombstone in tmp/, then delete. s.mu must be held.
func (s *Store) gcLocked(ctx context.Context) {
	keep := map[string]bool{}
	for _, r := range s.images {
		for _, d := range r.DiffIDs {
			keep[filepath.Base(s.layerDir(d))] = true
		}
	}
	for d := range s.pinned {
		keep[filepath.Base(s.layerDir(d))] = true
	}
	// Sandboxes mounted before the layout migration name their lowers by
	// the old 12-digit prefix: keep the layers those prefixes now lead to.
	oldInUse := map[string]bool{}
	if s.inUse != nil {
		for p := range s.inUse() {
			b := filepath.Base(p)
			keep[b] = true
			if len(b) == oldNameLen {
				oldInUse[b] = true
			}
		}
	}
	ents, err := os.ReadDir(s.layersDir())
	if err != nil {
		s.log.WarnContext(ctx, "list layers", "err", err)
		return
	}
	for _, e := range ents {
		base := strings.TrimSuffix(e.Name(), ".diffid")
		if keep[base] || (len(base) > oldNameLen && oldInUse[base[:oldNameLen]]) {
			continue
		}
		src := filepath.Join(s.layersDir(), e.Name())
		tomb := filepath.Join(s.tmpDir(), "rm-"+e.Name())
		if err := os.Rename(src, tomb); err != nil {
			s.log.WarnContext(ctx, "tombstone layer", "path", src, "err", err)
			continue
		}
		if err := removeAll(tomb); err != nil {
			s.log.WarnContext(ctx, "delete layer", "path", tomb, "err", err)
			continue
		}
		if e.IsDir() {
			s.log.DebugContext(ctx, "layer deleted", "layer", base)
		}
	}
	s.gcBlobsLocked(ctx)
}
