package cluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fbclient "github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/clustertest"
	"github.com/forkbox/forkbox/internal/cluster/kube"
	"github.com/forkbox/forkbox/internal/freeport"
)

// Each node serves its API on TCP at its endpoint with the nodes' token
// (cl.Token), which only the gateway holds.

// ownerClient is the API of the node that holds local sandbox id, found
// through its Sandbox object (nil if none has it).
func ownerClient(t *testing.T, id string) *fbclient.Client {
	t.Helper()
	var l fbv1.SandboxList
	if err := plane.Client.List(context.Background(), &l); err != nil {
		t.Fatal(err)
	}
	for _, s := range l.Items {
		if s.Status.LocalID == id {
			if n := nodeNamed(s.Spec.NodeName); n != nil {
				return n.TCPClient()
			}
		}
	}
	return nil
}

// freeAddr is a loopback address for the gateway to listen on (below the
// ephemeral range: see freeport).
func freeAddr() string {
	a, err := freeport.Loopback()
	if err != nil {
		panic(err)
	}
	return a
}

func randomToken() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// gw is the gateway process, started once by the first test that needs
// it (cleanup in main_test.go stops it with the others).
var gw struct {
	once        sync.Once
	err         error
	addr, token string
	namespace   string
	c           *fbclient.Client // the Go SDK, unchanged, against the gateway
	cmd         *exec.Cmd
	log         *os.File
}

// gateway starts `forkbox serve --gateway` for namespace gw-<run> with a
// kubeconfig bound only to deploy/rbac/gateway, and returns the Go SDK
// pointed at it.
func gateway(t *testing.T) *fbclient.Client {
	t.Helper()
	need(t)
	gw.once.Do(func() { gw.err = startGateway() })
	if gw.err != nil {
		t.Fatalf("gateway: %v", gw.err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(cl.Dir, "gateway.log"))
			if len(b) > 6000 {
				b = b[len(b)-6000:]
			}
			t.Logf("---- gateway log (end) ----\n%s", b)
		}
	})
	return gw.c
}

func startGateway() error {
	ctx := context.Background()
	gw.namespace, gw.addr, gw.token = "gw-"+cl.RunID, freeAddr(), randomToken()
	if err := plane.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: gw.namespace}}); err != nil {
		return err
	}
	cfg := filepath.Join(cl.Dir, "forkbox-gateway.kubeconfig")
	if err := plane.UserKubeconfig(ctx, "forkbox-gateway", "../../deploy/rbac/gateway/role.yaml", cfg); err != nil {
		return err
	}
	if err := plane.UserNamespaceRole(ctx, "forkbox-gateway", "../../deploy/rbac/gateway/secrets.yaml", gw.namespace); err != nil {
		return err
	}
	// A tenant namespace: the nodes read its Secrets (credentials), and
	// no other namespace's.
	if err := plane.NodeNamespaceRole(ctx, "../../deploy/rbac/node/secrets.yaml", gw.namespace); err != nil {
		return err
	}
	log, err := os.Create(filepath.Join(cl.Dir, "gateway.log"))
	if err != nil {
		return err
	}
	cmd := exec.Command(cl.Bin, "serve", "--gateway", "--kubeconfig", cfg, "--gateway-namespace", gw.namespace,
		"--tcp", gw.addr, "--api-token", gw.token, "--node-token", cl.Token, "--log-level", "debug",
		"--ports", "127.0.0.1:0", "--ports-key", filepath.Join(cl.Dir, "gateway-port.key"))
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		log.Close()
		return err
	}
	gw.cmd, gw.log = cmd, log
	gw.c = &fbclient.Client{URL: "http://" + gw.addr, Token: gw.token}
	if err := waitFor(60*time.Second, func() error { _, err := gw.c.ListSandboxes(ctx, false); return err }); err != nil {
		return err
	}
	// Every node is registered and Ready, with its API endpoint.
	return waitFor(60*time.Second, func() error {
		for _, nd := range nodes() {
			var n fbv1.ForkboxNode
			if err := plane.Client.Get(ctx, client.ObjectKey{Name: nd.Name}, &n); err != nil {
				return err
			}
			if !kube.IsTrue(n.Status.Conditions, fbv1.ConditionReady) || n.Spec.Endpoint != nd.Endpoint || n.Spec.PreviewEndpoint != nd.PreviewEndpoint {
				return fmt.Errorf("node %s: endpoint %q, preview endpoint %q, conditions %v", n.Name, n.Spec.Endpoint, n.Spec.PreviewEndpoint, n.Status.Conditions)
			}
		}
		return nil
	})
}

// stopGateway stops the gateway process, if one was started (run, before
// the cluster's Close and its leak audit).
func stopGateway() {
	if gw.cmd == nil {
		return
	}
	syscall.Kill(-gw.cmd.Process.Pid, syscall.SIGTERM)
	gw.cmd.Wait()
	gw.log.Close()
}

