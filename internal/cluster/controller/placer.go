package controller

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/kube"
	"github.com/forkbox/forkbox/internal/cluster/placement"
)

// maxAncestry bounds how far up a checkpoint's parents the placer looks.
const maxAncestry = 16

// placer binds unplaced Sandboxes to nodes: it sets spec.nodeName once.
// It runs one reconcile at a time, and remembers the bindings it made
// until its cache shows them (assumed), so two placements in a row never
// count the same free slot.
type placer struct {
	c     client.Client
	api   client.Reader // uncached: the latest status, after a conflict
	rec   recorder.EventRecorder
	log   *slog.Logger
	retry time.Duration
	// namespace holds the nodes' Leases.
	namespace string

	mu      sync.Mutex
	assumed map[string]string // sandbox UID → node, until the cache has it
}

func (p *placer) setup(mgr ctrl.Manager) error {
	// A node that changes (registers, gets Ready, frees a slot) and a
	// checkpoint that becomes ready can let a waiting sandbox fit.
	unplaced := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
		var l fbv1.SandboxList
		if err := p.c.List(ctx, &l, client.MatchingFields{fbv1.NodeNameField: ""}); err != nil {
			return nil
		}
		return requests(ptrs(l.Items))
	})
	// A checkpoint's sandboxes: those that name it, and those of the
	// environments it serves (their status names it; this cache can show
	// that before it shows the checkpoint ready, as a fresh one does).
	waiting := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		var l fbv1.SandboxList
		if err := p.c.List(ctx, &l, client.InNamespace(o.GetNamespace()), client.MatchingFields{sourceCheckpointField: o.GetName()}); err != nil {
			return nil
		}
		out := requests(ptrs(l.Items))
		var envs fbv1.EnvironmentList
		if err := p.c.List(ctx, &envs, client.InNamespace(o.GetNamespace()), client.MatchingFields{envCheckpointField: o.GetName()}); err != nil {
			return out
		}
		for _, e := range envs.Items {
			var of fbv1.SandboxList
			if err := p.c.List(ctx, &of, client.InNamespace(o.GetNamespace()), client.MatchingFields{sourceEnvField: e.Name}); err == nil {
				out = append(out, requests(ptrs(of.Items))...)
			}
		}
		return out
	})
	fromEnv := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		var l fbv1.SandboxList
		if err := p.c.List(ctx, &l, client.InNamespace(o.GetNamespace()), client.MatchingFields{sourceEnvField: o.GetName()}); err != nil {
			return nil
		}
		return requests(ptrs(l.Items))
	})
	// A node that goes (its object, its Lease) releases its deleted
	// sandboxes (releaseOrphan): nothing else changes them then.
	bound := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		var l fbv1.SandboxList
		if err := p.c.List(ctx, &l, client.MatchingFields{fbv1.NodeNameField: o.GetName()}); err != nil {
			return nil
		}
		return requests(slices.DeleteFunc(ptrs(l.Items), func(sb *fbv1.Sandbox) bool { return sb.DeletionTimestamp.IsZero() }))
	})
	return ctrl.NewControllerManagedBy(mgr).Named("placer").
		For(&fbv1.Sandbox{}).
		Watches(&fbv1.ForkboxNode{}, unplaced).
		Watches(&fbv1.ForkboxNode{}, bound, builder.WithPredicates(deleted)).
		Watches(&coordinationv1.Lease{}, bound, builder.WithPredicates(deleted)).
		Watches(&fbv1.Checkpoint{}, waiting, builder.WithPredicates(predicate.ResourceVersionChangedPredicate{})).
		Watches(&fbv1.Environment{}, fromEnv, builder.WithPredicates(predicate.ResourceVersionChangedPredicate{})).
		WithOptions(controller.Options{MaxConcurrentReconciles: 1}).
		Complete(p)
}

func (p *placer) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var sb fbv1.Sandbox
	if err := p.c.Get(ctx, req.NamespacedName, &sb); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !sb.DeletionTimestamp.IsZero() {
		return p.releaseOrphan(ctx, &sb)
	}
	if sb.Spec.NodeName != "" || sb.Spec.State == fbv1.StateClosed {
		return reconcile.Result{}, nil // placed, or closed before it was (the retention deletes it)
	}
	preq, wait, err := p.request(ctx, &sb)
	if err != nil {
		return reconcile.Result{}, err
	}
	if wait != "" {
		return reconcile.Result{}, p.pending(ctx, &sb, "WaitingForSource", wait)
	}
	node, perr, err := p.choose(ctx, p.c, sb.Namespace, preq)
	if err == nil && perr != nil && !refused(&sb) {
		// The cache can be a write behind what makes room (an uncordon,
		// a node Ready again, a sandbox closed): a first refusal, which
		// the gateway answers its caller with, is made again from the
		// API server. Later tries (each node's heartbeat brings one) read
		// the cache only.
		node, perr, err = p.choose(ctx, p.api, sb.Namespace, preq)
	}
	if err != nil {
		return reconcile.Result{}, err
	}
	if perr != nil {
		p.rec.Eventf(&sb, nil, "Warning", "FailedScheduling", "Schedule", "%s", kube.Truncate(perr.Error(), 1024))
		return reconcile.Result{RequeueAfter: p.retry}, p.pending(ctx, &sb, pendingReason(perr), perr.Error())
	}
	return reconcile.Result{}, p.bind(ctx, &sb, node)
}

