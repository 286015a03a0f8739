package clustertest

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/kube"
)

// nodeClient is a client with node's identity (NodeKubeconfig): the node
// agents' service account and ClusterRole, a token bound to node.
func nodeClient(t *testing.T, ctx context.Context, node string) client.Client {
	t.Helper()
	path := filepath.Join(t.TempDir(), node+".kubeconfig")
	if err := plane.NodeKubeconfig(ctx, node, path, ""); err != nil {
		t.Fatal(err)
	}
	return kubeconfigClient(t, path)
}

func kubeconfigClient(t *testing.T, path string) client.Client {
	t.Helper()
	cfg, err := kube.Config(path)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: kube.NewScheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// register does what a node agent does for node: its ForkboxNode with a
// transfer certificate and its capacity in the status, and its Lease.
func register(ctx context.Context, c client.Client, node, cert string, slots int32) error {
	n := &fbv1.ForkboxNode{ObjectMeta: metav1.ObjectMeta{Name: node}, Spec: fbv1.ForkboxNodeSpec{Endpoint: node + ":7070"}}
	if err := c.Create(ctx, n); err != nil {
		return err
	}
	n.Status.Transfer = &fbv1.TransferInfo{Endpoint: node + ":7071", Certificate: cert}
	n.Status.Allocatable = fbv1.Allocatable{Slots: slots, CPU: resource.NewQuantity(2, resource.DecimalSI)}
	if err := c.Status().Update(ctx, n); err != nil {
		return err
	}
	now := metav1.NewMicroTime(time.Now())
	return c.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: node},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node), LeaseDurationSeconds: ptr.To(int32(6)), RenewTime: &now}})
}

// wantForbidden fails t unless err is a Forbidden from the node identity
// policy whose message says every one of words.
func wantForbidden(t *testing.T, what string, err error, words ...string) {
	t.Helper()
	if !apierrors.IsForbidden(err) {
		t.Errorf("%s: got %v, want Forbidden", what, err)
		return
	}
	t.Logf("%s: %v", what, err)
	for _, w := range append([]string{"forkbox-node-identity"}, words...) {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s: got %q, want a message that says %q", what, err, w)
		}
	}
}

