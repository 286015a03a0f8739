package clustertest

import (
	"context"
	"fmt"
	"os"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"
)

// UserKubeconfig provisions a user called name bound to the ClusterRole
// in rolePath (and nothing else) and writes its kubeconfig to path.
func (p *Plane) UserKubeconfig(ctx context.Context, name, rolePath, path string) error {
	b, err := os.ReadFile(rolePath)
	if err != nil {
		return err
	}
	var role rbacv1.ClusterRole
	if err := yaml.Unmarshal(b, &role); err != nil {
		return fmt.Errorf("%s: %w", rolePath, err)
	}
	if err := p.Client.Create(ctx, &role); err != nil && !errors.IsAlreadyExists(err) {
		return err
	}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: name}}}
	if err := p.Client.Create(ctx, binding); err != nil && !errors.IsAlreadyExists(err) {
		return err
	}
	u, err := p.Env.AddUser(envtest.User{Name: name}, nil)
	if err != nil {
		return err
	}
	kc, err := u.KubeConfig()
	if err != nil {
		return err
	}
	return os.WriteFile(path, kc, 0o600)
}

// UserNamespaceRole gives the user called name the rules of the Role in
// rolePath (its first document) in namespace only.
func (p *Plane) UserNamespaceRole(ctx context.Context, name, rolePath, namespace string) error {
	return p.NamespaceRole(ctx, rolePath, namespace, rbacv1.Subject{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: name})
}

// NodeNamespaceRole gives the node agents' service account the rules of
// the Role in rolePath in namespace only (deploy/rbac/node/secrets.yaml:
// a tenant namespace's Secrets).
func (p *Plane) NodeNamespaceRole(ctx context.Context, rolePath, namespace string) error {
	return p.NamespaceRole(ctx, rolePath, namespace, rbacv1.Subject{Kind: "ServiceAccount", Name: NodeServiceAccount, Namespace: Namespace})
}

// NamespaceRole binds subject to the Role in rolePath (its first
// document), made in namespace.
func (p *Plane) NamespaceRole(ctx context.Context, rolePath, namespace string, subject rbacv1.Subject) error {
	b, err := os.ReadFile(rolePath)
	if err != nil {
		return err
	}
	var role rbacv1.Role
	if err := yaml.Unmarshal(b, &role); err != nil {
		return fmt.Errorf("%s: %w", rolePath, err)
	}
	if role.Kind != "Role" {
		return fmt.Errorf("%s: first document is a %q, want a Role", rolePath, role.Kind)
	}
	role.ObjectMeta = metav1.ObjectMeta{Name: role.Name, Namespace: namespace}
	if err := p.Client.Create(ctx, &role); err != nil && !errors.IsAlreadyExists(err) {
		return err
	}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role.Name, Namespace: namespace},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: role.Name},
		Subjects: []rbacv1.Subject{subject}}
	if err := p.Client.Create(ctx, binding); err != nil && !errors.IsAlreadyExists(err) {
		return err
	}
	return nil
}
