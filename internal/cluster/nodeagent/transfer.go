package nodeagent

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/kube"
	"github.com/forkbox/forkbox/internal/daemon"
	"github.com/forkbox/forkbox/internal/transfer"
)

// TransferOptions turn on checkpoint transfers between nodes: the node
// serves its checkpoints to peers and pulls the ones its sandboxes need.
type TransferOptions struct {
	// Listen is the listener's address (host:port).
	Listen string
	// Advertise is where peers reach it (host:port), published in the
	// node's status with its certificate.
	Advertise string
	// Dir keeps the node's key pair (made once).
	Dir    string
	Limits transfer.Limits
}

// transfers is the agent's transfer side.
type transfers struct {
	id     *transfer.Identity
	local  *transfer.Local
	client *transfer.Client
	srv    *transfer.Server

	mu    sync.Mutex
	pulls map[string]*pullLock // checkpoint local ID → its pull
}

// pullLock serializes the pulls of one checkpoint: children of it that
// are created at once on this node (the agent reconciles several
// sandboxes in parallel) wait for the first pull and reuse its copy.
type pullLock struct {
	mu    sync.Mutex
	users int
}

func (t *transfers) lock(id string) func() {
	t.mu.Lock()
	if t.pulls == nil {
		t.pulls = map[string]*pullLock{}
	}
	l := t.pulls[id]
	if l == nil {
		l = &pullLock{}
		t.pulls[id] = l
	}
	l.users++
	t.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		t.mu.Lock()
		if l.users--; l.users == 0 {
			delete(t.pulls, id)
		}
		t.mu.Unlock()
	}
}

// setupTransfer makes the node's identity and adds its server to mgr.
func (a *agent) setupTransfer(ctx context.Context, mgr manager.Manager) error {
	o := a.o.Transfer
	if o == nil {
		return nil
	}
	if o.Listen == "" || o.Advertise == "" || o.Dir == "" {
		return fmt.Errorf("node agent: transfers need a listen address, an advertised one and a key dir: %w", errdefs.ErrInvalidArgument)
	}
	local, err := a.d.TransferLocal()
	if err != nil {
		return err
	}
	if err := local.Sweep(ctx); err != nil {
		return err
	}
	id, err := transfer.LoadOrCreateIdentity(o.Dir, a.o.NodeName)
	if err != nil {
		return err
	}
	log := a.log.With(slog.String("component", "transfer"))
	srv, err := transfer.NewServer(transfer.ServerOptions{Identity: id, Trust: nodeTrust{a.api},
		Grants: placementGrants{api: a.api, node: a.o.NodeName}, Local: local, Timeout: o.Limits.Timeout, Log: log})
	if err != nil {
		return err
	}
	a.t = &transfers{id: id, local: local, srv: srv, client: &transfer.Client{Identity: id, Local: local, Limits: o.Limits, Log: log}}
	return mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		addr, err := srv.Start(o.Listen)
		if err != nil {
			return err
		}
		log.InfoContext(ctx, "serving checkpoint transfers", slog.String("addr", addr.String()), slog.String("advertise", o.Advertise),
			slog.String("fingerprint", fingerprint(id.CertPEM)))
		<-ctx.Done()
		return srv.Close()
	}))
}

func fingerprint(certPEM []byte) string {
	der, err := transfer.CertDER(certPEM)
	if err != nil {
		return ""
	}
	return transfer.Fingerprint(der)
}

// transferInfo is what the node publishes of its transfers.
func (a *agent) transferInfo() *fbv1.TransferInfo {
	if a.t == nil {
		return nil
	}
	return &fbv1.TransferInfo{Endpoint: a.o.Transfer.Advertise, Certificate: string(a.t.id.CertPEM)}
}

// nodeTrust trusts the certificates the ForkboxNodes publish, read from
// the API server (not a cache: a node's new certificate counts at once).
type nodeTrust struct{ api client.Reader }

func (t nodeTrust) NodeOf(ctx context.Context, der []byte) (string, error) {
	var nl fbv1.ForkboxNodeList
	if err := t.api.List(ctx, &nl); err != nil {
		return "", fmt.Errorf("list nodes: %v: %w", err, errdefs.ErrUnavailable)
	}
	trust := transfer.StaticTrust{}
	for _, n := range nl.Items {
		if n.Status.Transfer != nil {
			trust[n.Name] = []byte(n.Status.Transfer.Certificate)
		}
	}
	return trust.NodeOf(ctx, der)
}

