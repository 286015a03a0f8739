package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fbclient "github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/clustertest"
)

// Credentials through the gateway, with the daemon's behaviour (the
// SDKs' credential tests) as the oracle: set on a running sandbox (env
// and file), listed by name, replaced, carried to forks and restores but
// for per-fork ones (FailedPrecondition unless given), deleted; the
// values in Secrets owned by the Sandbox (or the Fork), named by
// spec.credentials; a change made to the object directly reaches the
// running sandbox; and no value in the gateway's or nodes' logs, any
// object's spec or status, or any Event.
func TestGatewayCredentials(t *testing.T) {
	c := gateway(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	vals := map[string]string{}
	for _, k := range []string{"a", "b", "parent", "child", "restored", "direct"} {
		vals[k] = "fbval-" + k + "-" + randomToken()[:16]
	}
	name := "creds-" + randomToken()[:8] // another each run: an earlier run's Secrets stay (envtest collects no garbage)
	sb, err := c.CreateSandbox(ctx, fbclient.CreateOptions{Image: env.image, Name: name, Resources: fbclient.Resources{Memory: "256Mi"}})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close(context.Background())
	creds := sb.Credentials()

	// Refused input changes nothing (the daemon's classes).
	for _, tc := range []struct {
		name, value string
		o           fbclient.CredentialOptions
		class       func(error) bool
	}{
		{"../x", "v", fbclient.CredentialOptions{}, errdefs.IsInvalidArgument},
		{"k", "v", fbclient.CredentialOptions{File: "../../etc/passwd"}, errdefs.IsInvalidArgument},
		{"k", "v", fbclient.CredentialOptions{Env: "A=B"}, errdefs.IsInvalidArgument},
		{"big", strings.Repeat("x", 64<<10+1), fbclient.CredentialOptions{}, errdefs.IsResourceExhausted},
	} {
		if err := creds.Set(ctx, tc.name, tc.value, tc.o); !tc.class(err) {
			t.Errorf("set %q (%d bytes, %+v): got %v, want the daemon's class", tc.name, len(tc.value), tc.o, err)
		}
	}

	if err := creds.Set(ctx, "API_KEY", vals["a"], fbclient.CredentialOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := creds.Set(ctx, "token", vals["parent"], fbclient.CredentialOptions{File: "token", PerFork: true}); err != nil {
		t.Fatal(err)
	}
	if got := credNames(t, sb); !slices.Equal(got, []string{"API_KEY", "token"}) {
		t.Fatalf("list: got %v, want [API_KEY token]", got)
	}
	if got := gsh(t, sb, "echo $API_KEY; cat /run/secrets/token"); got != vals["a"]+"\n"+vals["parent"] {
		t.Fatalf("exec: got %q", got)
	}
	obj := get(t, &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: gw.namespace, Name: name}})
	apiKey := secretOf(t, obj, "API_KEY")
	if errs := validation.IsDNS1123Subdomain(apiKey.Name); len(errs) > 0 {
		t.Errorf("secret name %q: %v", apiKey.Name, errs)
	}
	if len(apiKey.OwnerReferences) != 1 || apiKey.OwnerReferences[0].UID != obj.UID || apiKey.OwnerReferences[0].Kind != "Sandbox" {
		t.Errorf("secret %s owners: got %+v, want the Sandbox %s", apiKey.Name, apiKey.OwnerReferences, obj.UID)
	}
	if string(apiKey.Data["value"]) != vals["a"] {
		t.Errorf("secret %s holds another value", apiKey.Name)
	}

	// A new value: the same Secret, the running sandbox sees it at once.
	if err := creds.Set(ctx, "API_KEY", vals["b"], fbclient.CredentialOptions{}); err != nil {
		t.Fatal(err)
	}
	obj = get(t, obj)
	if again := secretOf(t, obj, "API_KEY"); again.Name != apiKey.Name || string(again.Data["value"]) != vals["b"] {
		t.Errorf("replaced: secret %s (was %s), value updated %v", again.Name, apiKey.Name, string(again.Data["value"]) == vals["b"])
	}
	if got := gsh(t, sb, "echo $API_KEY"); got != vals["b"]+"\n" {
		t.Fatalf("exec after the new value: got %q", got)
	}

	// The object is the truth: an entry added to spec.credentials by hand
	// (naming a Secret of one's own) reaches the running sandbox, and goes
	// when removed.
	own := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: gw.namespace, Name: name + "-own"}, Data: map[string][]byte{"k": []byte(vals["direct"])}}
	if err := plane.Client.Create(ctx, own); err != nil {
		t.Fatal(err)
	}
	defer plane.Client.Delete(context.Background(), own)
	editSpec(t, obj, func(cs []fbv1.Credential) []fbv1.Credential {
		return append(cs, fbv1.Credential{Name: "DIRECT", SecretRef: fbv1.SecretKeyRef{Name: own.Name, Key: "k"}})
	})
	waitExec(t, sb, "echo $DIRECT", vals["direct"]+"\n")
	editSpec(t, obj, func(cs []fbv1.Credential) []fbv1.Credential {
		return slices.DeleteFunc(cs, func(c fbv1.Credential) bool { return c.Name == "DIRECT" })
	})
	waitExec(t, sb, "echo \"[$DIRECT]\"", "[]\n")

	// Forks: a per-fork credential must be given; the rest is inherited.
	var forks fbv1.ForkList
	if err := plane.Client.List(ctx, &forks, client.InNamespace(gw.namespace)); err != nil {
		t.Fatal(err)
	}
	before := len(forks.Items)
	if _, err := sb.Fork(ctx, fbclient.ForkOptions{Tag: "no-token"}); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("fork without the per-fork credential: got %v, want FailedPrecondition", err)
	}
	if _, err := sb.Fork(ctx, fbclient.ForkOptions{Credentials: map[string]string{"token": "x", "nope": "x"}}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("fork with a credential the source lacks: got %v, want InvalidArgument", err)
	}
	if err := plane.Client.List(ctx, &forks, client.InNamespace(gw.namespace)); err != nil || len(forks.Items) != before {
		t.Fatalf("refused forks left objects: %d forks, had %d (%v)", len(forks.Items), before, err)
	}
	res, err := sb.Fork(ctx, fbclient.ForkOptions{Tag: "with-token", Credentials: map[string]string{"token": vals["child"]}})
	if err != nil || res.Children[0].Err != nil {
		t.Fatalf("fork: %v %v", err, res)
	}
	child := res.Children[0].Sandbox
	if got := gsh(t, child, "echo $API_KEY; cat /run/secrets/token"); got != vals["b"]+"\n"+vals["child"] {
		t.Fatalf("child: got %q", got)
	}
	if got := credNames(t, child); !slices.Equal(got, []string{"API_KEY", "token"}) {
		t.Fatalf("child's list: got %v", got)
	}
	childObj := objectOf(t, child.ID)
	if tok := secretOf(t, childObj, "token"); tok.Name == secretOf(t, obj, "token").Name || len(tok.OwnerReferences) != 1 || tok.OwnerReferences[0].Kind != "Fork" {
		t.Errorf("child's token secret %s: owners %+v, want its own, owned by the Fork", tok.Name, tok.OwnerReferences)
	}
	if inh := secretOf(t, childObj, "API_KEY"); inh.Name != apiKey.Name || len(inh.OwnerReferences) != 2 {
		t.Errorf("child's API_KEY secret %s (parent's %s): owners %+v, want the parent's, also owned by the Fork", inh.Name, apiKey.Name, inh.OwnerReferences)
	}
	child.Close(ctx)

	// A restore carries the source's credentials as they are now; a
	// per-fork one must be given there too.
	ck, err := sb.Checkpoint(ctx, "creds-ck")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.RestoreSnapshot(ctx, ck.Id, fbclient.Overrides{}, nil); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("restore without the per-fork credential: got %v, want FailedPrecondition", err)
	}
	restored, err := c.RestoreSnapshot(ctx, ck.Id, fbclient.Overrides{}, map[string]string{"token": vals["restored"]})
	if err != nil {
		t.Fatal(err)
	}
	if got := gsh(t, restored, "echo $API_KEY; cat /run/secrets/token"); got != vals["b"]+"\n"+vals["restored"] {
		t.Fatalf("restored: got %q", got)
	}
	restored.Close(ctx)

	// Delete: gone from the list, the sandbox and the object; its Secret too.
	if err := creds.Delete(ctx, "API_KEY"); err != nil {
		t.Fatal(err)
	}
	if got := credNames(t, sb); !slices.Equal(got, []string{"token"}) {
		t.Fatalf("list after delete: got %v, want [token]", got)
	}
	if got := gsh(t, sb, "echo \"[$API_KEY]\""); got != "[]\n" {
		t.Fatalf("exec after delete: got %q", got)
	}
	var s corev1.Secret
	if err := plane.Client.Get(ctx, client.ObjectKey{Namespace: gw.namespace, Name: apiKey.Name}, &s); err == nil {
		t.Errorf("secret %s is still there after the delete", apiKey.Name)
	}

	// The nodes read the Secrets of tenant namespaces only (a Role bound
	// in each, deploy/rbac/node/secrets.yaml): a credential naming a Secret
	// elsewhere fails the create, and says why.
	other := testNamespace(t)
	create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: other, Name: "creds-other"}, Data: map[string][]byte{"k": []byte(vals["direct"])}})
	osb := newSandbox(other, "creds-other", "", "")
	osb.Spec.Credentials = []fbv1.Credential{{Name: "X", SecretRef: fbv1.SecretKeyRef{Name: "creds-other", Key: "k"}}}
	create(t, osb)
	clustertest.Eventually(t, 2*time.Minute, "sandbox "+osb.Name+" refused its Secret", func() (bool, string) {
		get(t, osb)
		return osb.Status.Phase == fbv1.PhaseFailed && strings.Contains(osb.Status.Message, "secret creds-other") &&
			strings.Contains(osb.Status.Message, "forbidden"), string(osb.Status.Phase) + ": " + osb.Status.Message
	})

	// No value anywhere but in Secrets and the sandboxes.
	where := map[string][]byte{}
	where["gateway log"], _ = os.ReadFile(filepath.Join(cl.Dir, "gateway.log"))
	for _, n := range nodes() {
		where[n.Name+" log"], _ = os.ReadFile(n.LogPath())
	}
	for _, l := range []client.ObjectList{&fbv1.SandboxList{}, &fbv1.ForkList{}, &fbv1.CheckpointList{}, &corev1.EventList{}} {
		if err := plane.Client.List(ctx, l, client.InNamespace(gw.namespace)); err != nil {
			t.Fatal(err)
		}
		b, err := json.Marshal(l)
		if err != nil {
			t.Fatal(err)
		}
		where[typeName(l)] = b
	}
	for what, b := range where {
		if len(b) == 0 {
			t.Errorf("%s: nothing read", what)
		}
		for k, v := range vals {
			if strings.Contains(string(b), v) {
				t.Errorf("the %s value appears in %s", k, what)
			}
		}
	}

	// At most 64 credentials a sandbox (the daemon's limit); replacing one
	// at the limit is fine.
	for i := len(credNames(t, sb)); i < 64; i++ {
		if err := creds.Set(ctx, fmt.Sprintf("C%d", i), "v", fbclient.CredentialOptions{}); err != nil {
			t.Fatalf("credential %d: %v", i+1, err)
		}
	}
	if err := creds.Set(ctx, "ONE_TOO_MANY", "v", fbclient.CredentialOptions{}); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("a 65th credential: got %v, want ResourceExhausted", err)
	}
	if err := creds.Set(ctx, "C10", "w", fbclient.CredentialOptions{}); err != nil {
		t.Fatalf("replacing one at the limit: %v", err)
	}
	if got := gsh(t, sb, "echo $C10"); got != "w\n" {
		t.Fatalf("replaced at the limit: got %q", got)
	}
}

