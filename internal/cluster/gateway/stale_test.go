package gateway

import (
	"context"
	"io"
	"log/slog"
	"reflect"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/clustertest"
	"github.com/forkbox/forkbox/internal/cluster/kube"
)

// staleGateway is a gateway whose cache holds cached while the API server
// holds api (each a Sandbox "sb" in "ns").
func staleGateway(cached, api *fbv1.Sandbox) (*Gateway, client.Client) {
	build := func(o client.Object) client.Client {
		return fake.NewClientBuilder().WithScheme(kube.NewScheme()).WithObjects(o).Build()
	}
	a := build(api)
	return &Gateway{o: Options{Namespace: "ns"}, c: clustertest.StaleCache{Client: a, Stale: build(cached)}, api: a,
		log: slog.New(slog.NewTextHandler(io.Discard, nil))}, a
}

func egressBox(eg *fbv1.Egress, creds ...fbv1.Credential) *fbv1.Sandbox {
	return &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "sb"},
		Spec: fbv1.SandboxSpec{Egress: eg, Credentials: creds}}
}

// The egress policy a node applied is recorded on the object as the API
// server has it: set back to what a cache a write behind still shows, a
// patch computed from the cached copy would change nothing.
func TestRecordEgressBehindCache(t *testing.T) {
	ctx := context.Background()
	none := &fbv1.Egress{Mode: "none"}
	allow := &fbv1.Egress{Mode: "allowlist", Allow: []string{"example.com"}}
	g, api := staleGateway(egressBox(none), egressBox(allow))
	var cached fbv1.Sandbox
	if err := g.c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "sb"}, &cached); err != nil {
		t.Fatal(err)
	}
	if err := g.recordEgress(ctx, &cached, none.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	var got fbv1.Sandbox
	if err := api.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "sb"}, &got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got.Spec.Egress, none) {
		t.Errorf("recorded egress %+v, want %+v", got.Spec.Egress, none)
	}
}

// Whether a credential is in the spec is asked of the API server: one set
// just before may not be in the cache yet.
func TestSpecCredentialBehindCache(t *testing.T) {
	ctx := context.Background()
	k := fbv1.Credential{Name: "KEY", SecretRef: fbv1.SecretKeyRef{Name: "s", Key: "value"}, Env: "KEY"}
	g, _ := staleGateway(egressBox(nil), egressBox(nil, k))
	var cached fbv1.Sandbox
	if err := g.c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "sb"}, &cached); err != nil {
		t.Fatal(err)
	}
	if i, err := g.specCredential(ctx, &cached, "KEY"); err != nil || i != 0 {
		t.Errorf("credential set behind the cache: index %d, %v; want 0", i, err)
	}
	if i, err := g.specCredential(ctx, &cached, "OTHER"); err != nil || i != -1 {
		t.Errorf("no such credential: index %d, %v; want -1", i, err)
	}
}

// A checkpoint's source is read from the API server: the credentials its
// children get are not a cache's, a write behind.
func TestSourceSandboxBehindCache(t *testing.T) {
	ctx := context.Background()
	k := fbv1.Credential{Name: "KEY", SecretRef: fbv1.SecretKeyRef{Name: "s", Key: "value"}, Env: "KEY"}
	g, _ := staleGateway(egressBox(nil), egressBox(nil, k))
	ck := &fbv1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "ck", CreationTimestamp: metav1.Now()},
		Spec: fbv1.CheckpointSpec{Sandbox: "sb"}}
	src, err := g.sourceSandbox(ctx, ck)
	if err != nil || src == nil || len(src.Spec.Credentials) != 1 {
		t.Errorf("source behind the cache: %+v, %v; want its credential KEY", src, err)
	}
}
