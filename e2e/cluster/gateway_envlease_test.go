package cluster

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
	"github.com/forkbox/forkbox/api/forkbox/v1/forkboxv1connect"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/errdefs/errconnect"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
)

// gwReq is a request to the gateway with its token.
func gwReq[T any](m *T) *connect.Request[T] {
	r := connect.NewRequest(m)
	r.Header().Set("Authorization", "Bearer "+gw.token)
	return r
}

// A client-run setup (the SDKs' setup functions) through the gateway:
// BeginBuild hands the builder to one caller under a lease (a second
// caller waits, and gets the environment once built); the caller sets
// it up through the gateway; CompleteBuild makes it the environment's
// checkpoint, and a sandbox of it has what the client did. A failed
// setup is FailedPrecondition with the client's reason and the next
// BeginBuild tries again with a new builder; a lease not held is
// NotFound.
func TestGatewayClientSetup(t *testing.T) {
	c := gateway(t)
	envs := forkboxv1connect.NewEnvironmentServiceClient(http.DefaultClient, "http://"+gw.addr)
	forEachRuntime(t, func(t *testing.T, rt fbv1.Runtime) {
		ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
		defer cancel()
		name := "gfn-" + string(rt)
		t.Cleanup(func() { cleanEnvironments(t, name) })
		def := &v1.EnvironmentDefinition{Name: name, Image: env.image, Runtime: string(rt), SetupHash: "fn-v1",
			Resources: &v1.Resources{Memory: "256Mi"}}
		begin := func() *v1.BeginBuildResponse {
			t.Helper()
			r, err := envs.BeginBuild(ctx, gwReq(&v1.BeginBuildRequest{Definition: def}))
			if err != nil {
				t.Fatal(errconnect.FromConnect(err))
			}
			return r.Msg
		}
		complete := func(lease string, ok bool, why string) (*v1.Environment, error) {
			r, err := envs.CompleteBuild(ctx, gwReq(&v1.CompleteBuildRequest{Lease: lease, Ok: ok, Error: why}))
			if err != nil {
				return nil, errconnect.FromConnect(err)
			}
			return r.Msg.Environment, nil
		}

		// A first lease, whose setup fails.
		b := begin()
		if b.Builder == nil || b.Lease == "" || b.Environment != nil || !strings.HasPrefix(b.Builder.Id, "sb-") {
			t.Fatalf("begin: %v", b)
		}
		builder, err := c.Sandbox(ctx, b.Builder.Id)
		if err != nil {
			t.Fatal(err)
		}
		gsh(t, builder, "echo try > /root/t")
		if _, err := complete(b.Lease, false, "setup broke"); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "setup broke") {
			t.Fatalf("complete(ok=false): got %v, want FailedPrecondition with the client's reason", err)
		}
		if _, err := complete(b.Lease, true, ""); !errdefs.IsNotFound(err) {
			t.Fatalf("complete of an ended lease: got %v, want NotFound", err)
		}
		if _, err := complete("nope/ls-1", true, ""); !errdefs.IsNotFound(err) {
			t.Fatalf("complete of a lease never given: got %v, want NotFound", err)
		}
		closedKept(t, &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: gw.namespace, Name: b.Builder.Name}})

		// The next caller builds again; a second caller meanwhile waits
		// and gets the environment.
		b = begin()
		if b.Builder == nil || b.Builder.Name == "" {
			t.Fatalf("begin after a failed setup: %v, want a new builder", b)
		}
		second := make(chan *v1.BeginBuildResponse, 1)
		go func() {
			r, err := envs.BeginBuild(ctx, gwReq(&v1.BeginBuildRequest{Definition: def}))
			if err != nil {
				t.Error(errconnect.FromConnect(err))
				second <- nil
				return
			}
			second <- r.Msg
		}()
		if builder, err = c.Sandbox(ctx, b.Builder.Id); err != nil {
			t.Fatal(err)
		}
		gsh(t, builder, "mkdir -p /site && echo 1.26.4 > /site/numpy.version")
		if err := builder.WriteFile(ctx, "/site/by", []byte("setup-fn"), 0o644); err != nil {
			t.Fatal(err)
		}
		info, err := complete(b.Lease, true, "")
		if err != nil || info.State != "ready" || !strings.HasPrefix(info.Checkpoint, "ck-") || info.Definition.SetupHash != "fn-v1" {
			t.Fatalf("complete: %v, %v", info, err)
		}
		if r := <-second; r == nil || r.Builder != nil || r.Environment == nil || r.Environment.Checkpoint != info.Checkpoint {
			t.Fatalf("the second caller: got %v, want the built environment", r)
		}

		// A sandbox of it: what the client did.
		r, err := envs.EnvironmentSandbox(ctx, gwReq(&v1.EnvironmentSandboxRequest{Definition: def}))
		if err != nil {
			t.Fatal(errconnect.FromConnect(err))
		}
		if r.Msg.Built {
			t.Fatalf("sandbox of a built environment says built")
		}
		fromEnv, err := c.Sandbox(ctx, r.Msg.Sandbox.Id)
		if err != nil {
			t.Fatal(err)
		}
		if got := gsh(t, fromEnv, "cat /site/numpy.version /site/by; cat /root/t 2>/dev/null || echo no-t"); got != "1.26.4\nsetup-fnno-t\n" {
			t.Fatalf("sandbox of the client-built environment: got %q", got)
		}
		if err := fromEnv.Close(ctx); err != nil {
			t.Fatal(err)
		}
	})
}
