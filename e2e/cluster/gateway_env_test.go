package cluster

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fbclient "github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
)

// The Go SDK's environments, unchanged, against the gateway: a build is
// an Environment object built by the controller on a node, its progress
// streamed; the same definition again is answered cached with the same
// hash; get and list show it (a written file as the write step it was);
// a sandbox of it runs what the setup installed, with the environment's
// env under its own overrides; deleted, the environment is NotFound, its
// checkpoint is collected, and the sandbox from it runs on. A failing
// step comes back as the daemon's FailedPrecondition with the step's exit
// code and output, and the next call tries the build again; a pool size
// out of bounds is refused (TestGatewayWarmPool has the pools).
func TestGatewayEnvironments(t *testing.T) {
	c := gateway(t)
	forEachRuntime(t, func(t *testing.T, rt fbv1.Runtime) {
		ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
		defer cancel()
		name := "genv-" + string(rt)
		t.Cleanup(func() { cleanEnvironments(t, name, name+"-bad") })
		opts := fbclient.EnvironmentOptions{Image: env.image, Runtime: string(rt), Env: map[string]string{"GREETING": "hi", "MODE": "env"},
			Resources: fbclient.Resources{Memory: "256Mi"},
			Setup: []*fbclient.SetupStep{fbclient.Run("mkdir -p /opt/tool && echo v1 > /opt/tool/version"),
				fbclient.WriteFile("/opt/tool/cfg.json", []byte(`{"it's": "100% \\ sure"}`+"\n"), 0o600)}}
		e := c.Environment(name, opts)
		var progress []*fbclient.BuildProgress
		info, err := e.Build(ctx, func(p *fbclient.BuildProgress) { progress = append(progress, p) })
		if err != nil {
			t.Fatal(err)
		}
		var phases []string
		for _, p := range progress {
			phases = append(phases, p.Phase)
		}
		if info.State != "ready" || !strings.HasPrefix(info.Checkpoint, "ck-") || len(phases) < 2 || phases[0] != "create" ||
			phases[len(phases)-1] != "done" || slices.Contains(phases, "cached") {
			t.Fatalf("build: state %q checkpoint %q, progress %v", info.State, info.Checkpoint, progress)
		}
		obj := get(t, &fbv1.Environment{ObjectMeta: metav1.ObjectMeta{Namespace: gw.namespace, Name: name}})
		ck := get(t, &fbv1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: gw.namespace, Name: obj.Status.Checkpoint}})
		if obj.Status.Hash != obj.Spec.Hash() || info.Hash != obj.Spec.Hash() || !ck.ReadyOn(ck.Status.OriginNode) ||
			info.Checkpoint != localIDOn(ck, ck.Status.OriginNode) || obj.Spec.Runtime != rt {
			t.Fatalf("object: spec %+v status %+v; checkpoint %+v; answered %v", obj.Spec, obj.Status, ck.Status, info)
		}

		// The same definition: cached, nothing built again.
		progress = nil
		again, err := e.Build(ctx, func(p *fbclient.BuildProgress) { progress = append(progress, p) })
		if err != nil || again.Hash != info.Hash || again.Checkpoint != info.Checkpoint || len(progress) != 2 || progress[0].Phase != "cached" {
			t.Fatalf("built again: %v, %v; progress %v", again, err, progress)
		}
		if get(t, obj).Status.Checkpoint != ck.Name {
			t.Fatalf("built again: checkpoint %s, want %s", obj.Status.Checkpoint, ck.Name)
		}

		// Get and list.
		got, err := c.GetEnvironment(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		d := got.Definition
		if got.State != "ready" || got.Checkpoint != info.Checkpoint || got.BuiltAtUnixMs == 0 || d.Name != name || d.Image != env.image ||
			d.Env["GREETING"] != "hi" || len(d.Steps) != 2 || d.Steps[0].Run == "" || d.Steps[1].WritePath != "/opt/tool/cfg.json" ||
			string(d.Steps[1].WriteContent) != string(opts.Setup[1].WriteContent) || d.Steps[1].WriteMode != 0o600 {
			t.Fatalf("get: %v", got)
		}
		list, err := c.ListEnvironments(ctx)
		if err != nil || !slices.ContainsFunc(list, func(i *fbclient.EnvironmentInfo) bool { return i.Definition.Name == name && i.Hash == info.Hash }) {
			t.Fatalf("list: %v, %v; want %s", list, err, name)
		}

		// A sandbox of it: what the setup installed, the environment's env
		// under the sandbox's own.
		sb, err := e.Sandbox(ctx, fbclient.Overrides{Env: map[string]string{"MODE": "mine"}})
		if err != nil {
			t.Fatal(err)
		}
		if sb.Built || !strings.HasPrefix(sb.ID, "sb-") || sb.Info.State != "running" {
			t.Fatalf("sandbox: built %v id %q state %q", sb.Built, sb.ID, sb.Info.State)
		}
		out := gsh(t, sb.Sandbox, `cat /opt/tool/version /opt/tool/cfg.json; stat -c %a /opt/tool/cfg.json; echo "$GREETING $MODE"`)
		if want := "v1\n" + string(opts.Setup[1].WriteContent) + "600\nhi mine\n"; out != want {
			t.Fatalf("sandbox of the environment: got %q, want %q", out, want)
		}
		sbObj := get(t, &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: gw.namespace, Name: sb.Info.Name}})
		if sbObj.Spec.Source == nil || sbObj.Spec.Source.Environment != name || !strings.HasPrefix(sbObj.Name, name+"-") {
			t.Fatalf("sandbox object %s: source %+v", sbObj.Name, sbObj.Spec.Source)
		}

		// Deleted: NotFound; the checkpoint is collected; the sandbox from
		// it runs on.
		if err := c.DeleteEnvironment(ctx, name); err != nil {
			t.Fatal(err)
		}
		if _, err := c.GetEnvironment(ctx, name); !errdefs.IsNotFound(err) {
			t.Fatalf("get after delete: got %v, want NotFound", err)
		}
		if err := c.DeleteEnvironment(ctx, name); !errdefs.IsNotFound(err) {
			t.Fatalf("delete again: got %v, want NotFound", err)
		}
		if _, err := c.SandboxFromEnvironment(ctx, name, fbclient.Overrides{}); !errdefs.IsNotFound(err) {
			t.Fatalf("sandbox of a deleted environment: got %v, want NotFound", err)
		}
		gone(t, ck)
		if got := gsh(t, sb.Sandbox, "cat /opt/tool/version"); got != "v1\n" {
			t.Fatalf("sandbox after its environment was deleted: got %q", got)
		}
		if err := sb.Close(ctx); err != nil {
			t.Fatal(err)
		}

		// A failing step: the daemon's class and message, its builder closed;
		// the next call builds again (and fails again).
		bad := c.Environment(name+"-bad", fbclient.EnvironmentOptions{Image: env.image, Runtime: string(rt),
			Setup: []*fbclient.SetupStep{fbclient.Run("echo ok"), fbclient.Run("echo broken >&2; exit 3")}})
		for try := 1; try <= 2; try++ {
			_, err := bad.Sandbox(ctx, fbclient.Overrides{})
			if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "exited 3") || !strings.Contains(err.Error(), "broken") ||
				!strings.Contains(err.Error(), "step 2 of 2") {
				t.Fatalf("try %d: a failing step: got %v, want FailedPrecondition saying step 2 of 2 exited 3 and its output", try, err)
			}
			be := get(t, &fbv1.Environment{ObjectMeta: metav1.ObjectMeta{Namespace: gw.namespace, Name: name + "-bad"}})
			if n := fbv1.Retries(be); n != try-1 {
				t.Fatalf("try %d: retry count %d, want %d (each call after a failure builds again)", try, n, try-1)
			}
			closedKept(t, &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: gw.namespace, Name: fbv1.BuilderName(be.Status.Build)}})
		}
		binfo, err := c.GetEnvironment(ctx, name+"-bad")
		if err != nil || binfo.State != "failed" || !strings.Contains(binfo.Error, "exited 3") || binfo.Checkpoint != "" {
			t.Fatalf("get of the failed environment: %v, %v", binfo, err)
		}
		if _, err := c.SandboxFromEnvironment(ctx, name+"-bad", fbclient.Overrides{}); !errdefs.IsFailedPrecondition(err) ||
			!strings.Contains(err.Error(), "last build failed") {
			t.Fatalf("no_build sandbox of a failed environment: got %v, want FailedPrecondition", err)
		}

		// What the Environment object cannot hold: refused, nothing made.
		pool := opts
		pool.PoolSize = 33
		if _, err := c.Environment(name+"-pool", pool).Build(ctx, nil); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "pool size") {
			t.Fatalf("a warm pool of 33: got %v, want InvalidArgument naming the pool size", err)
		}
		if _, err := c.GetEnvironment(ctx, name+"-pool"); !errdefs.IsNotFound(err) {
			t.Fatalf("a refused definition left an environment: %v", err)
		}
		if _, err := c.Environment(name+"-ovr", opts).Sandbox(ctx, fbclient.Overrides{Name: "Bad_Name"}); !errdefs.IsInvalidArgument(err) {
			t.Fatalf("a bad sandbox name: got %v, want InvalidArgument", err)
		}
		if _, err := c.GetEnvironment(ctx, name+"-ovr"); !errdefs.IsNotFound(err) {
			t.Fatalf("a refused sandbox built its environment first: %v", err)
		}
	})
}