// streamWatch is an exec's stdout that reports when a line has come.
type streamWatch struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	want string
	seen chan struct{}
}

func (w *streamWatch) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if w.seen != nil && strings.Contains(w.buf.String(), w.want) {
		close(w.seen)
		w.seen = nil
	}
	return len(p), nil
}

func gsh(t *testing.T, sb *fbclient.Sandbox, cmd string) string {
	t.Helper()
	var out, errb strings.Builder
	res, err := sb.Exec(context.Background(), fbclient.ExecOptions{Shell: cmd, Stdout: &out, Stderr: &errb})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec %q on %s: %v (exit %v, stderr %q)", cmd, sb.ID, err, res, errb.String())
	}
	return out.String()
}

// The Go SDK, unchanged, against the gateway: create, a streamed exec,
// files, a fork of two children with an exec in each, pause and unpause,
// a checkpoint, delete; each step backed by the objects.
func TestGatewayGoSDK(t *testing.T) {
	c := gateway(t)
	forEachRuntime(t, func(t *testing.T, rt fbv1.Runtime) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		name := "sdk-" + string(rt)
		sb, err := c.CreateSandbox(ctx, fbclient.CreateOptions{Image: env.image, Name: name, Runtime: string(rt),
			Env: map[string]string{"GREETING": "hi from the gateway"}, Resources: fbclient.Resources{Memory: "256Mi"}})
		if err != nil {
			t.Fatal(err)
		}
		obj := get(t, &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: gw.namespace, Name: name}})
		if sb.ID != obj.Status.LocalID || !strings.HasPrefix(sb.ID, "sb-") || sb.Info.Name != name || sb.Info.State != "running" ||
			sb.Info.Runtime != string(rt) || nodeNamed(obj.Spec.NodeName) == nil {
			t.Fatalf("created: got id %q name %q state %q runtime %q; object local ID %q on %q", sb.ID, sb.Info.Name, sb.Info.State,
				sb.Info.Runtime, obj.Status.LocalID, obj.Spec.NodeName)
		}
		if got := gsh(t, sb, `echo "$GREETING"`); got != "hi from the gateway\n" {
			t.Fatalf("exec: got %q", got)
		}

		// Streamed: the first line reaches the caller while the command
		// still runs, and the command ends only once the caller acts on it.
		w := &streamWatch{want: "first\n", seen: make(chan struct{})}
		seen := w.seen
		done := make(chan error, 1)
		go func() {
			res, err := sb.Exec(ctx, fbclient.ExecOptions{Shell: "echo first; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo second", Stdout: w})
			if err == nil && res.ExitCode != 0 {
				err = fmt.Errorf("exit %d", res.ExitCode)
			}
			done <- err
		}()
		select {
		case <-seen:
		case err := <-done:
			t.Fatalf("exec ended before its first line was seen: %v", err)
		case <-ctx.Done():
			t.Fatal("no streamed output")
		}
		if err := sb.WriteFile(ctx, "/tmp/go", []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil || w.buf.String() != "first\nsecond\n" {
			t.Fatalf("streamed exec: %v, output %q", err, w.buf.String())
		}

		// Files, through the node's API.
		if err := sb.WriteFile(ctx, "/root/marker", []byte("parent-data\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if b, err := sb.ReadFile(ctx, "/root/marker"); err != nil || string(b) != "parent-data\n" {
			t.Fatalf("read: got %q, %v", b, err)
		}
		files, err := sb.ListFiles(ctx, "/root")
		if err != nil || len(files) != 1 || files[0].Name != "marker" {
			t.Fatalf("list: got %v, %v", files, err)
		}
		if _, err := sb.ReadFile(ctx, "/root/../../etc/../nope"); !errdefs.IsNotFound(err) && !errdefs.IsInvalidArgument(err) {
			t.Fatalf("read of a missing path: got %v, want NotFound or InvalidArgument", err)
		}

		// Pause and back: the object's desired state, the node's state.
		if err := sb.Pause(ctx); err != nil {
			t.Fatal(err)
		}
		if obj := get(t, obj); obj.Spec.State != fbv1.StatePaused || obj.Status.Phase != fbv1.PhasePaused {
			t.Fatalf("paused: object spec %q phase %q", obj.Spec.State, obj.Status.Phase)
		}
		if err := sb.Refresh(ctx); err != nil || sb.Info.State != "paused" {
			t.Fatalf("paused: got %v, %v", sb.Info.GetState(), err)
		}
		if _, err := sb.Exec(ctx, fbclient.ExecOptions{Argv: []string{"true"}}); !errdefs.IsFailedPrecondition(err) {
			t.Fatalf("exec while paused: got %v, want FailedPrecondition", err)
		}
		if err := sb.Unpause(ctx); err != nil {
			t.Fatal(err)
		}
		if got := gsh(t, sb, "cat /root/marker"); got != "parent-data\n" {
			t.Fatalf("after unpause: got %q", got)
		}
		if rt == fbv1.RuntimeCrun {
			// The node refuses; the object goes back to asking for Running.
			if err := sb.Hibernate(ctx); !errdefs.IsFailedPrecondition(err) {
				t.Fatalf("hibernate on crun: got %v, want FailedPrecondition", err)
			}
			if o := get(t, obj); o.Spec.State != fbv1.StateRunning {
				t.Fatalf("after a refused hibernate: spec state %q, want Running", o.Spec.State)
			}
		}

		// A checkpoint: a Checkpoint object, listed by the sandbox.
		ck, err := sb.Checkpoint(ctx, "ready")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(ck.Id, "ck-") || ck.Tag != "ready" || ck.SandboxId != sb.ID || ck.Kind == "" {
			t.Fatalf("checkpoint: got %+v", ck)
		}
		cks, err := sb.ListCheckpoints(ctx)
		if err != nil || len(cks) != 1 || cks[0].Id != ck.Id {
			t.Fatalf("list checkpoints: got %v, %v; want [%s]", cks, err, ck.Id)
		}

		// A fork of two children, each with the parent's file and an exec
		// of its own; the parent keeps its data.
		res, err := sb.Fork(ctx, fbclient.ForkOptions{Count: 2, Overrides: fbclient.Overrides{Env: map[string]string{"ROLE": "child"}}})
		if err != nil {
			t.Fatal(err)
		}
		kids := res.Sandboxes()
		if len(kids) != 2 || res.Checkpoint == nil || !strings.HasPrefix(res.Checkpoint.Id, "ck-") {
			t.Fatalf("fork: got %d children (%+v), checkpoint %v", len(kids), res.Children, res.Checkpoint)
		}
		// The node's own figure, carried by the Checkpoint's status.
		if res.CaptureMS <= 0 || res.Checkpoint.CaptureMs != res.CaptureMS {
			t.Errorf("fork: capture %v ms, the checkpoint's %v ms; want the node's measure (> 0) in both", res.CaptureMS, res.Checkpoint.CaptureMs)
		}
		for i, k := range kids {
			if !strings.HasPrefix(k.ID, "sb-") || k.ID == sb.ID || k.Info.State != "running" {
				t.Fatalf("child %d: got id %q state %q", i, k.ID, k.Info.State)
			}
			if got := gsh(t, k, `cat /root/marker; echo "$ROLE"; echo child > /root/marker`); got != "parent-data\nchild\n" {
				t.Fatalf("child %d: got %q", i, got)
			}
		}
		if got := gsh(t, sb, "cat /root/marker"); got != "parent-data\n" {
			t.Fatalf("parent after the children wrote: got %q", got)
		}
		if cks, err := sb.ListCheckpoints(ctx); err != nil || len(cks) != 2 {
			t.Fatalf("checkpoints after the fork: got %d, %v; want 2 (the fork's is listed)", len(cks), err)
		}
		list, err := c.ListSandboxes(ctx, false)
		if err != nil {
			t.Fatal(err)
		}
		ids := map[string]bool{}
		for _, s := range list {
			ids[s.Id] = true
		}
		if !ids[sb.ID] || !ids[kids[0].ID] || !ids[kids[1].ID] {
			t.Fatalf("list: got %v, want the parent and both children", ids)
		}

		// Close: each is closed as on one host (its object kept, state
		// closed), its local sandbox (on the node its object named) too.
		owners := map[string]*fbclient.Client{}
		for _, s := range append(kids, sb) {
			if owners[s.ID] = ownerClient(t, s.ID); owners[s.ID] == nil {
				t.Fatalf("no Sandbox object holds %s", s.ID)
			}
		}
		for _, s := range append(kids, sb) {
			id := s.ID
			if err := s.Close(ctx); err != nil {
				t.Fatalf("close %s: %v", id, err)
			}
			if got, err := c.Sandbox(ctx, id); err != nil || got.Info.State != "closed" {
				t.Fatalf("get %s after close: got %v, %v; want it closed", id, got, err)
			}
			if l, err := owners[id].Sandbox(ctx, id); err == nil && l.Info.State != "closed" {
				t.Fatalf("local sandbox %s: state %s after close, want closed", id, l.Info.State)
			}
		}
		if err := c.DeleteCheckpoint(ctx, ck.Id); err != nil {
			t.Fatal(err)
		}
	})
}

