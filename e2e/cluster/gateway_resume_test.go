package cluster

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fbclient "github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
)

// Resume through the gateway, as on one daemon: a closed session comes
// back from its last checkpoint with the exec after it replayed, on the
// node that holds its ledger; a restore of the same checkpoint has a
// clean history; a live session, and one without a checkpoint, are
// refused with FailedPrecondition.
func TestGatewayResume(t *testing.T) {
	c := gateway(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const name = "gw-session"
	sb, err := c.CreateSandbox(ctx, fbclient.CreateOptions{Image: env.image, Name: name, Runtime: string(fbv1.RuntimeCrun),
		Resources: fbclient.Resources{Memory: "256Mi"}})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close(context.Background())
	if err := sb.Credentials().Set(ctx, "API_KEY", "resume-s3cret", fbclient.CredentialOptions{}); err != nil {
		t.Fatal(err)
	}
	gsh(t, sb, "echo one > /root/a")
	ck, err := sb.Checkpoint(ctx, "ready")
	if err != nil {
		t.Fatal(err)
	}
	gsh(t, sb, "echo two >> /root/a")
	if _, err := c.Resume(ctx, name); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("resume of a live session: %v, want FailedPrecondition", err)
	}
	session := get(t, &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: gw.namespace, Name: name}})
	if err := sb.Close(ctx); err != nil {
		t.Fatal(err)
	}

	restored, err := c.RestoreSnapshot(ctx, ck.Id, fbclient.Overrides{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer restored.Close(context.Background())
	if got := gsh(t, restored, "cat /root/a"); got != "one\n" {
		t.Fatalf("restored: %q, want a clean history", got)
	}

	res, err := c.Resume(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Sandbox.Close(context.Background())
	if res.Checkpoint.GetId() != ck.Id || len(res.Replayed) != 1 || res.Replayed[0].Shell != "echo two >> /root/a" ||
		res.Replayed[0].Skipped || res.Replayed[0].ExitCode != 0 {
		t.Fatalf("resumed from %s, replayed %v; want %s and the one exec after it", res.Checkpoint.GetId(), res.Replayed, ck.Id)
	}
	if got := gsh(t, res.Sandbox, "cat /root/a"); got != "one\ntwo\n" {
		t.Fatalf("resumed: %q, want the exec after the checkpoint replayed", got)
	}
	// The session's credential came back with it and stayed: the node
	// syncs credentials to the object in the reconcile that resumed it
	// (before it reported Running), and the object names the session's.
	if got := gsh(t, res.Sandbox, `echo "$API_KEY"`); got != "resume-s3cret\n" {
		t.Fatalf("resumed session's credential: %q, want it back", got)
	}
	var l fbv1.SandboxList
	if err := plane.Client.List(ctx, &l); err != nil {
		t.Fatal(err)
	}
	for _, o := range l.Items {
		if o.Status.LocalID == res.Sandbox.ID {
			if o.Spec.NodeName != session.Spec.NodeName || o.Spec.Source == nil || !o.Spec.Source.Resume || o.Status.Resumed == nil {
				t.Fatalf("the resumed object: node %q (session's %q), source %+v, resumed %+v", o.Spec.NodeName, session.Spec.NodeName, o.Spec.Source, o.Status.Resumed)
			}
		}
	}

	fresh, err := c.CreateSandbox(ctx, fbclient.CreateOptions{Image: env.image, Name: "gw-nock", Runtime: string(fbv1.RuntimeCrun)})
	if err != nil {
		t.Fatal(err)
	}
	if err := fresh.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Resume(ctx, "gw-nock"); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("resume of a session without a checkpoint: %v, want FailedPrecondition", err)
	}
	if _, err := c.Resume(ctx, "no-such-session"); !errdefs.IsNotFound(err) {
		t.Fatalf("resume of no session: %v, want NotFound", err)
	}
}