// pullSources are the copies of ck that node me may pull: only the
// capturing node's. Any node may list a copy of its own (the node
// identity policy keeps it from changing others' entries, not from
// claiming one), and what it would send is its say alone.
func pullSources(ck *fbv1.Checkpoint, me string) []fbv1.Replica {
	var out []fbv1.Replica
	for _, rp := range ck.Status.Replicas {
		if rp.Ready && rp.Node != me && rp.LocalID != "" && rp.Node == ck.Status.OriginNode {
			out = append(out, rp)
		}
	}
	return out
}

// pull brings checkpoint ck to this node from the node that captured it
// and records the new replica; it returns the checkpoint's local ID. A
// copy already here (a pull whose status write was lost) is reused if it
// is ck's (checkCopy, reuse.go); a local checkpoint of that ID that is
// not is refused, PermissionDenied.
func (a *agent) pull(ctx context.Context, ck *fbv1.Checkpoint) (string, error) {
	ready := pullSources(ck, a.o.NodeName)
	if len(ready) == 0 {
		return "", fmt.Errorf("checkpoint %s has no ready copy on its capturing node %q (copies elsewhere are not pulled from: a node may list one it never had): %w",
			ck.Name, ck.Status.OriginNode, errdefs.ErrUnavailable)
	}
	if a.t == nil {
		return "", fmt.Errorf("checkpoint %s is not on node %s, which does not take transfers: %w", ck.Name, a.o.NodeName, errdefs.ErrFailedPrecondition)
	}
	localID := ready[0].LocalID
	defer a.t.lock(localID)()
	if a.t.local.Holds(ctx, localID) {
		if err := a.checkCopy(ctx, ck, localID); err != nil {
			a.rec.Eventf(ck, nil, corev1.EventTypeWarning, "TransferRefused", "Transfer", "%s", kube.Truncate(err.Error(), 1024))
			return "", err
		}
		return localID, a.recordPulled(ctx, ck, localID, "Reused", "a copy was on the node already", a.d.DeleteCheckpoint)
	}
	nodes, err := a.peers(ctx)
	if err != nil {
		return "", err
	}
	if err := a.checkRuntime(ck, nodes); err != nil {
		return "", err
	}
	have, names, holders := a.ancestors(ctx, ck)
	// Senders that hold the nearest ancestor first: they can send
	// incrementally.
	slices.SortStableFunc(ready, func(x, y fbv1.Replica) int { return holders[x.Node] - holders[y.Node] })
	if err := a.setTransferring(ctx, ck, true, "Pulling", fmt.Sprintf("node %s is pulling it from node %s", a.o.NodeName, ready[0].Node)); err != nil {
		return "", err
	}
	var errs []string
	for _, rp := range ready {
		n := nodes[rp.Node]
		if n == nil || n.Status.Transfer == nil || !kube.IsTrue(n.Status.Conditions, fbv1.ConditionReady) {
			errs = append(errs, rp.Node+": not ready for transfers")
			continue
		}
		peer := transfer.Peer{Node: n.Name, Endpoint: n.Status.Transfer.Endpoint, CertPEM: []byte(n.Status.Transfer.Certificate)}
		// The image first (children mount it under the checkpoint):
		// from the sender when this node lacks it.
		img, err := a.t.client.EnsureImage(ctx, peer, rp.LocalID)
		if err != nil {
			errs = append(errs, rp.Node+": "+err.Error())
			continue
		}
		res, err := a.t.client.Pull(ctx, peer, transfer.Request{Checkpoint: rp.LocalID, UUID: ck.Status.SubvolumeUUID, Have: have, ImageDigest: img.Digest})
		if errdefs.IsAlreadyExists(err) && a.t.local.Holds(ctx, rp.LocalID) {
			if err := a.checkCopy(ctx, ck, rp.LocalID); err != nil {
				a.rec.Eventf(ck, nil, corev1.EventTypeWarning, "TransferRefused", "Transfer", "%s", kube.Truncate(err.Error(), 1024))
				return "", err
			}
			return rp.LocalID, a.recordPulled(ctx, ck, rp.LocalID, "Reused", "a copy was on the node already", a.d.DeleteCheckpoint)
		}
		if err != nil {
			errs = append(errs, rp.Node+": "+err.Error())
			continue
		}
		how := "full"
		if res.Parent != "" {
			how = "incremental from " + names[res.Parent]
		}
		msg := fmt.Sprintf("node %s pulled from node %s: %s, %d bytes in %d ms", a.o.NodeName, rp.Node, how, res.SendBytes+res.FileBytes, res.Duration.Milliseconds())
		if img.Fetched {
			msg += fmt.Sprintf("; image %s fetched from node %s: %d bytes in %d ms", img.Ref, rp.Node, img.Bytes, img.Duration.Milliseconds())
		}
		a.rec.Eventf(ck, nil, corev1.EventTypeNormal, "Transferred", "Transfer", "%s", msg)
		return rp.LocalID, a.recordPulled(ctx, ck, rp.LocalID, "Transferred", msg, a.d.DeleteCheckpoint)
	}
	msg := "pull failed: " + strings.Join(errs, "; ")
	a.rec.Eventf(ck, nil, corev1.EventTypeWarning, "TransferFailed", "Transfer", "%s", kube.Truncate(msg, 1024))
	_ = a.setTransferring(ctx, ck, false, "PullFailed", msg)
	// Retried (with backoff) by the sandbox's reconcile.
	return "", fmt.Errorf("checkpoint %s to node %s: %s: %w", ck.Name, a.o.NodeName, msg, errdefs.ErrUnavailable)
}

