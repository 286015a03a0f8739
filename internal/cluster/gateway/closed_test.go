package gateway

import (
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/kube"
)

// The reads of a closed sandbox's ledger go to the node that ran it,
// Unavailable (naming the node and why) when that node is gone or not
// ready; the calls that need it running are FailedPrecondition, as on one
// host, without asking any node.
func TestRouteOfClosedSandbox(t *testing.T) {
	closed := func(name, node string) *fbv1.Sandbox {
		return &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
			Spec:   fbv1.SandboxSpec{Image: "busybox", State: fbv1.StateClosed, NodeName: node},
			Status: fbv1.SandboxStatus{Phase: fbv1.PhaseClosed, LocalID: "sb-" + name}}
	}
	ready := &fbv1.ForkboxNode{ObjectMeta: metav1.ObjectMeta{Name: "up"}, Spec: fbv1.ForkboxNodeSpec{Endpoint: "10.0.0.1:7070"}}
	kube.SetCondition(&ready.Status.Conditions, fbv1.ConditionReady, true, "LeaseRenewed", "", 0)
	down := &fbv1.ForkboxNode{ObjectMeta: metav1.ObjectMeta{Name: "down"}, Spec: fbv1.ForkboxNodeSpec{Endpoint: "10.0.0.2:7070"}}
	kube.SetCondition(&down.Status.Conditions, fbv1.ConditionReady, false, "LeaseExpired", "the node's Lease lapsed", 0)
	c := fake.NewClientBuilder().WithScheme(kube.NewScheme()).
		WithObjects(ready, down, closed("on-up", "up"), closed("on-down", "down"), closed("on-gone", "gone"),
			&fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "closing"},
				Spec:   fbv1.SandboxSpec{Image: "busybox", State: fbv1.StateClosed, NodeName: "up"},
				Status: fbv1.SandboxStatus{Phase: fbv1.PhaseRunning, LocalID: "sb-closing"}}).
		Build()
	g := &Gateway{o: Options{Namespace: "ns"}, c: c, api: c, nodes: newNodeClients("node-token")}
	ctx := context.Background()

	r, err := g.routeLedger(ctx, "on-up")
	if err != nil || r.id != "sb-on-up" {
		t.Fatalf("ledger of a closed sandbox of a ready node: got %+v, %v; want a route to sb-on-up", r, err)
	}
	for _, tc := range []struct{ ref, want string }{
		{"on-down", "node down, which is not ready (LeaseExpired: the node's Lease lapsed)"},
		{"on-gone", "node gone, which is gone from the cluster"},
	} {
		if _, err := g.routeLedger(ctx, tc.ref); !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ledger of %s: got %v, want Unavailable saying %q", tc.ref, err, tc.want)
		}
	}
	for _, tc := range []struct{ ref, want string }{{"on-up", "sb-on-up is closed"}, {"closing", "sb-closing is closing"}} {
		if _, err := g.route(ctx, tc.ref); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("a call on %s: got %v, want FailedPrecondition saying %q", tc.ref, err, tc.want)
		}
	}
}

// Events show checkpoint tags as the user gave them: the suffix that
// binds a node's ledger tag to its object goes; nothing else changes.
func TestUserTags(t *testing.T) {
	const uid = "0b7d5bd4-8a1e-4c46-9f0c-2a1d55d0c2a7"
	for in, want := range map[string]string{
		`{"snapshot":"ck-1","tag":"after-install@k8s-` + uid + `"}`: `{"snapshot":"ck-1","tag":"after-install"}`,
		`{"tag":"k8s-` + uid + `"}`:                                 `{"tag":"k8s-` + uid + `"}`,
		`{"shell":"echo x@k8s-` + uid + `"}`:                        `{"shell":"echo x@k8s-` + uid + `"}`,
		`{"tag":"a@k8s-short"}`:                                     `{"tag":"a@k8s-short"}`,
		`not json @k8s-`:                                            `not json @k8s-`,
	} {
		if got := userTags(in); got != want {
			t.Errorf("userTags(%s) = %s, want %s", in, got, want)
		}
	}
}