// localIDOn is the local ID of ck's copy on node.
func localIDOn(ck *fbv1.Checkpoint, node string) string {
	for _, r := range ck.Status.Replicas {
		if r.Node == node {
			return r.LocalID
		}
	}
	return ""
}

// cleanEnvironments deletes the gateway namespace's environments of
// these names and the sandboxes started from them, and waits until
// their objects are gone.
func cleanEnvironments(t *testing.T, names ...string) {
	ctx := context.Background()
	for _, n := range names {
		e := &fbv1.Environment{ObjectMeta: metav1.ObjectMeta{Namespace: gw.namespace, Name: n}}
		if err := plane.Client.Delete(ctx, e); client.IgnoreNotFound(err) != nil {
			t.Errorf("delete environment %s: %v", n, err)
		}
	}
	var sl fbv1.SandboxList
	if err := plane.Client.List(ctx, &sl, client.InNamespace(gw.namespace)); err != nil {
		t.Fatal(err)
	}
	for i := range sl.Items {
		sb := &sl.Items[i]
		src := sb.Spec.Source
		if (src != nil && slices.Contains(names, src.Environment)) || slices.Contains(names, sb.Labels[fbv1.EnvironmentLabel]) ||
			slices.Contains(names, sb.Labels[fbv1.PoolLabel]) {
			if err := plane.Client.Delete(ctx, sb); client.IgnoreNotFound(err) != nil {
				t.Errorf("delete sandbox %s: %v", sb.Name, err)
			}
			gone(t, sb)
		}
	}
	var cl fbv1.CheckpointList
	if err := plane.Client.List(ctx, &cl, client.InNamespace(gw.namespace)); err != nil {
		t.Fatal(err)
	}
	for i := range cl.Items {
		if slices.Contains(names, cl.Items[i].Labels[fbv1.EnvironmentLabel]) {
			gone(t, &cl.Items[i]) // the controller collects them
		}
	}
}

