package controller

import (
	"context"
	"io"
	"log/slog"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/clustertest"
	"github.com/forkbox/forkbox/internal/cluster/kube"
)

// A child the forker made and its cache does not show yet (the Fork's
// status, written after the child's create, can reach the forker first) is
// not recorded as deleted: the API server is asked. One that is gone there
// is.
func TestForkChildBehindCache(t *testing.T) {
	ctx := context.Background()
	scheme := kube.NewScheme()
	fk := &fbv1.Fork{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "fk", UID: types.UID("fk-uid")},
		Spec: fbv1.ForkSpec{Count: 3},
		Status: fbv1.ForkStatus{Children: []fbv1.ForkChild{
			{Name: "fk-0", Phase: fbv1.PhaseRunning}, {Name: "fk-1", Phase: fbv1.PhaseRunning}, {Name: "fk-2", Phase: fbv1.PhaseRunning}}}}
	child := func(name string) client.Object {
		sb := &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: map[string]string{fbv1.ForkLabel: "fk"}},
			Status: fbv1.SandboxStatus{Phase: fbv1.PhaseRunning}}
		if err := controllerutil.SetControllerReference(fk, sb, scheme); err != nil {
			t.Fatal(err)
		}
		return sb
	}
	build := func(objs ...client.Object) client.Client {
		return fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build()
	}
	// fk-1 is on the API server only; fk-2 was deleted.
	api := build(child("fk-0"), child("fk-1"))
	f := &forker{c: clustertest.StaleCache{Client: api, Stale: build(child("fk-0"))}, api: api,
		rec: events.NewFakeRecorder(10), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if err := f.children(ctx, fk, &fbv1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "ck"}}); err != nil {
		t.Fatal(err)
	}
	want := []fbv1.SandboxPhase{fbv1.PhaseRunning, fbv1.PhaseRunning, fbv1.PhaseTerminating}
	for i, c := range fk.Status.Children {
		if c.Phase != want[i] {
			t.Errorf("child %s: %s (%q), want %s", c.Name, c.Phase, c.Message, want[i])
		}
	}
	if fk.Status.Ready != 2 {
		t.Errorf("ready %d, want 2", fk.Status.Ready)
	}
}