func (a *agent) peers(ctx context.Context) (map[string]*fbv1.ForkboxNode, error) {
	var nl fbv1.ForkboxNodeList
	if err := a.api.List(ctx, &nl); err != nil {
		return nil, err
	}
	out := map[string]*fbv1.ForkboxNode{}
	for i := range nl.Items {
		out[nl.Items[i].Name] = &nl.Items[i]
	}
	return out, nil
}

// checkRuntime refuses a memory checkpoint taken under another version of
// its runtime than this node's.
func (a *agent) checkRuntime(ck *fbv1.Checkpoint, nodes map[string]*fbv1.ForkboxNode) error {
	if ck.Status.Kind != daemon.KindMemory {
		return nil
	}
	origin, me := nodes[ck.Status.OriginNode], nodes[a.o.NodeName]
	if origin == nil || me == nil {
		return nil
	}
	want, got := versionOf(origin, ck.Status.Runtime), versionOf(me, ck.Status.Runtime)
	if want != got {
		return fmt.Errorf("memory checkpoint %s was taken on node %s under %s %q; node %s runs %q: a memory image restores only under the same version: %w",
			ck.Name, origin.Name, ck.Status.Runtime, want, a.o.NodeName, got, errdefs.ErrFailedPrecondition)
	}
	return nil
}

func versionOf(n *fbv1.ForkboxNode, rt fbv1.Runtime) string {
	for _, r := range n.Status.Runtimes {
		if r.Name == rt {
			return r.Version
		}
	}
	return ""
}

// ancestors returns the local IDs of ck's ancestors this node holds,
// nearest first, with their object names, and for each node the rank of
// the nearest one it holds (lower is nearer; len(chain) for none).
func (a *agent) ancestors(ctx context.Context, ck *fbv1.Checkpoint) ([]string, map[string]string, map[string]int) {
	var have []string
	names := map[string]string{}
	holders := map[string]int{}
	rank := 0
	for parent := ck.Status.Parent; parent != "" && rank < maxAncestry; rank++ {
		var anc fbv1.Checkpoint
		if err := a.api.Get(ctx, types.NamespacedName{Namespace: ck.Namespace, Name: parent}, &anc); err != nil {
			break
		}
		for _, rp := range anc.Status.Replicas {
			if !rp.Ready {
				continue
			}
			if _, seen := holders[rp.Node]; !seen {
				holders[rp.Node] = rank
			}
			if rp.Node == a.o.NodeName && a.t.local.Holds(ctx, rp.LocalID) && a.checkCopy(ctx, &anc, rp.LocalID) == nil {
				have = append(have, rp.LocalID)
				names[rp.LocalID] = anc.Name
			}
		}
		parent = anc.Status.Parent
	}
	for _, rp := range ck.Status.Replicas {
		if _, seen := holders[rp.Node]; !seen {
			holders[rp.Node] = rank + 1
		}
	}
	return have, names, holders
}

// maxAncestry bounds how far up a checkpoint's parents a pull looks.
const maxAncestry = 16

