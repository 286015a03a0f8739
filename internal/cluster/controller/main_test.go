package controller

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/clustertest"
	"github.com/forkbox/forkbox/internal/cluster/kube"
)

var plane clustertest.Plane

func TestMain(m *testing.M) { os.Exit(clustertest.Main(m, &plane)) }

// startController runs the controller against the test control plane
// until the test ends.
func startController(t *testing.T, mod ...func(*Options)) {
	t.Helper()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	mgr, err := ctrl.NewManager(plane.Config, manager.Options{Scheme: kube.NewScheme(), Logger: kube.SetLogger(log),
		Metrics: metricsserver.Options{BindAddress: "0"}, Cache: CacheOptions(clustertest.Namespace),
		// Each test runs a manager of its own with the same controllers.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	o := Options{Namespace: clustertest.Namespace, Retry: time.Second, Log: log}
	for _, m := range mod {
		m(&o)
	}
	if err := Setup(ctx, mgr, o); err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("controller: %v", err)
		}
	})
}

// namespace makes a namespace of the test's own.
func namespace(t *testing.T) string {
	t.Helper()
	name := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	name = fmt.Sprintf("%.50s-%d", name, time.Now().UnixNano()%100000)
	create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
	// envtest runs no namespace controller: delete what the test made, so
	// a later test (or -count) does not see it bound to its nodes.
	t.Cleanup(func() {
		ctx := context.Background()
		for _, o := range []client.Object{&fbv1.Environment{}, &fbv1.Fork{}, &fbv1.Sandbox{}, &fbv1.Checkpoint{}} {
			if err := plane.Client.DeleteAllOf(ctx, o, client.InNamespace(name)); err != nil {
				t.Errorf("clean up %T in %s: %v", o, name, err)
			}
		}
	})
	return name
}

func create(t *testing.T, o client.Object) {
	t.Helper()
	if err := plane.Client.Create(context.Background(), o); err != nil {
		t.Fatalf("create %T %s: %v", o, o.GetName(), err)
	}
}

// node registers a ForkboxNode as its agent would: a Lease renewed now
// for leaseFor, then the node Ready with slots. It is deleted when the
// test ends (nodes are cluster-wide).
func node(t *testing.T, name string, slots int32, leaseFor time.Duration, mod ...func(*fbv1.ForkboxNode)) *fbv1.ForkboxNode {
	t.Helper()
	ctx := context.Background()
	secs := int32(leaseFor / time.Second)
	now := metav1.NewMicroTime(time.Now())
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: clustertest.Namespace, Name: name},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &name, LeaseDurationSeconds: &secs, RenewTime: &now}}
	create(t, lease)
	n := &fbv1.ForkboxNode{ObjectMeta: metav1.ObjectMeta{Name: name}}
	create(t, n)
	n.Status = fbv1.ForkboxNodeStatus{LeaseName: name, Allocatable: fbv1.Allocatable{Slots: slots},
		Runtimes: []fbv1.RuntimeInfo{{Name: fbv1.RuntimeGVisor}, {Name: fbv1.RuntimeCrun}}}
	kube.SetCondition(&n.Status.Conditions, fbv1.ConditionReady, true, ReasonLeaseRenewed, "test", 0)
	for _, m := range mod {
		m(n)
	}
	if err := plane.Client.Status().Update(ctx, n); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		plane.Client.Delete(ctx, n)
		plane.Client.Delete(ctx, lease)
	})
	return n
}

// get reads an object afresh.
func get[T client.Object](t *testing.T, o T) T {
	t.Helper()
	if err := plane.Client.Get(context.Background(), client.ObjectKeyFromObject(o), o); err != nil {
		t.Fatalf("get %s: %v", o.GetName(), err)
	}
	return o
}

// update reads o afresh, changes it and writes it back, again on a
// conflict: the controller writes the same objects meanwhile.
func update[T client.Object](t *testing.T, o T, change func(T)) {
	t.Helper()
	write(t, o, change, func(ctx context.Context) error { return plane.Client.Update(ctx, o) })
}

// updateStatus is update of o's status.
func updateStatus[T client.Object](t *testing.T, o T, change func(T)) {
	t.Helper()
	write(t, o, change, func(ctx context.Context) error { return plane.Client.Status().Update(ctx, o) })
}

func write[T client.Object](t *testing.T, o T, change func(T), put func(context.Context) error) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		get(t, o)
		change(o)
		return put(context.Background())
	})
	if err != nil {
		t.Fatalf("write %s: %v", o.GetName(), err)
	}
}

// bound writes, as a node agent would, a Sandbox's phase.
func setPhase(t *testing.T, sb *fbv1.Sandbox, ph fbv1.SandboxPhase) {
	t.Helper()
	updateStatus(t, sb, func(sb *fbv1.Sandbox) { sb.Status.Phase = ph })
}

// ready writes, as the capturing node's agent would, a Checkpoint ready on
// the given nodes.
func setReady(t *testing.T, ck *fbv1.Checkpoint, nodes ...string) {
	t.Helper()
	updateStatus(t, ck, func(ck *fbv1.Checkpoint) {
		ck.Status.Phase, ck.Status.Image, ck.Status.Runtime = fbv1.CheckpointReady, "busybox", fbv1.RuntimeGVisor
		ck.Status.Replicas = nil
		for _, n := range nodes {
			ck.Status.Replicas = append(ck.Status.Replicas, fbv1.Replica{Node: n, LocalID: "ck-" + n, Ready: true})
		}
	})
}
