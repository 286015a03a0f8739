package gateway

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/kube"
)

// A child that is not running by the deadline says how it was when last
// read: the phase, node and message of one that was made, the fork's own
// status for one that was not.
func TestForkDeadlineSaysWhereChildStopped(t *testing.T) {
	fk := &fbv1.Fork{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "fk"}, Spec: fbv1.ForkSpec{Count: 2},
		Status: fbv1.ForkStatus{Phase: fbv1.ForkForking, Message: "0 of 2 children running"}}
	child := &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "fk-0"},
		Spec:   fbv1.SandboxSpec{NodeName: "node-1"},
		Status: fbv1.SandboxStatus{Phase: fbv1.PhasePending, Message: "restoring checkpoint ck-1"}}
	c := fake.NewClientBuilder().WithScheme(kube.NewScheme()).WithObjects(fk, child).WithStatusSubresource(fk, child).Build()
	g := &Gateway{o: Options{Namespace: "ns", MaxWait: 50 * time.Millisecond}, c: c, api: c, changed: newNotifier(),
		log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	f := &forkCall{g: g, start: time.Now(), fk: fk, done: map[int]*v1.ForkChild{}, seen: map[int]string{}}
	if err := f.children(context.Background(), nil); !errdefs.IsDeadlineExceeded(err) {
		t.Fatalf("children: got %v, want DeadlineExceeded", err)
	}
	for i, want := range []string{`phase "Pending" on node "node-1": restoring checkpoint ck-1`, `not made yet; the fork is "Forking": 0 of 2 children running`} {
		got := f.child(i)
		if got.ErrorClass != errdefs.ClassName(errdefs.ErrDeadlineExceeded) || !strings.Contains(got.Error, want) {
			t.Errorf("child %d: got %q (%s), want DeadlineExceeded saying %q", i, got.Error, got.ErrorClass, want)
		}
	}
}

// A child that failed is deleted, on its node or unplaced: the caller
// learns only its error, and one failed on its node would hold that
// node's slot until closed.
func TestFailedForkChildIsDeleted(t *testing.T) {
	fk := &fbv1.Fork{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "fk"}, Spec: fbv1.ForkSpec{Count: 1}}
	child := &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "fk-0"},
		Spec: fbv1.SandboxSpec{NodeName: "node-1"},
		Status: fbv1.SandboxStatus{Phase: fbv1.PhaseFailed, LocalID: "sb-1", Message: "the sandbox is failed on its node",
			Conditions: []metav1.Condition{{Type: fbv1.ConditionReady, Status: metav1.ConditionFalse, Reason: string(fbv1.PhaseFailed)}}}}
	c := fake.NewClientBuilder().WithScheme(kube.NewScheme()).WithObjects(fk, child).WithStatusSubresource(fk, child).Build()
	g := &Gateway{o: Options{Namespace: "ns", MaxWait: time.Minute}, c: c, api: c, changed: newNotifier(),
		log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	f := &forkCall{g: g, start: time.Now(), fk: fk, done: map[int]*v1.ForkChild{}, seen: map[int]string{}}
	if err := f.children(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if got := f.child(0); got.Error == "" || !strings.Contains(got.Error, "failed on node node-1") {
		t.Errorf("child 0: got %+v, want its failure", got)
	}
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: "fk-0"}, &fbv1.Sandbox{}); !apierrors.IsNotFound(err) {
		t.Errorf("the failed child: got %v, want it deleted", err)
	}
}