// recordPulled records this node's copy localID of ck (addReplica). A
// Checkpoint deleted while its copy came lists none of this node's: its
// last holder let it go, and nothing would ever remove this copy, which
// drop deletes; the pull fails NotFound.
func (a *agent) recordPulled(ctx context.Context, ck *fbv1.Checkpoint, localID, reason, msg string, drop func(context.Context, string) error) error {
	err := a.addReplica(ctx, ck, localID, reason, msg)
	if !apierrors.IsNotFound(err) {
		return err
	}
	if derr := drop(context.WithoutCancel(ctx), localID); derr != nil && !errdefs.IsNotFound(derr) {
		a.log.WarnContext(ctx, "could not delete the copy of a checkpoint deleted while it came", slog.String("checkpoint", localID), slog.Any("err", derr))
	}
	return fmt.Errorf("checkpoint %s was deleted while node %s pulled it: %w", ck.Name, a.o.NodeName, errdefs.ErrNotFound)
}

// addReplica records this node's ready copy of ck (and Transferring
// false), against the latest version of the object: other nodes write
// their replicas too.
func (a *agent) addReplica(ctx context.Context, ck *fbv1.Checkpoint, localID, reason, msg string) error {
	return a.patchCheckpoint(ctx, ck, func(c *fbv1.Checkpoint) {
		rs := slices.DeleteFunc(c.Status.Replicas, func(r fbv1.Replica) bool { return r.Node == a.o.NodeName })
		c.Status.Replicas = append(rs, fbv1.Replica{Node: a.o.NodeName, LocalID: localID, Ready: true})
		kube.SetCondition(&c.Status.Conditions, fbv1.ConditionTransferring, false, reason, kube.Truncate(a.o.NodeName+": "+msg, 4096), c.Generation)
	})
}

func (a *agent) setTransferring(ctx context.Context, ck *fbv1.Checkpoint, on bool, reason, msg string) error {
	return a.patchCheckpoint(ctx, ck, func(c *fbv1.Checkpoint) {
		kube.SetCondition(&c.Status.Conditions, fbv1.ConditionTransferring, on, reason, kube.Truncate(msg, 4096), c.Generation)
	})
}

// patchCheckpoint applies change to the status of the latest ck, retried
// on conflicts.
func (a *agent) patchCheckpoint(ctx context.Context, ck *fbv1.Checkpoint, change func(*fbv1.Checkpoint)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var cur fbv1.Checkpoint
		if err := a.api.Get(ctx, client.ObjectKeyFromObject(ck), &cur); err != nil {
			return err
		}
		if ck.UID != "" && cur.UID != ck.UID {
			// A later Checkpoint of that name: ck is gone.
			return apierrors.NewNotFound(fbv1.GroupVersion.WithResource("checkpoints").GroupResource(), ck.Name)
		}
		patch := client.MergeFromWithOptions(cur.DeepCopy(), client.MergeFromWithOptimisticLock{})
		change(&cur)
		if err := a.c.Status().Patch(ctx, &cur, patch); err != nil {
			return err
		}
		*ck = cur
		return nil
	})
}

// collectReplicas removes this node's copies of deleted Checkpoints that
// another node captured (this node's cache holds only its own; the
// heartbeat calls it). A node without transfers pulls no copies, but may
// hold some pulled before it restarted: it looks until no Checkpoint of
// another node lists one of its, then stops.
func (a *agent) collectReplicas(ctx context.Context) {
	if a.t == nil && a.noForeignCopies {
		return
	}
	gone, held, err := a.foreignCopies(ctx)
	if err != nil {
		return
	}
	a.noForeignCopies = !held
	for _, ck := range gone {
		if err := (&checkpoints{a}).remove(ctx, ck); err != nil {
			a.log.WarnContext(ctx, "removing a replica of a deleted checkpoint failed", slog.String("checkpoint", ck.Namespace+"/"+ck.Name), slog.Any("err", err))
		}
	}
}

// foreignCopies lists the deleted Checkpoints another node captured that
// name a copy on this node, and says whether any Checkpoint another node
// captured (deleted or not) names one.
func (a *agent) foreignCopies(ctx context.Context) (gone []*fbv1.Checkpoint, held bool, err error) {
	var l fbv1.CheckpointList
	if err := a.api.List(ctx, &l); err != nil {
		return nil, false, err
	}
	for i := range l.Items {
		ck := &l.Items[i]
		if ck.Spec.NodeName == a.o.NodeName || !slices.ContainsFunc(ck.Status.Replicas, func(r fbv1.Replica) bool { return r.Node == a.o.NodeName }) {
			continue
		}
		held = true
		if !ck.DeletionTimestamp.IsZero() {
			gone = append(gone, ck)
		}
	}
	return gone, held, nil
}
