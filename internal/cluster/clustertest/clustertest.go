// Package clustertest runs a real control plane for cluster tests: etcd
// and kube-apiserver from KUBEBUILDER_ASSETS (scripts/build-control-plane.sh
// builds them) through controller-runtime's envtest, with forkbox's CRDs
// from deploy/crd installed. Without the binaries the tests skip, saying
// why; in CI (CI=true) that is a failure.
package clustertest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/forkbox/forkbox/internal/cluster/kube"
)

// Plane is a running control plane (or why there is none).
type Plane struct {
	// Config is an admin's; KubeConfig the same as a kubeconfig file.
	Config     *rest.Config
	KubeConfig []byte
	Client     client.Client
	Env        *envtest.Environment
	skip       string
}

// Namespace is the namespace the tests' Leases live in (created).
const Namespace = "forkbox-system"

// Root is the repository's root directory.
func Root() string {
	_, file, _, _ := goruntime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

// missing says what this machine lacks for a control plane, or "".
func missing() string {
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		return "KUBEBUILDER_ASSETS is not set (run ./scripts/build-control-plane.sh, then export KUBEBUILDER_ASSETS=/var/cache/forkbox/envtest)"
	}
	for _, bin := range []string{"etcd", "kube-apiserver"} {
		if _, err := os.Stat(filepath.Join(dir, bin)); err != nil {
			return fmt.Sprintf("KUBEBUILDER_ASSETS=%s has no %s (run ./scripts/build-control-plane.sh %s)", dir, bin, dir)
		}
	}
	return ""
}

// Main runs a package's tests (m: a *testing.M, or a wrapper that starts
// more around it) against one control plane, started before and stopped
// after them; it returns the exit code for os.Exit.
func Main(m interface{ Run() int }, p *Plane) int {
	if why := missing(); why != "" {
		if os.Getenv("CI") == "true" {
			fmt.Fprintln(os.Stderr, "clustertest: FAIL: prerequisite missing in CI:", why)
			return 1
		}
		p.skip = why
		return m.Run()
	}
	if err := p.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "clustertest: control plane:", err)
		return 1
	}
	code := m.Run()
	if err := p.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "clustertest: stop control plane:", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// Missing says what this machine lacks for a control plane, or "".
func Missing() string { return missing() }

// Stop stops the control plane.
func (p *Plane) Stop() error { return p.Env.Stop() }

// Start starts a control plane from KUBEBUILDER_ASSETS with forkbox's
// CRDs, the Leases' namespace and the node identity admission policy of
// deploy/policy (Main does it for a test package).
func (p *Plane) Start() error {
	p.Env = &envtest.Environment{
		CRDInstallOptions:     envtest.CRDInstallOptions{Paths: []string{filepath.Join(Root(), "deploy", "crd")}},
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := p.Env.Start()
	if err != nil {
		return err
	}
	p.Config, p.KubeConfig = cfg, p.Env.KubeConfig
	scheme := kube.NewScheme()
	// Tests bind users to the ClusterRoles in deploy/rbac and mint the
	// node agents' tokens.
	for _, add := range []func(*runtime.Scheme) error{rbacv1.AddToScheme, authenticationv1.AddToScheme} {
		if err := add(scheme); err != nil {
			p.Env.Stop()
			return err
		}
	}
	if p.Client, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		p.Env.Stop()
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}); err != nil {
		p.Env.Stop()
		return err
	}
	if err := p.installPolicy(ctx); err != nil {
		p.Env.Stop()
		return err
	}
	return nil
}

// Need skips t when there is no control plane (outside CI).
func (p *Plane) Need(t testing.TB) {
	t.Helper()
	if p.skip != "" {
		t.Skip(p.skip)
	}
}

// Eventually polls cond every 50ms until it holds or timeout passes,
// then fails t with the last reason cond gave.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for {
		ok, why := cond()
		if ok {
			return
		}
		last = why
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %s: %s", what, timeout, last)
		}
		time.Sleep(50 * time.Millisecond) // polling a condition with a deadline, not synchronisation by sleep
	}
}
