package controller

import (
	"context"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/clustertest"
)

// A closed Sandbox (spec.state Closed, reported Closed by its node, as
// this test plays it) holds no slot: a sandbox waiting for room is
// placed. Its object stays for the retention, counted from
// status.closedAt, and is deleted then, not before; it cannot be asked
// to run again. One closed before it was placed ran nowhere and is
// deleted at once. The retention is an hour: the test moves closedAt back
// past it rather than waiting for it.
func TestClosedSandboxRetention(t *testing.T) {
	plane.Need(t)
	const keep = time.Hour
	startController(t, func(o *Options) { o.Retention = keep })
	ns := namespace(t)
	node(t, "keep-a", 1, long)
	ctx := context.Background()

	one := sandbox(ns, "one")
	create(t, one)
	if got := placedOn(t, one); got != "keep-a" {
		t.Fatalf("one placed on %s, want keep-a", got)
	}
	setPhase(t, one, fbv1.PhaseRunning)
	two := sandbox(ns, "two")
	create(t, two)
	unschedulable(t, two, "full")

	// Closed: asked for, then reported by its node.
	update(t, one, func(sb *fbv1.Sandbox) { sb.Spec.State = fbv1.StateClosed })
	updateStatus(t, one, func(sb *fbv1.Sandbox) {
		now := metav1.Now()
		sb.Status.Phase, sb.Status.ClosedAt = fbv1.PhaseClosed, &now
	})
	if got := placedOn(t, two); got != "keep-a" {
		t.Fatalf("two placed on %s, want keep-a (the closed one's slot)", got)
	}
	again := get(t, one).DeepCopy()
	again.Spec.State = fbv1.StateRunning
	if err := plane.Client.Update(ctx, again); !errors.IsInvalid(err) {
		t.Fatalf("asking a closed sandbox to run again: got %v, want Invalid", err)
	}

	// Closed before it was placed: nothing to keep. Once it is gone, the
	// retention (one worker, taking the sandboxes' changes in order) has
	// also seen one closed, within its retention: one stays.
	waits := sandbox(ns, "waits")
	create(t, waits)
	unschedulable(t, waits, "full")
	update(t, waits, func(sb *fbv1.Sandbox) { sb.Spec.State = fbv1.StateClosed })
	goneObj(t, waits)
	if err := plane.Client.Get(ctx, client.ObjectKeyFromObject(one), &fbv1.Sandbox{}); err != nil {
		t.Fatalf("one, closed less than its retention (%s) ago: %v, want it kept", keep, err)
	}

	// Closed longer ago than the retention: deleted.
	updateStatus(t, one, func(sb *fbv1.Sandbox) {
		past := metav1.NewTime(time.Now().Add(-keep - time.Minute))
		sb.Status.ClosedAt = &past
	})
	clustertest.Eventually(t, 30*time.Second, "one deleted by the retention", func() (bool, string) {
		err := plane.Client.Get(ctx, client.ObjectKeyFromObject(one), &fbv1.Sandbox{})
		return errors.IsNotFound(err), fmt.Sprint(err)
	})
	if get(t, two).Spec.State == fbv1.StateClosed {
		t.Fatalf("two was closed")
	}
}
