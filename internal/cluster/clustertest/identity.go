package clustertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
)

// NodeServiceAccount is the node agents' service account (deploy/node.yaml).
const NodeServiceAccount = "forkbox-node"

// NodeNameExtra is the user extra the API server authenticates a token
// bound to a node's pod (or to the Node) with: the node's name.
const NodeNameExtra = "authentication.kubernetes.io/node-name"

// policyPath is the admission policy that binds a node agent to its node.
func policyPath() string { return filepath.Join(Root(), "deploy", "policy", "node-identity.yaml") }

// installPolicy applies deploy/policy/node-identity.yaml and waits until
// the API server enforces it (a policy takes effect a moment after it is
// stored): until a node agent's dry-run write of another node's
// ForkboxNode is refused.
func (p *Plane) installPolicy(ctx context.Context) error {
	if err := p.Apply(ctx, policyPath()); err != nil {
		return err
	}
	// The probe impersonates node agent "probe-a" (as system:masters, so
	// RBAC lets it through to admission) creating ForkboxNode "probe-b",
	// dry-run: nothing is stored.
	cfg := rest.CopyConfig(p.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + Namespace + ":" + NodeServiceAccount,
		Groups: []string{"system:masters"}, Extra: map[string][]string{NodeNameExtra: {"probe-a"}}}
	c, err := client.New(cfg, client.Options{Scheme: p.Client.Scheme()})
	if err != nil {
		return err
	}
	deadline := time.Now().Add(time.Minute)
	for {
		err := c.Create(ctx, &fbv1.ForkboxNode{ObjectMeta: metav1.ObjectMeta{Name: "probe-b"}}, client.DryRunAll)
		if apierrors.IsForbidden(err) && strings.Contains(err.Error(), "forkbox-node-identity") {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the node identity policy is not enforced after a minute: a probe write got %v", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond): // polling a condition with a deadline
		}
	}
}

// Apply creates every object of the YAML manifest at path (several
// documents); objects already there are left as they are.
func (p *Plane) Apply(ctx context.Context, path string) error {
	return p.apply(ctx, path, nil)
}

// apply is Apply of the objects keep takes (all when nil); an error of
// keep stops it.
func (p *Plane) apply(ctx context.Context, path string, keep func(*unstructured.Unstructured) (bool, error)) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	d := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	for {
		var u unstructured.Unstructured
		if err := d.Decode(&u.Object); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if len(u.Object) == 0 {
			continue
		}
		if keep != nil {
			if ok, err := keep(&u); err != nil {
				return fmt.Errorf("%s: %w", path, err)
			} else if !ok {
				continue
			}
		}
		if err := p.Client.Create(ctx, &u); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("%s: %s %s: %w", path, u.GetKind(), u.GetName(), err)
		}
	}
}

// NodeKubeconfig gives the agent of node the identity a DaemonSet pod on
// that node has in production, and writes its kubeconfig to path: the
// service account of deploy/node.yaml bound to the ClusterRole of
// deploy/rbac/node, a Pod of it bound to node (never run: there is no
// kubelet), and a token of the service account bound to that Pod, which
// the API server authenticates as the service account with the extra
// NodeNameExtra = node. The token lasts a day; deleting the Pod revokes
// it. via, when not "", is the API server's address the kubeconfig uses
// (host:port), still checking the server's certificate.
func (p *Plane) NodeKubeconfig(ctx context.Context, node, path, via string) error {
	if err := p.nodeAccount(ctx); err != nil {
		return err
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: NodeServiceAccount + "-" + node,
		Labels: map[string]string{"app.kubernetes.io/name": NodeServiceAccount}},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: NodeServiceAccount,
			Containers: []corev1.Container{{Name: "node", Image: "forkbox:dev"}}}}
	if err := p.Client.Create(ctx, pod); apierrors.IsAlreadyExists(err) {
		err = p.Client.Get(ctx, client.ObjectKeyFromObject(pod), pod)
		if err == nil && pod.Spec.NodeName != node {
			err = fmt.Errorf("pod %s is bound to node %s, not %s", pod.Name, pod.Spec.NodeName, node)
		}
		if err != nil {
			return err
		}
	} else if err != nil {
		return fmt.Errorf("node %s's pod: %w", node, err)
	}
	tok, err := p.Token(ctx, &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID})
	if err != nil {
		return fmt.Errorf("node %s's token: %w", node, err)
	}
	return p.writeTokenKubeconfig(tok, path, via)
}

// Token mints a token of the node agents' service account bound to
// bound (nil: to nothing, as a token from a Secret would be).
func (p *Plane) Token(ctx context.Context, bound *authenticationv1.BoundObjectReference) (string, error) {
	if err := p.nodeAccount(ctx); err != nil {
		return "", err
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: NodeServiceAccount}}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: ptr.To(int64(24 * 3600)), BoundObjectRef: bound}}
	if err := p.Client.SubResource("token").Create(ctx, sa, tr); err != nil {
		return "", err
	}
	return tr.Status.Token, nil
}

// nodeAccount makes the ServiceAccount and ClusterRoleBinding of
// deploy/node.yaml and the ClusterRole of deploy/rbac/node (those there
// already are kept).
func (p *Plane) nodeAccount(ctx context.Context) error {
	if err := p.Apply(ctx, filepath.Join(Root(), "deploy", "rbac", "node", "role.yaml")); err != nil {
		return err
	}
	// deploy/node.yaml's account and binding, its DaemonSet left out.
	return p.apply(ctx, filepath.Join(Root(), "deploy", "node.yaml"), func(u *unstructured.Unstructured) (bool, error) {
		if k := u.GetKind(); k != "ServiceAccount" && k != "ClusterRoleBinding" {
			return false, nil
		}
		if u.GetNamespace() != "" && u.GetNamespace() != Namespace {
			return false, fmt.Errorf("%s %s is in namespace %s, the tests' is %s", u.GetKind(), u.GetName(), u.GetNamespace(), Namespace)
		}
		return true, nil
	})
}

// writeTokenKubeconfig writes a kubeconfig of the control plane with
// token as its credential.
func (p *Plane) writeTokenKubeconfig(token, path, via string) error {
	server := p.Config.Host
	if !strings.Contains(server, "://") {
		server = "https://" + server
	}
	cl := &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: p.Config.CAData}
	if via != "" {
		cl.Server, cl.TLSServerName = "https://"+via, "localhost"
	}
	cfg := clientcmdapi.Config{
		Clusters:       map[string]*clientcmdapi.Cluster{"envtest": cl},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{"node": {Token: token}},
		Contexts:       map[string]*clientcmdapi.Context{"node": {Cluster: "envtest", AuthInfo: "node"}},
		CurrentContext: "node",
	}
	b, err := clientcmd.Write(cfg)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}