// The CLI, unchanged, against the gateway: the README's environment
// commands (a definition file with a command and a file to write).
func TestGatewayEnvCLI(t *testing.T) {
	gateway(t)
	t.Cleanup(func() { cleanEnvironments(t, "tools") })
	cli := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(cl.Bin, append([]string{"--host", "http://" + gw.addr, "--token", gw.token}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("forkbox %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	def := filepath.Join(t.TempDir(), "tools.json")
	if err := os.WriteFile(def, []byte(`{"name": "tools", "image": "`+env.image+`", "resources": {"memory": "256Mi"},
 "setup": ["mkdir -p /opt/tool && echo v1 > /opt/tool/version", {"path": "/opt/tool/cfg", "content": "debug=1\n"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	cli("env", "build", "-f", def)
	if ls := cli("env", "ls"); !strings.Contains(ls, "tools") || !strings.Contains(ls, "ready") {
		t.Fatalf("env ls: got %s", ls)
	}
	cli("create", "--environment", "tools", "--name", "t1")
	if got := cli("exec", "t1", "--", "cat", "/opt/tool/version", "/opt/tool/cfg"); got != "v1\ndebug=1\n" {
		t.Fatalf("exec in a sandbox of the environment: got %q", got)
	}
	if ins := cli("env", "inspect", "tools"); !strings.Contains(ins, "/opt/tool/cfg") {
		t.Fatalf("env inspect: got %s, want the write step", ins)
	}
	cli("rm", "t1")
	cli("env", "rm", "tools")
	if ls := cli("env", "ls"); strings.Contains(ls, "tools") {
		t.Fatalf("env ls after rm: got %s", ls)
	}
}
