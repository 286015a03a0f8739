// Created containers: `runsc create` boots a sandbox (its sandbox and gofer
// processes, the sentry, the netns joined, the cgroup entered) and leaves
// it waiting, with no application code run; a later `runsc restore` of the
// same id skips all of that and goes straight to loading the image. The
// spec is fixed at create (runsc restore reads it from its state, not from
// a bundle), and so is the root filesystem the gofer serves: a created
// container can take only an image whose spec matches (runsc validates
// args, mounts, capabilities and the like) and whose files are already in
// its root. The daemon's use is a pre-booted pod's placeholder, whose spec
// is the same for every pod and whose root is empty (daemon/preboot.go).

package runsc

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/forkbox/forkbox/errdefs"
)

// Create creates container id from bundle and leaves it created, booted
// and waiting for a start or a restore: `runsc create`. Its stdio is
// bundle/stdio.log; on failure everything runsc created is deleted.
func (r *Runsc) Create(ctx context.Context, id, bundle string) error {
	return r.detached(ctx, "create", id, bundle, errdefs.ErrInvalidArgument)
}

// RestoreCreated restores the image in imageDir into container id, which
// Create left created: `runsc restore --detach --image-path imageDir id`.
// bundle is the one id was created from (its stdio.log takes the restore
// CLI's output). An id runsc does not hold is NotFound; one started or
// restored already is FailedPrecondition (runsc restores a container once).
// A failed restore deletes the container: what it booted is not used again.
func (r *Runsc) RestoreCreated(ctx context.Context, id, bundle, imageDir string) error {
	if err := checkRestore(id, bundle, imageDir); err != nil {
		return err
	}
	// Without its state runsc would build a new container from the
	// bundle (what Restore is for): this one must exist. A file check in
	// its own state root, not a `runsc state` (a runsc start, about
	// 12 ms), except in the flat root of older daemons.
	root := filepath.Join(r.opts.Root, id)
	if !holdsState(root) {
		if _, err := r.State(ctx, id); err != nil {
			return fmt.Errorf("runsc restore %s: no created container: %w", id, err)
		}
		root = r.RootOf(id)
	}
	return r.cli(ctx, "restore", id, bundle, root, errdefs.ErrFailedPrecondition,
		append(append([]string{"restore", "--detach"}, restoreFlags(imageDir)...), "--bundle", bundle, id))
}