// choose gathers the nodes as r shows them and places req among them.
func (p *placer) choose(ctx context.Context, r client.Reader, namespace string, req placement.Request) (node string, perr, err error) {
	nodes, err := p.nodes(ctx, r, namespace, &req)
	if err != nil {
		return "", nil, err
	}
	return p.place(ctx, nodes, req)
}

// place chooses a node for req and checks it on the API server before it
// is bound. The cache can be a write behind a cordon: a cordon written
// before a sandbox is created must hold for it (seen in CI: every node
// cordoned, then a create, and the sandbox was placed). A node that is no
// longer Ready and schedulable, or gone, counts as the API server has it,
// and the choice is made again. Each round rules one node out, so there are
// at most len(nodes) of them. perr is why no node fits, err a failed read.
func (p *placer) place(ctx context.Context, nodes []placement.Node, req placement.Request) (node string, perr, err error) {
	for {
		name, perr := placement.Place(nodes, req)
		if perr != nil {
			return "", perr, nil
		}
		i := slices.IndexFunc(nodes, func(n placement.Node) bool { return n.Name == name })
		var live fbv1.ForkboxNode
		if err := p.api.Get(ctx, client.ObjectKey{Name: name}, &live); errors.IsNotFound(err) {
			nodes = slices.Delete(nodes, i, i+1)
			continue
		} else if err != nil {
			return "", nil, fmt.Errorf("read node %s: %w", name, err)
		}
		ready := kube.IsTrue(live.Status.Conditions, fbv1.ConditionReady)
		if ready && !live.Spec.Unschedulable {
			return name, nil, nil
		}
		nodes[i].Ready, nodes[i].Unschedulable = ready, live.Spec.Unschedulable
	}
}

// request gathers what placement needs to know about sb, or why it must
// wait (its checkpoint or environment is not ready).
func (p *placer) request(ctx context.Context, sb *fbv1.Sandbox) (placement.Request, string, error) {
	r := placement.Request{Runtime: string(sb.Spec.Runtime), Image: sb.Spec.Image}
	src := sb.Spec.Source
	if src == nil {
		return r, "", nil
	}
	ckName := src.Checkpoint
	if src.Environment != "" {
		var env fbv1.Environment
		if err := p.c.Get(ctx, types.NamespacedName{Namespace: sb.Namespace, Name: src.Environment}, &env); err != nil {
			if errors.IsNotFound(err) {
				return r, fmt.Sprintf("environment %s does not exist", src.Environment), nil
			}
			return r, "", err
		}
		if env.Status.Checkpoint == "" {
			return r, fmt.Sprintf("environment %s has no built checkpoint yet", src.Environment), nil
		}
		ckName = env.Status.Checkpoint
	}
	var ck fbv1.Checkpoint
	if err := p.c.Get(ctx, types.NamespacedName{Namespace: sb.Namespace, Name: ckName}, &ck); err != nil {
		if errors.IsNotFound(err) {
			return r, fmt.Sprintf("checkpoint %s does not exist", ckName), nil
		}
		return r, "", err
	}
	if ck.Status.Phase != fbv1.CheckpointReady {
		return r, fmt.Sprintf("checkpoint %s is not ready (%s)", ckName, ck.Status.Phase), nil
	}
	r.Checkpoint = ckName
	if src.Resume {
		// What is replayed is in the ledger of the node that captured it.
		r.Only = ck.Status.OriginNode
		if r.Only == "" {
			return r, fmt.Sprintf("checkpoint %s names no origin node, whose ledger a resume replays", ckName), nil
		}
	}
	if r.Runtime == "" {
		r.Runtime = string(ck.Status.Runtime)
	}
	if r.Image == "" {
		r.Image = ck.Status.Image
	}
	for parent := ck.Status.Parent; parent != "" && len(r.Ancestors) < maxAncestry; {
		r.Ancestors = append(r.Ancestors, parent)
		var a fbv1.Checkpoint
		if err := p.c.Get(ctx, types.NamespacedName{Namespace: sb.Namespace, Name: parent}, &a); err != nil {
			break // an ancestor that is gone ends the chain
		}
		parent = a.Status.Parent
	}
	return r, "", nil
}

