package nodeagent

import (
	"context"
	"fmt"

	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/kube"
	"github.com/forkbox/forkbox/internal/store"
)

// Reusing a copy. A Checkpoint's replica entries name local IDs, and any
// node writes them: a node's entry could name the local ID of another
// tenant's checkpoint that this node holds. So a local checkpoint serves
// as a copy of a Checkpoint only when it is that one: its subvolume is
// the one the Checkpoint's status names (received copies carry it as
// their received UUID, the origin's is its own), and its ledger tag is
// the Checkpoint's (kube.LocalCheckpointTag: bound to its UID), which the
// capture wrote and a transfer carries.

// checkCopy returns nil when checkpoint localID held here is ck's copy,
// and otherwise a PermissionDenied error that names both.
func (a *agent) checkCopy(ctx context.Context, ck *fbv1.Checkpoint, localID string) error {
	local, err := a.d.GetCheckpoint(ctx, localID)
	if err != nil {
		return fmt.Errorf("local checkpoint %s named by checkpoint %s/%s: %w", localID, ck.Namespace, ck.Name, err)
	}
	uuid, err := a.d.CheckpointUUID(localID)
	if err != nil {
		return fmt.Errorf("local checkpoint %s named by checkpoint %s/%s: %w", localID, ck.Namespace, ck.Name, err)
	}
	return sameCheckpoint(ck, local, uuid)
}

// heldCopy is the local ID of ck's ready copy on this node, checked to
// be ck's (checkCopy), or "" when the node lists none.
func (a *agent) heldCopy(ctx context.Context, ck *fbv1.Checkpoint) (string, error) {
	for _, rp := range ck.Status.Replicas {
		if rp.Node == a.o.NodeName && rp.Ready {
			// Any node writes replica entries: this one must name ck's copy.
			if err := a.checkCopy(ctx, ck, rp.LocalID); err != nil {
				return "", err
			}
			return rp.LocalID, nil
		}
	}
	return "", nil
}

// sameCheckpoint says whether local, of subvolume identity uuid ("" on
// a snapshotter other than btrfs), is ck's.
func sameCheckpoint(ck *fbv1.Checkpoint, local *store.Checkpoint, uuid string) error {
	deny := func(why string, args ...any) error {
		return fmt.Errorf("local checkpoint %s is not a copy of checkpoint %s/%s: %s: %w", local.ID, ck.Namespace, ck.Name,
			fmt.Sprintf(why, args...), errdefs.ErrPermissionDenied)
	}
	// Both "": a node without btrfs, which receives no copies (its own
	// checkpoints are told by their tag).
	switch want := ck.Status.SubvolumeUUID; {
	case want == "" && uuid != "":
		return deny("the checkpoint names no subvolume")
	case uuid != want:
		return deny("it is subvolume %q, the checkpoint's is %q", uuid, want)
	}
	// The tag is bound to the Checkpoint's UID. (A bare spec tag, which
	// nodes gave copies before, is not enough with the subvolume: both are
	// what a capturing node and a tenant choose, and a node that captured
	// nothing of it could name another tenant's copy here by them.)
	if want := kube.LocalCheckpointTag(ck); local.Tag != want {
		return deny("its tag is %q, the checkpoint's %q", local.Tag, want)
	}
	return nil
}
