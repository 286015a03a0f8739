package storage

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
)

// fullBackend makes directories, except that its first full Creates and
// Clones fail ResourceExhausted, as a filesystem that has not yet given
// back what was removed from it.
type fullBackend struct {
	full     int   // calls left that fail
	then     error // what the calls after those return (nil: they work)
	freeing  int   // reclaims that find something to give back
	calls    int
	reclaims int
}

func (b *fullBackend) make(dst string) error {
	b.calls++
	if b.full > 0 {
		b.full--
		return fmt.Errorf("no space left on device: %w", errdefs.ErrResourceExhausted)
	}
	if b.then != nil {
		return b.then
	}
	return os.Mkdir(dst, 0o700)
}

func (b *fullBackend) Create(_ context.Context, dst string) error { return b.make(dst) }
func (b *fullBackend) Clone(_ context.Context, _, dst string, _ bool) error {
	return b.make(dst)
}
func (b *fullBackend) Unseal(context.Context, string) error       { return nil }
func (b *fullBackend) Delete(_ context.Context, dir string) error { return os.RemoveAll(dir) }
func (b *fullBackend) Limit(context.Context, string, int64) error { return nil }

// reclaiming is fullBackend with Reclaim.
type reclaiming struct{ *fullBackend }

func (b reclaiming) Reclaim(context.Context) (bool, error) {
	b.reclaims++
	return b.reclaims <= b.freeing, nil
}

func TestRetryAfterReclaim(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name         string
		full         int
		then         error
		freeing      int
		reclaimer    bool
		wantErr      bool
		wantCalls    int
		wantReclaims int
	}{
		{"reclaimed", 1, nil, 1, true, false, 2, 1},
		{"reclaimed in the second round", 2, nil, 1, true, false, 3, 2},
		{"nothing to give back", 5, nil, 0, true, true, 2, 1},
		{"freed twice, still full", 5, nil, 2, true, true, 4, 3},
		{"bounded rounds", 50, nil, 50, true, true, 6, 5},
		// The retry's other error (what a failed undo left, say) does
		// not hide that the pool was full.
		{"retry fails otherwise", 1, fmt.Errorf("exists: %w", errdefs.ErrAlreadyExists), 1, true, true, 2, 1},
		{"no reclaimer", 1, nil, 1, false, true, 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fb := &fullBackend{full: tc.full, then: tc.then, freeing: tc.freeing}
			var b Backend = fb
			if tc.reclaimer {
				b = reclaiming{fb}
			}
			s, err := Open(ctx, filepath.Join(t.TempDir(), "snaps"), b, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			err = s.Prepare(ctx, "k", "")
			if tc.wantErr != (err != nil) || (err != nil && !errdefs.IsResourceExhausted(err)) {
				t.Errorf("Prepare: %v, want error %v (ResourceExhausted)", err, tc.wantErr)
			}
			if fb.calls != tc.wantCalls || fb.reclaims != tc.wantReclaims {
				t.Errorf("Prepare: %d creates and %d reclaims, want %d and %d", fb.calls, fb.reclaims, tc.wantCalls, tc.wantReclaims)
			}
			if !tc.wantErr {
				// Commit does not wait: its callers hold a sandbox frozen
				// around it.
				fb.full, fb.calls, fb.reclaims = 1, 0, 0
				if err := s.Commit(ctx, "c", "k"); !errdefs.IsResourceExhausted(err) || fb.calls != 1 || fb.reclaims != 0 {
					t.Errorf("Commit: %v after %d clones and %d reclaims, want ResourceExhausted after 1 and 0", err, fb.calls, fb.reclaims)
				}
			}
		})
	}
}
