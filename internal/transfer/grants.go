package transfer

import (
	"context"
	"fmt"
	"slices"

	"github.com/forkbox/forkbox/errdefs"
)

// Grants tells a server which checkpoints a peer may pull. A trusted
// peer is a node of the cluster, not a node entitled to every checkpoint:
// in cluster mode (nodeagent) a node may pull a checkpoint only when a
// sandbox placed on it starts from that checkpoint (or from a descendant
// of it), which is the only reason the placer gives a node to hold a copy.
type Grants interface {
	// MayPull returns nil when node may pull checkpoint (this server's
	// ID of it), an error of class PermissionDenied that names both when
	// it may not, or Unavailable when that cannot be told now.
	MayPull(ctx context.Context, node, checkpoint string) error
}

// StaticGrants is a fixed set of grants: node → the checkpoint IDs it may
// pull.
type StaticGrants map[string][]string

// MayPull implements Grants.
func (g StaticGrants) MayPull(_ context.Context, node, checkpoint string) error {
	if slices.Contains(g[node], checkpoint) {
		return nil
	}
	return Denied(node, checkpoint, "it is granted no pull of it")
}

// Denied is the PermissionDenied error of a pull refused, naming the
// node, the checkpoint and why.
func Denied(node, checkpoint, why string) error {
	return fmt.Errorf("node %s may not pull checkpoint %s: %s: %w", node, checkpoint, why, errdefs.ErrPermissionDenied)
}
