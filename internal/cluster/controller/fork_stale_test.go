package controller

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

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

// Children inherit the credentials the API server holds for their source:
// one set just before the fork may not be in the forker's cache yet.
func TestForkCredentialsBehindCache(t *testing.T) {
	ctx := context.Background()
	scheme := kube.NewScheme()
	fk := &fbv1.Fork{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "fk", UID: types.UID("fk-uid")},
		Spec: fbv1.ForkSpec{Count: 2}}
	src := func(creds ...fbv1.Credential) client.Object {
		return &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "src"}, Spec: fbv1.SandboxSpec{Credentials: creds}}
	}
	cred := func(name string, perFork bool) fbv1.Credential {
		return fbv1.Credential{Name: name, SecretRef: fbv1.SecretKeyRef{Name: "s-" + name, Key: "v"}, Env: "E_" + name, PerFork: perFork}
	}
	build := func(objs ...client.Object) client.Client {
		return fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build()
	}
	api := build(src(cred("old", false), cred("new", false), cred("mine", true)))
	f := &forker{c: clustertest.StaleCache{Client: api, Stale: build(src(cred("old", false)))}, api: api,
		rec: events.NewFakeRecorder(10), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	ck := &fbv1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "ck"}, Spec: fbv1.CheckpointSpec{Sandbox: "src"}}
	if err := f.children(ctx, fk, ck); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		var child fbv1.Sandbox
		if err := api.Get(ctx, types.NamespacedName{Namespace: "ns", Name: childName(fk, i)}, &child); err != nil {
			t.Fatalf("child %d: %v", i, err)
		}
		var names []string
		for _, c := range child.Spec.Credentials {
			names = append(names, c.Name)
		}
		if got := strings.Join(names, ","); got != "old,new" {
			t.Errorf("child %s inherits %q, want \"old,new\" (a per-fork one is not inherited)", child.Name, got)
		}
	}
}

// A sandbox of the checkpoint's source name made after the checkpoint is
// another sandbox (names are free again once closed): its credentials are
// not inherited.
func TestForkCredentialsOfLaterNamesake(t *testing.T) {
	ctx := context.Background()
	scheme := kube.NewScheme()
	taken := metav1.Now()
	later := metav1.NewTime(taken.Add(time.Minute))
	fk := &fbv1.Fork{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "fk", UID: types.UID("fk-uid")}, Spec: fbv1.ForkSpec{Count: 1}}
	namesake := &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "src", CreationTimestamp: later},
		Spec: fbv1.SandboxSpec{Credentials: []fbv1.Credential{{Name: "theirs", SecretRef: fbv1.SecretKeyRef{Name: "s", Key: "v"}, Env: "THEIRS"}}}}
	api := fake.NewClientBuilder().WithScheme(scheme).WithObjects(namesake).Build()
	f := &forker{c: api, api: api, rec: events.NewFakeRecorder(10), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	ck := &fbv1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "ck", CreationTimestamp: taken}, Spec: fbv1.CheckpointSpec{Sandbox: "src"}}
	if err := f.children(ctx, fk, ck); err != nil {
		t.Fatal(err)
	}
	var child fbv1.Sandbox
	if err := api.Get(ctx, types.NamespacedName{Namespace: "ns", Name: childName(fk, 0)}, &child); err != nil {
		t.Fatal(err)
	}
	if len(child.Spec.Credentials) != 0 {
		t.Errorf("the child of a checkpoint inherits %+v from a later sandbox of its source's name", child.Spec.Credentials)
	}
}