// nodes lists the nodes (as r shows them) with their load and which of
// req's checkpoints each holds, and says in req whether its checkpoint can
// be shipped: a ready copy is on a Ready node that serves transfers (and,
// for a memory checkpoint, which runtime version a receiver needs).
func (p *placer) nodes(ctx context.Context, r client.Reader, namespace string, req *placement.Request) ([]placement.Node, error) {
	var nl fbv1.ForkboxNodeList
	if err := r.List(ctx, &nl); err != nil {
		return nil, err
	}
	byName := map[string]*fbv1.ForkboxNode{}
	for i := range nl.Items {
		byName[nl.Items[i].Name] = &nl.Items[i]
	}
	if req.Checkpoint != "" {
		var ck fbv1.Checkpoint
		if err := r.Get(ctx, types.NamespacedName{Namespace: namespace, Name: req.Checkpoint}, &ck); err != nil {
			return nil, client.IgnoreNotFound(err)
		}
		for _, r := range ck.Status.Replicas {
			// A copy can be pulled only from a live node.
			if n := byName[r.Node]; r.Ready && n != nil && canTransfer(n) && kube.IsTrue(n.Status.Conditions, fbv1.ConditionReady) {
				req.CanTransfer = true
			}
		}
		if n := byName[ck.Status.OriginNode]; ck.Status.Kind == memoryKind && n != nil {
			req.RuntimeVersion, req.RuntimeVersionNode = runtimeVersion(n, string(ck.Status.Runtime)), n.Name
		}
	}
	used, err := p.load(ctx, r)
	if err != nil {
		return nil, err
	}
	held := map[string][]string{} // node → checkpoints of req it holds
	for _, name := range append([]string{req.Checkpoint}, req.Ancestors...) {
		if name == "" {
			continue
		}
		var ck fbv1.Checkpoint
		if err := r.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, &ck); err != nil {
			if errors.IsNotFound(err) {
				continue
			}
			return nil, err
		}
		for _, r := range ck.Status.Replicas {
			if r.Ready {
				held[r.Node] = append(held[r.Node], name)
			}
		}
	}
	out := make([]placement.Node, 0, len(nl.Items))
	for _, n := range nl.Items {
		pn := placement.Node{Name: n.Name, Ready: kube.IsTrue(n.Status.Conditions, fbv1.ConditionReady),
			Unschedulable: n.Spec.Unschedulable, Slots: int(n.Status.Allocatable.Slots), Used: used[n.Name],
			Images: n.Status.Images, Checkpoints: held[n.Name], CanReceive: canTransfer(&n), RuntimeVersions: map[string]string{}}
		for _, rt := range n.Status.Runtimes {
			pn.Runtimes = append(pn.Runtimes, string(rt.Name))
			pn.RuntimeVersions[string(rt.Name)] = rt.Version
		}
		out = append(out, pn)
	}
	return out, nil
}

// memoryKind is the kind of a checkpoint with memory (as the node agent
// reports it).
const memoryKind = "filesystem+memory"

// canTransfer: the node serves and receives checkpoint transfers.
func canTransfer(n *fbv1.ForkboxNode) bool {
	t := n.Status.Transfer
	return t != nil && t.Endpoint != "" && t.Certificate != ""
}

func runtimeVersion(n *fbv1.ForkboxNode, runtime string) string {
	for _, rt := range n.Status.Runtimes {
		if string(rt.Name) == runtime {
			return rt.Version
		}
	}
	return ""
}

// load counts the sandboxes on each node that hold a slot: bound, and
// counted by the node's daemon (fbv1.Sandbox.HoldsSlot: not closed, and
// not failed but with its local record kept; a closed one's object stays
// for its record; a sandbox asked to close holds its slot until its node
// has closed it), including bindings this placer made that its cache
// lacks yet.
func (p *placer) load(ctx context.Context, r client.Reader) (map[string]int, error) {
	var l fbv1.SandboxList
	if err := r.List(ctx, &l); err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	seen := map[string]bool{}
	used := map[string]int{}
	for _, sb := range l.Items {
		uid := string(sb.UID)
		seen[uid] = true
		node := sb.Spec.NodeName
		if node != "" {
			delete(p.assumed, uid)
		} else {
			node = p.assumed[uid]
		}
		if node != "" && sb.HoldsSlot() {
			used[node]++
		}
	}
	for uid := range p.assumed {
		if !seen[uid] {
			delete(p.assumed, uid)
		}
	}
	return used, nil
}