func typeName(l client.ObjectList) string {
	switch l.(type) {
	case *fbv1.SandboxList:
		return "sandboxes"
	case *fbv1.ForkList:
		return "forks"
	case *fbv1.CheckpointList:
		return "checkpoints"
	}
	return "events"
}

func credNames(t *testing.T, sb *fbclient.Sandbox) []string {
	t.Helper()
	l, err := sb.Credentials().List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, c := range l {
		out = append(out, c.Name)
	}
	slices.Sort(out)
	return out
}

// secretOf is the Secret obj's credential name names.
func secretOf(t *testing.T, obj *fbv1.Sandbox, name string) *corev1.Secret {
	t.Helper()
	i := slices.IndexFunc(obj.Spec.Credentials, func(c fbv1.Credential) bool { return c.Name == name })
	if i < 0 {
		t.Fatalf("sandbox %s: no credential %s in spec.credentials %+v", obj.Name, name, obj.Spec.Credentials)
	}
	var s corev1.Secret
	if err := plane.Client.Get(context.Background(), client.ObjectKey{Namespace: obj.Namespace, Name: obj.Spec.Credentials[i].SecretRef.Name}, &s); err != nil {
		t.Fatal(err)
	}
	return &s
}

// objectOf is the Sandbox object of local sandbox id.
func objectOf(t *testing.T, id string) *fbv1.Sandbox {
	t.Helper()
	var l fbv1.SandboxList
	if err := plane.Client.List(context.Background(), &l, client.InNamespace(gw.namespace)); err != nil {
		t.Fatal(err)
	}
	for i := range l.Items {
		if l.Items[i].Status.LocalID == id {
			return &l.Items[i]
		}
	}
	t.Fatalf("no Sandbox object has local ID %s", id)
	return nil
}

func editSpec(t *testing.T, obj *fbv1.Sandbox, edit func([]fbv1.Credential) []fbv1.Credential) {
	t.Helper()
	update(t, obj, func(obj *fbv1.Sandbox) { obj.Spec.Credentials = edit(obj.Spec.Credentials) })
}

// waitExec waits until cmd in sb prints want.
func waitExec(t *testing.T, sb *fbclient.Sandbox, cmd, want string) {
	t.Helper()
	var got string
	if err := waitFor(60*time.Second, func() error {
		var out strings.Builder
		if _, err := sb.Exec(context.Background(), fbclient.ExecOptions{Shell: cmd, Stdout: &out}); err != nil {
			return err
		}
		if got = out.String(); got != want {
			return errdefs.ErrUnavailable
		}
		return nil
	}); err != nil {
		t.Fatalf("%q: got %q, want %q", cmd, got, want)
	}
}
