package controller

import (
	"context"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
)

// The generated CRDs install and the API server enforces their schema
// and rules: bad objects are refused with a message naming the rule.
func TestCRDsRefuseBadObjects(t *testing.T) {
	plane.Need(t)
	ns := namespace(t)
	meta := func(name string) metav1.ObjectMeta { return metav1.ObjectMeta{Namespace: ns, Name: name} }
	q := resource.MustParse
	for _, tc := range []struct {
		name string
		obj  client.Object
		want string // in the error; "" = accepted
	}{
		{"sandbox from an image", &fbv1.Sandbox{ObjectMeta: meta("ok"), Spec: fbv1.SandboxSpec{Image: "busybox",
			Resources: fbv1.Resources{CPU: &[]resource.Quantity{q("500m")}[0]}}}, ""},
		{"sandbox with neither image nor source", &fbv1.Sandbox{ObjectMeta: meta("empty")}, "image or source is required"},
		{"sandbox with two sources", &fbv1.Sandbox{ObjectMeta: meta("two"), Spec: fbv1.SandboxSpec{
			Source: &fbv1.SandboxSource{Checkpoint: "a", Environment: "b"}}}, "exactly one of checkpoint or environment"},
		{"unknown runtime", &fbv1.Sandbox{ObjectMeta: meta("kvm"), Spec: fbv1.SandboxSpec{Image: "busybox", Runtime: "kvm"}}, "spec.runtime"},
		{"unknown state", &fbv1.Sandbox{ObjectMeta: meta("state"), Spec: fbv1.SandboxSpec{Image: "busybox", State: "Flying"}}, "spec.state"},
		{"bad env name", &fbv1.Sandbox{ObjectMeta: meta("env"), Spec: fbv1.SandboxSpec{Image: "busybox",
			Env: []fbv1.EnvVar{{Name: "1BAD=x"}}}}, "spec.env[0].name"},
		{"credential file outside /run/secrets", &fbv1.Sandbox{ObjectMeta: meta("cred"), Spec: fbv1.SandboxSpec{Image: "busybox",
			Credentials: []fbv1.Credential{{Name: "TOKEN", SecretRef: fbv1.SecretKeyRef{Name: "s", Key: "k"}, File: "../etc/passwd"}}}},
			"spec.credentials[0].file"},
		{"bad egress mode", &fbv1.Sandbox{ObjectMeta: meta("egress"), Spec: fbv1.SandboxSpec{Image: "busybox",
			Egress: &fbv1.Egress{Mode: "open"}}}, "spec.egress.mode"},
		{"fork of nothing", &fbv1.Fork{ObjectMeta: meta("f0"), Spec: fbv1.ForkSpec{Count: 1}}, "exactly one of sandbox or checkpoint"},
		{"fork of 0", &fbv1.Fork{ObjectMeta: meta("f1"), Spec: fbv1.ForkSpec{Count: 0, Source: fbv1.ForkSource{Sandbox: "s"}}}, "spec.count"},
		{"fork of 101", &fbv1.Fork{ObjectMeta: meta("f2"), Spec: fbv1.ForkSpec{Count: 101, Source: fbv1.ForkSource{Sandbox: "s"}}}, "spec.count"},
		{"checkpoint tag with a path", &fbv1.Checkpoint{ObjectMeta: meta("ck"), Spec: fbv1.CheckpointSpec{Sandbox: "s", Tag: "../x"}}, "spec.tag"},
		{"environment without image", &fbv1.Environment{ObjectMeta: meta("env")}, "spec.image"},
		{"warm pool of 33", &fbv1.Environment{ObjectMeta: meta("env33"), Spec: fbv1.EnvironmentSpec{Image: "busybox", PoolSize: 33}}, "spec.poolSize"},
		{"warm pool of -1", &fbv1.Environment{ObjectMeta: meta("env-1"), Spec: fbv1.EnvironmentSpec{Image: "busybox", PoolSize: -1}}, "spec.poolSize"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := plane.Client.Create(context.Background(), tc.obj)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("got %v, want it accepted", err)
			case tc.want != "" && (err == nil || !errors.IsInvalid(err) || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v, want an Invalid error naming %q", err, tc.want)
			}
		})
	}
	// Defaults apply, and nodeName is set once.
	sb := get(t, &fbv1.Sandbox{ObjectMeta: meta("ok")})
	if sb.Spec.State != fbv1.StateRunning {
		t.Fatalf("got state %q, want the default Running", sb.Spec.State)
	}
	sb.Spec.NodeName = "n1"
	if err := plane.Client.Update(context.Background(), sb); err != nil {
		t.Fatalf("set nodeName: %v", err)
	}
	for _, change := range []func(*fbv1.Sandbox){
		func(s *fbv1.Sandbox) { s.Spec.NodeName = "n2" },
		func(s *fbv1.Sandbox) { s.Spec.NodeName = "" },
		func(s *fbv1.Sandbox) { s.Spec.Image = "other" },
	} {
		sb := get(t, &fbv1.Sandbox{ObjectMeta: meta("ok")})
		change(sb)
		if err := plane.Client.Update(context.Background(), sb); err == nil || !errors.IsInvalid(err) {
			t.Fatalf("changing a set-once field: got %v, want Invalid", err)
		}
	}
	// A Checkpoint made without the optional tag and memory gets its
	// nodeName set (once); nothing else of its spec changes after.
	create(t, &fbv1.Checkpoint{ObjectMeta: meta("bare"), Spec: fbv1.CheckpointSpec{Sandbox: "ok"}})
	ck := get(t, &fbv1.Checkpoint{ObjectMeta: meta("bare")})
	ck.Spec.NodeName = "n1"
	if err := plane.Client.Update(context.Background(), ck); err != nil {
		t.Fatalf("set a bare checkpoint's nodeName: %v", err)
	}
	for _, change := range []func(*fbv1.CheckpointSpec){
		func(s *fbv1.CheckpointSpec) { s.NodeName = "n2" },
		func(s *fbv1.CheckpointSpec) { s.Tag = "t" },
		func(s *fbv1.CheckpointSpec) { s.Memory = true },
	} {
		ck := get(t, &fbv1.Checkpoint{ObjectMeta: meta("bare")})
		change(&ck.Spec)
		if err := plane.Client.Update(context.Background(), ck); err == nil || !errors.IsInvalid(err) {
			t.Fatalf("changing a checkpoint's spec: got %v, want Invalid", err)
		}
	}
	fresh := &fbv1.Checkpoint{ObjectMeta: meta("bare2"), Spec: fbv1.CheckpointSpec{Sandbox: "ok"}}
	create(t, fresh)
	fresh.Spec.Memory, fresh.Spec.NodeName = true, "n1"
	if err := plane.Client.Update(context.Background(), fresh); err == nil || !errors.IsInvalid(err) {
		t.Fatalf("setting memory with nodeName: got %v, want Invalid", err)
	}
}