func (p *placer) bind(ctx context.Context, sb *fbv1.Sandbox, node string) error {
	patch := client.MergeFromWithOptions(sb.DeepCopy(), client.MergeFromWithOptimisticLock{})
	sb.Spec.NodeName = node
	if err := p.c.Patch(ctx, sb, patch); err != nil {
		return fmt.Errorf("bind sandbox %s to %s: %w", sb.Name, node, err)
	}
	p.mu.Lock()
	p.assumed[string(sb.UID)] = node
	p.mu.Unlock()
	p.log.InfoContext(ctx, "sandbox placed", slog.String("sandbox", sb.Namespace+"/"+sb.Name), slog.String("node", node))
	p.rec.Eventf(sb, nil, "Normal", "Scheduled", "Schedule", "placed on node %s", node)
	// The node's agent writes the status as soon as it sees the binding:
	// the condition goes on the status as it is then, never over it (a
	// merge patch replaces the whole list of conditions).
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		spatch := client.MergeFromWithOptions(sb.DeepCopy(), client.MergeFromWithOptimisticLock{})
		kube.SetCondition(&sb.Status.Conditions, fbv1.ConditionScheduled, true, "Placed", "placed on node "+node, sb.Generation)
		err := p.c.Status().Patch(ctx, sb, spatch)
		if errors.IsConflict(err) {
			if gerr := p.api.Get(ctx, client.ObjectKeyFromObject(sb), sb); gerr != nil {
				return gerr
			}
		}
		return err
	})
}

// Reasons of a Sandbox's Scheduled=False condition when no node fits.
const (
	// ReasonUnschedulable: no node has room (ResourceExhausted).
	ReasonUnschedulable = "Unschedulable"
	// ReasonCheckpointUnavailable: nodes have room but none holds the
	// checkpoint the sandbox starts from (FailedPrecondition, until
	// checkpoints can be shipped between nodes).
	ReasonCheckpointUnavailable = "CheckpointUnavailable"
	// ReasonNodeUnavailable: the one node the sandbox may run on (a
	// resumed session's) is not Ready or not registered (Unavailable).
	ReasonNodeUnavailable = "NodeUnavailable"
)

// refused reports whether the placer has already found no node for sb.
func refused(sb *fbv1.Sandbox) bool {
	c := meta.FindStatusCondition(sb.Status.Conditions, fbv1.ConditionScheduled)
	return c != nil && c.Status == metav1.ConditionFalse &&
		(c.Reason == ReasonUnschedulable || c.Reason == ReasonCheckpointUnavailable || c.Reason == ReasonNodeUnavailable)
}

// pendingReason names the class of a placement error.
func pendingReason(err error) string {
	switch {
	case errdefs.IsFailedPrecondition(err):
		return ReasonCheckpointUnavailable
	case errdefs.IsUnavailable(err):
		return ReasonNodeUnavailable
	}
	return ReasonUnschedulable
}

func (p *placer) pending(ctx context.Context, sb *fbv1.Sandbox, reason, msg string) error {
	patch := client.MergeFrom(sb.DeepCopy())
	changed := kube.SetCondition(&sb.Status.Conditions, fbv1.ConditionScheduled, false, reason, msg, sb.Generation)
	if sb.Status.Phase != fbv1.PhasePending || sb.Status.Message != kube.Truncate(msg, 4096) {
		sb.Status.Phase, sb.Status.Message, changed = fbv1.PhasePending, kube.Truncate(msg, 4096), true
	}
	if !changed {
		return nil
	}
	return p.c.Status().Patch(ctx, sb, patch)
}

// releaseOrphan drops the node agent's finalizer from a deleted sandbox
// whose node has left the cluster (nodeGone): nobody else would.
func (p *placer) releaseOrphan(ctx context.Context, sb *fbv1.Sandbox) (reconcile.Result, error) {
	if !controllerutil.ContainsFinalizer(sb, fbv1.SandboxFinalizer) {
		return reconcile.Result{}, nil
	}
	if sb.Spec.NodeName != "" {
		gone, wait, err := nodeGone(ctx, p.c, p.namespace, sb.Spec.NodeName)
		if err != nil || !gone {
			return reconcile.Result{RequeueAfter: wait}, err
		}
	}
	patch := client.MergeFrom(sb.DeepCopy())
	controllerutil.RemoveFinalizer(sb, fbv1.SandboxFinalizer)
	return reconcile.Result{}, client.IgnoreNotFound(p.c.Patch(ctx, sb, patch))
}