// Errors keep their class through the gateway: an unknown ID is
// NotFound, a sandbox no node can take is ResourceExhausted with the
// placer's reason and leaves no object behind, a name that is no object
// name is InvalidArgument, a call with no cluster meaning is
// Unimplemented, and the caller's token is not the node's (nor the
// other way round).
func TestGatewayErrors(t *testing.T) {
	c := gateway(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := c.Sandbox(ctx, "sb-0123456789ab"); !errdefs.IsNotFound(err) {
		t.Fatalf("unknown id: got %v, want NotFound", err)
	}
	if _, err := c.Sandbox(ctx, "no-such-box"); !errdefs.IsNotFound(err) {
		t.Fatalf("unknown name: got %v, want NotFound", err)
	}
	for _, name := range []string{"Upper", "a/b", "../x", strings.Repeat("a", 64), "sb-lookalike"} {
		if _, err := c.CreateSandbox(ctx, fbclient.CreateOptions{Image: env.image, Name: name}); !errdefs.IsInvalidArgument(err) {
			t.Fatalf("name %q: got %v, want InvalidArgument", name, err)
		}
	}
	if _, err := c.ListImages(ctx); err != nil {
		t.Fatalf("list images: %v", err)
	}
	if _, err := c.Resume(ctx, "no-such-session"); !errdefs.IsNotFound(err) {
		t.Fatalf("resume of no session through the gateway: got %v, want NotFound", err)
	}
	if _, err := c.CreateSandbox(ctx, fbclient.CreateOptions{Image: env.image, Runtime: string(fbv1.RuntimeGVisor), OnTimeout: "hibernate", Timeout: time.Minute}); !errdefs.IsNotImplemented(err) || !strings.Contains(err.Error(), "cluster mode") {
		t.Fatalf("on_timeout hibernate through the gateway: got %v, want NotImplemented naming cluster mode", err)
	}

	// A sandbox of another namespace is not this tenant's.
	other := namespace(t)
	foreign := &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: other, Name: "foreign"}, Spec: fbv1.SandboxSpec{Image: env.image, Runtime: fbv1.RuntimeCrun}}
	if err := plane.Client.Create(ctx, foreign); err != nil {
		t.Fatal(err)
	}
	running(t, foreign, fbv1.PhaseRunning)
	if _, err := c.Sandbox(ctx, foreign.Status.LocalID); !errdefs.IsNotFound(err) {
		t.Fatalf("another namespace's sandbox by its id: got %v, want NotFound", err)
	}
	if m, err := c.SandboxMetrics(ctx, ""); err != nil {
		t.Fatal(err)
	} else {
		for _, x := range m {
			if x.SandboxId == foreign.Status.LocalID {
				t.Fatalf("metrics of every sandbox include another namespace's %s", x.SandboxId)
			}
		}
	}
	if err := plane.Client.Delete(ctx, foreign); err != nil {
		t.Fatal(err)
	}

	// Tokens: the node's token is no key to the gateway, the caller's no
	// key to the node.
	if _, err := (&fbclient.Client{URL: "http://" + gw.addr, Token: cl.Token}).ListSandboxes(ctx, false); !errdefs.IsUnauthenticated(err) {
		t.Fatalf("the node's token at the gateway: got %v, want Unauthenticated", err)
	}
	if _, err := (&fbclient.Client{URL: "http://" + node(0).Endpoint, Token: gw.token}).ListSandboxes(ctx, false); !errdefs.IsUnauthenticated(err) {
		t.Fatalf("the caller's token at the node: got %v, want Unauthenticated", err)
	}

	// Unplaceable: every node is cordoned.
	cordon := func(on bool) {
		t.Helper()
		for _, nd := range nodes() {
			node := &fbv1.ForkboxNode{ObjectMeta: metav1.ObjectMeta{Name: nd.Name}}
			get(t, node)
			patch := client.MergeFrom(node.DeepCopy())
			node.Spec.Unschedulable = on
			if err := plane.Client.Patch(context.Background(), node, patch); err != nil {
				t.Fatal(err)
			}
		}
	}
	cordon(true)
	defer cordon(false)
	placed, err := c.CreateSandbox(ctx, fbclient.CreateOptions{Image: env.image, Name: "nowhere"})
	if err == nil {
		placed.Close(ctx) // its slot is not left to the tests after this one
	}
	if !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "unschedulable") {
		t.Fatalf("create with no node to take it: got %v (%s), want ResourceExhausted naming the reason", err, errdefs.ClassName(err))
	}
	clustertest.Eventually(t, 30*time.Second, "the unplaceable sandbox's object gone", func() (bool, string) {
		var l fbv1.SandboxList
		if err := plane.Client.List(ctx, &l, client.InNamespace(gw.namespace)); err != nil {
			return false, err.Error()
		}
		for _, s := range l.Items {
			if s.Name == "nowhere" {
				return false, "still there: " + s.Status.Message
			}
		}
		return true, ""
	})
}