// TestNodeIdentity: against the real kube-apiserver with the policy of
// deploy/policy, a node agent (the node role, a token bound to its own
// node's pod) writes its own ForkboxNode, status, Lease and Sandboxes; it
// is refused, Forbidden and told why, when it writes another node's
// certificate, capacity, endpoint or Lease, registers a node that is not
// its own, reports another node's Sandbox or binds an unplaced one to
// itself, or changes another node's copy of a Checkpoint or what a
// Checkpoint it did not capture is; a token of the same account bound
// to no node writes nothing, one bound to a Node object is that node's;
// the controller and the gateway keep their rights.
func TestNodeIdentity(t *testing.T) {
	plane.Need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	t.Cleanup(func() { // what it made, so that it runs again (-count)
		ctx := context.Background()
		for _, o := range []client.Object{
			&fbv1.ForkboxNode{ObjectMeta: metav1.ObjectMeta{Name: "ident-a"}}, &fbv1.ForkboxNode{ObjectMeta: metav1.ObjectMeta{Name: "ident-b"}},
			&fbv1.ForkboxNode{ObjectMeta: metav1.ObjectMeta{Name: "ident-n"}}, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "ident-n"}},
			&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: "ident-a"}},
			&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: "ident-b"}},
			&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: "ident-n"}},
			&fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: "ident-on-b"}},
			&fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: "ident-unplaced"}},
			&fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: "ident-gw"}},
			&fbv1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: "ident-ck"}},
			&fbv1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: "ident-ck-unset"}},
		} {
			if err := plane.Client.Get(ctx, client.ObjectKeyFromObject(o), o); err == nil && len(o.GetFinalizers()) > 0 {
				o.SetFinalizers(nil)
				if err := plane.Client.Update(ctx, o); client.IgnoreNotFound(err) != nil {
					t.Errorf("clean up %s's finalizers: %v", o.GetName(), err)
				}
			}
			if err := plane.Client.Delete(ctx, o); client.IgnoreNotFound(err) != nil {
				t.Errorf("clean up %s: %v", o.GetName(), err)
			}
		}
	})
	a, b := nodeClient(t, ctx, "ident-a"), nodeClient(t, ctx, "ident-b")

	// Each writes its own: allowed.
	if err := register(ctx, a, "ident-a", "CERT-A", 8); err != nil {
		t.Fatalf("node a registers itself: %v", err)
	}
	if err := register(ctx, b, "ident-b", "CERT-B", 8); err != nil {
		t.Fatalf("node b registers itself: %v", err)
	}
	var own fbv1.ForkboxNode
	if err := a.Get(ctx, client.ObjectKey{Name: "ident-a"}, &own); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(own.DeepCopy())
	own.Status.Allocatable.Slots = 4
	own.Status.Transfer.Certificate = "CERT-A2"
	if err := a.Status().Patch(ctx, &own, patch); err != nil {
		t.Errorf("node a updates its own status: %v", err)
	}

	// a impersonates b.
	var nb fbv1.ForkboxNode
	if err := a.Get(ctx, client.ObjectKey{Name: "ident-b"}, &nb); err != nil {
		t.Fatalf("node a reads node b (allowed): %v", err)
	}
	p := client.MergeFrom(nb.DeepCopy())
	spoof := nb.DeepCopy()
	spoof.Status.Transfer.Certificate = "CERT-A"
	wantForbidden(t, "a publishes its certificate as b's", a.Status().Patch(ctx, spoof, p), "node ident-a", "forkboxnodes/status ident-b")
	spoof = nb.DeepCopy()
	spoof.Status.Allocatable.Slots = 100
	wantForbidden(t, "a changes b's capacity", a.Status().Update(ctx, spoof), "node ident-a", "ident-b")
	spoof = nb.DeepCopy()
	spoof.Spec.Endpoint = "ident-a:7070"
	wantForbidden(t, "a changes b's endpoint", a.Update(ctx, spoof), "node ident-a", "forkboxnodes ident-b")
	wantForbidden(t, "a registers a node of another name", a.Create(ctx, &fbv1.ForkboxNode{ObjectMeta: metav1.ObjectMeta{Name: "ident-c"}}),
		"node ident-a", "create forkboxnodes ident-c")
	var lb coordinationv1.Lease
	if err := a.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: "ident-b"}, &lb); err != nil {
		t.Fatal(err)
	}
	renewed := lb.DeepCopy()
	renewed.Spec.RenewTime = ptr.To(metav1.NewMicroTime(time.Now().Add(time.Hour)))
	wantForbidden(t, "a renews b's lease", a.Update(ctx, renewed), "node ident-a", "leases "+Namespace+"/ident-b")
	if err := a.Delete(ctx, &lb); !apierrors.IsForbidden(err) { // by RBAC: the node role deletes no Lease
		t.Errorf("a deletes b's lease: got %v, want Forbidden", err)
	}
	if err := plane.Client.Get(ctx, client.ObjectKey{Name: "ident-b"}, &nb); err != nil {
		t.Fatal(err)
	}
	if nb.Status.Transfer.Certificate != "CERT-B" || nb.Status.Allocatable.Slots != 8 || nb.Spec.Endpoint != "ident-b:7070" {
		t.Errorf("node b after a's attempts: got %+v %+v, want b's own", nb.Spec, nb.Status)
	}

	// Sandboxes: b's and an unplaced one (made by an admin, as the
	// gateway would).
	mk := func(name, node string) *fbv1.Sandbox {
		sb := &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: name},
			Spec: fbv1.SandboxSpec{Image: "busybox", NodeName: node}}
		if err := plane.Client.Create(ctx, sb); err != nil {
			t.Fatal(err)
		}
		return sb
	}
	onB, unplaced := mk("ident-on-b", "ident-b"), mk("ident-unplaced", "")
	rep := onB.DeepCopy()
	rep.Status.Phase, rep.Status.Endpoint = fbv1.PhaseRunning, "ident-a:7070"
	wantForbidden(t, "a reports b's sandbox", a.Status().Update(ctx, rep), "node ident-a", "sandboxes/status "+Namespace+"/ident-on-b", "bound to node ident-b")
	steal := unplaced.DeepCopy()
	steal.Spec.NodeName = "ident-a"
	wantForbidden(t, "a binds an unplaced sandbox to itself", a.Update(ctx, steal), "node ident-a", "bound to no node")
	rep = onB.DeepCopy()
	rep.Status.Phase, rep.Status.Endpoint = fbv1.PhaseRunning, "ident-b:7070"
	if err := b.Status().Update(ctx, rep); err != nil {
		t.Errorf("b reports its own sandbox: %v", err)
	}
	// b's own Sandbox: its finalizer, nothing else of the main resource.
	if err := b.Get(ctx, client.ObjectKeyFromObject(onB), onB); err != nil {
		t.Fatal(err)
	}
	forgeSb := onB.DeepCopy()
	forgeSb.Spec.WorkingDir = "/evil"
	wantForbidden(t, "b changes its sandbox's spec", b.Update(ctx, forgeSb), "node ident-b", "may not change sandboxes "+Namespace+"/ident-on-b")
	forgeSb = onB.DeepCopy()
	forgeSb.Labels = map[string]string{"x": "y"}
	wantForbidden(t, "b labels its sandbox", b.Update(ctx, forgeSb), "may not change sandboxes")
	forgeSb = onB.DeepCopy()
	forgeSb.Finalizers = []string{"example.com/other"}
	wantForbidden(t, "b adds another finalizer to its sandbox", b.Update(ctx, forgeSb), "may not change sandboxes")
	finSb := onB.DeepCopy()
	finSb.Finalizers = []string{fbv1.SandboxFinalizer}
	if err := b.Update(ctx, finSb); err != nil {
		t.Errorf("b adds its finalizer to its sandbox: %v", err)
	}
	// Closing is the owner's word (spec.state); the node reports it
	// Closed and lets go of its finalizer on the object that stays.
	forgeSb = finSb.DeepCopy()
	forgeSb.Spec.State = fbv1.StateClosed
	wantForbidden(t, "b closes its sandbox in the spec", b.Update(ctx, forgeSb), "may not change sandboxes")
	closed := finSb.DeepCopy()
	now := metav1.Now()
	closed.Status.Phase, closed.Status.ClosedAt = fbv1.PhaseClosed, &now
	if err := b.Status().Update(ctx, closed); err != nil {
		t.Errorf("b reports its sandbox closed: %v", err)
	}
	closed.Finalizers = nil
	if err := b.Update(ctx, closed); err != nil {
		t.Errorf("b drops its finalizer from its closed sandbox: %v", err)
	}

	// Checkpoints: b captured one; a records its own copy and its pull,
	// but neither touches b's copy nor rewrites what the checkpoint is.
	ck := &fbv1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: "ident-ck"},
		Spec: fbv1.CheckpointSpec{Sandbox: "ident-on-b", NodeName: "ident-b", Parent: "ident-base"}}
	if err := plane.Client.Create(ctx, ck); err != nil {
		t.Fatal(err)
	}
	ck.Status = fbv1.CheckpointStatus{Phase: fbv1.CheckpointReady, OriginNode: "ident-a", SubvolumeUUID: "uuid-b", Kind: "filesystem"}
	wantForbidden(t, "b names a the origin of its capture", b.Status().Update(ctx, ck.DeepCopy()), "node ident-b", "may not name node ident-a the origin")
	ck.Status.OriginNode, ck.Status.Parent = "ident-b", "ident-victim"
	wantForbidden(t, "b forges its capture's parent", b.Status().Update(ctx, ck.DeepCopy()), "node ident-b", "may not set the parent of checkpoint "+Namespace+"/ident-ck to ident-victim")
	ck.Status.Parent = "ident-base"
	ck.Status.Replicas = []fbv1.Replica{{Node: "ident-b", LocalID: "ck-1", Ready: true}}
	if err := b.Status().Update(ctx, ck); err != nil {
		t.Fatalf("b records the checkpoint it captured: %v", err)
	}
	mine := ck.DeepCopy()
	mine.Status.Replicas = append(mine.Status.Replicas, fbv1.Replica{Node: "ident-a", LocalID: "ck-1", Ready: true})
	kube.SetCondition(&mine.Status.Conditions, fbv1.ConditionTransferring, false, "Transferred", "ident-a pulled it", mine.Generation)
	if err := a.Status().Update(ctx, mine); err != nil {
		t.Fatalf("a records its own copy: %v", err)
	}
	drop := mine.DeepCopy()
	drop.Status.Replicas = drop.Status.Replicas[1:]
	wantForbidden(t, "a drops b's copy", a.Status().Update(ctx, drop), "node ident-a", "other nodes' replicas of checkpoint "+Namespace+"/ident-ck")
	forge := mine.DeepCopy()
	forge.Status.Replicas[0].LocalID = "ck-evil"
	wantForbidden(t, "a rewrites b's copy", a.Status().Update(ctx, forge), "other nodes' replicas")
	forge = mine.DeepCopy()
	forge.Status.SubvolumeUUID = "uuid-a"
	wantForbidden(t, "a rewrites the checkpoint's subvolume", a.Status().Update(ctx, forge), "node ident-a", "may not change what checkpoint "+Namespace+"/ident-ck")
	forge = mine.DeepCopy()
	forge.Status.Phase = fbv1.CheckpointFailed
	wantForbidden(t, "a fails b's checkpoint", a.Status().Update(ctx, forge), "may not change what checkpoint")
	forge = mine.DeepCopy()
	forge.Status.CapturedAt = &metav1.MicroTime{Time: time.Unix(1, 0)}
	wantForbidden(t, "a moves b's capture time (the checkpoints' order)", a.Status().Update(ctx, forge), "may not change what checkpoint")
	origin := mine.DeepCopy()
	origin.Status.Message = "b says"
	origin.Status.CapturedAt = &metav1.MicroTime{Time: time.Now()}
	if err := b.Status().Update(ctx, origin); err != nil {
		t.Errorf("b, the origin, updates its checkpoint: %v", err)
	}

	// The Checkpoint itself (not its status): its capturing node adds and
	// drops its finalizer, no node changes anything else, and no node
	// binds an unset one to itself.
	if err := b.Get(ctx, client.ObjectKeyFromObject(ck), ck); err != nil {
		t.Fatal(err)
	}
	withFin := ck.DeepCopy()
	withFin.Finalizers = []string{fbv1.CheckpointFinalizer}
	wantForbidden(t, "a adds the replicas finalizer to b's capture", a.Update(ctx, withFin.DeepCopy()), "node ident-a", "may not update checkpoint "+Namespace+"/ident-ck, which node ident-b captures", "only the capturing node adds")
	owned := ck.DeepCopy()
	owned.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "gone", UID: "00000000-0000-0000-0000-000000000000"}}
	wantForbidden(t, "b gives its capture a bogus owner", b.Update(ctx, owned), "may not change checkpoints "+Namespace+"/ident-ck")
	owned = ck.DeepCopy()
	owned.Annotations = map[string]string{"x": "y"}
	wantForbidden(t, "b annotates its capture", b.Update(ctx, owned), "may not change checkpoints")
	if err := b.Update(ctx, withFin); err != nil {
		t.Fatalf("b adds the replicas finalizer to its capture: %v", err)
	}
	noFin := withFin.DeepCopy()
	noFin.Finalizers = nil
	wantForbidden(t, "b drops the finalizer of a live checkpoint", b.Update(ctx, noFin), "may not drop finalizer "+fbv1.CheckpointFinalizer, "not being deleted")
	unset := &fbv1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: "ident-ck-unset"}, Spec: fbv1.CheckpointSpec{Sandbox: "ident-unplaced"}}
	if err := plane.Client.Create(ctx, unset); err != nil {
		t.Fatal(err)
	}
	claim := unset.DeepCopy()
	claim.Spec.NodeName = "ident-a"
	wantForbidden(t, "a binds an unset checkpoint to itself", a.Update(ctx, claim), "node ident-a", "which is bound to no node")
	// Deleted while a holds a copy: b may not let it go until a's entry
	// is gone (a's copy would be orphaned), then may.
	if err := plane.Client.Delete(ctx, withFin); err != nil {
		t.Fatal(err)
	}
	if err := b.Get(ctx, client.ObjectKeyFromObject(ck), ck); err != nil {
		t.Fatal(err)
	}
	noFin = ck.DeepCopy()
	noFin.Finalizers = nil
	wantForbidden(t, "b drops the finalizer while a holds a copy", b.Update(ctx, noFin), "may not drop finalizer", "other nodes still hold copies")
	gone := ck.DeepCopy()
	gone.Status.Replicas = slices.DeleteFunc(gone.Status.Replicas, func(r fbv1.Replica) bool { return r.Node == "ident-a" })
	if err := a.Status().Update(ctx, gone); err != nil {
		t.Fatalf("a removes its copy of the deleted checkpoint: %v", err)
	}
	// a holds no copy now, b does: a may not let it go, and once b's
	// copy is gone too, a, the last holder, may.
	if err := a.Get(ctx, client.ObjectKeyFromObject(ck), ck); err != nil {
		t.Fatal(err)
	}
	noFin = ck.DeepCopy()
	noFin.Finalizers = nil
	wantForbidden(t, "a drops the finalizer while b holds a copy", a.Update(ctx, noFin), "node ident-a", "other nodes still hold copies")
	ck.Status.Replicas = nil
	if err := b.Status().Update(ctx, ck); err != nil {
		t.Fatalf("b removes its copy of the deleted checkpoint: %v", err)
	}
	ck.Finalizers = nil
	if err := a.Update(ctx, ck); err != nil {
		t.Errorf("a, the last holder, drops the finalizer: %v", err)
	}

	// The same account with a token bound to nothing is no node.
	tok, err := plane.Token(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	unbound := filepath.Join(t.TempDir(), "unbound.kubeconfig")
	if err := plane.writeTokenKubeconfig(tok, unbound, ""); err != nil {
		t.Fatal(err)
	}
	u := kubeconfigClient(t, unbound)
	if err := u.Get(ctx, client.ObjectKey{Name: "ident-a"}, &own); err != nil {
		t.Fatalf("an unbound token reads (allowed): %v", err)
	}
	wantForbidden(t, "an unbound token writes a node's status", u.Status().Update(ctx, &own), "bound to no node")

	// An agent outside a pod: a token bound to its Node object is that
	// node's too.
	if err := plane.Client.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "ident-n"}}); err != nil {
		t.Fatal(err)
	}
	var kn corev1.Node
	if err := plane.Client.Get(ctx, client.ObjectKey{Name: "ident-n"}, &kn); err != nil {
		t.Fatal(err)
	}
	if tok, err = plane.Token(ctx, &authenticationv1.BoundObjectReference{Kind: "Node", APIVersion: "v1", Name: kn.Name, UID: kn.UID}); err != nil {
		t.Fatal(err)
	}
	nodeBound := filepath.Join(t.TempDir(), "node-bound.kubeconfig")
	if err := plane.writeTokenKubeconfig(tok, nodeBound, ""); err != nil {
		t.Fatal(err)
	}
	n := kubeconfigClient(t, nodeBound)
	if err := register(ctx, n, "ident-n", "CERT-N", 2); err != nil {
		t.Errorf("a node-bound token registers its node: %v", err)
	}
	wantForbidden(t, "a node-bound token writes another node", n.Status().Update(ctx, &own), "node ident-n", "ident-a")

	// The controller keeps its rights over every node.
	ctrlPath := filepath.Join(t.TempDir(), "controller.kubeconfig")
	if err := plane.UserKubeconfig(ctx, "forkbox-controller", filepath.Join(Root(), "deploy", "rbac", "controller", "role.yaml"), ctrlPath); err != nil {
		t.Fatal(err)
	}
	ctrl := kubeconfigClient(t, ctrlPath)
	if err := ctrl.Get(ctx, client.ObjectKey{Name: "ident-b"}, &nb); err != nil {
		t.Fatal(err)
	}
	kube.SetCondition(&nb.Status.Conditions, fbv1.ConditionReady, false, "LeaseExpired", "test", nb.Generation)
	if err := ctrl.Status().Update(ctx, &nb); err != nil {
		t.Errorf("the controller marks node b not ready: %v", err)
	}
	gwPath := filepath.Join(t.TempDir(), "gateway.kubeconfig")
	if err := plane.UserKubeconfig(ctx, "forkbox-gateway", filepath.Join(Root(), "deploy", "rbac", "gateway", "role.yaml"), gwPath); err != nil {
		t.Fatal(err)
	}
	gw := kubeconfigClient(t, gwPath)
	if err := gw.Create(ctx, &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: "ident-gw"}, Spec: fbv1.SandboxSpec{Image: "busybox"}}); err != nil {
		t.Errorf("the gateway creates a sandbox: %v", err)
	}
}