// A Checkpoint made without a node, tag or memory (as kubectl or the
// gateway makes one) gets its nodeName set once; the rest stays as made.
func TestCheckpointNodeNameSetOnce(t *testing.T) {
	plane.Need(t)
	ns := namespace(t)
	ck := &fbv1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ck"}, Spec: fbv1.CheckpointSpec{Sandbox: "s"}}
	create(t, ck)
	ck.Spec.NodeName = "n1"
	if err := plane.Client.Update(context.Background(), ck); err != nil {
		t.Fatalf("set nodeName once: %v", err)
	}
	for _, change := range []func(*fbv1.Checkpoint){
		func(c *fbv1.Checkpoint) { c.Spec.NodeName = "n2" },
		func(c *fbv1.Checkpoint) { c.Spec.Tag = "later" },
		func(c *fbv1.Checkpoint) { c.Spec.Memory = true },
	} {
		c := get(t, &fbv1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ck"}})
		change(c)
		if err := plane.Client.Update(context.Background(), c); err == nil || !errors.IsInvalid(err) {
			t.Fatalf("changing a checkpoint's spec: got %v, want Invalid", err)
		}
	}
	fresh := &fbv1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ck2"}, Spec: fbv1.CheckpointSpec{Sandbox: "s"}}
	create(t, fresh)
	fresh.Spec.NodeName, fresh.Spec.Sandbox = "n1", "other"
	if err := plane.Client.Update(context.Background(), fresh); err == nil || !errors.IsInvalid(err) {
		t.Fatalf("changing the sandbox with the node: got %v, want Invalid", err)
	}
}

// The node agents' field selector is served by the API server (the CRD's
// selectable field), not filtered by the client.
func TestSandboxSelectableByNodeName(t *testing.T) {
	plane.Need(t)
	ns := namespace(t)
	for _, n := range []string{"sel-a", "sel-b", "sel-a"} {
		create(t, &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "sb-"},
			Spec: fbv1.SandboxSpec{Image: "busybox", NodeName: n}})
	}
	var l fbv1.SandboxList
	if err := plane.Client.List(context.Background(), &l, client.InNamespace(ns),
		client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector(fbv1.NodeNameField, "sel-a")}); err != nil {
		t.Fatal(err)
	}
	if len(l.Items) != 2 {
		t.Fatalf("got %d sandboxes on sel-a, want 2", len(l.Items))
	}
	for _, sb := range l.Items {
		if sb.Spec.NodeName != "sel-a" {
			t.Fatalf("got a sandbox of %q", sb.Spec.NodeName)
		}
	}
}
