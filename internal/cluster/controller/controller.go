// Package controller is `forkbox controller`: the cluster-wide half of
// cluster mode. It places Sandboxes on ForkboxNodes (package placement
// holds the rules), turns a Fork into a Checkpoint plus its children,
// builds Environments and keeps their warm pools of Sandboxes, marks a
// node NotReady when its Lease expires (its sandboxes are reported Lost,
// never recreated elsewhere), releases the finalizers of deleted objects
// whose nodes have left the cluster (nodegone.go), and deletes closed Sandboxes after their retention
// (retention.go). It runs with leader election:
// one replica acts at a time.
//
// The node agents (package nodeagent) do everything on a host; the
// controller never talks to a node.
//
// +kubebuilder:rbac:groups=forkbox.dev,resources=sandboxes;checkpoints;forks;forkboxnodes;environments,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=forkbox.dev,resources=sandboxes/status;checkpoints/status;forks/status;forkboxnodes/status;environments/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=forkbox.dev,resources=sandboxes/finalizers;checkpoints/finalizers;forks/finalizers,verbs=update
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
package controller

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/forkbox/forkbox/internal/cluster/kube"
)

// Options configure the controller.
type Options struct {
	// Config reaches the kube-apiserver.
	Config *rest.Config
	// LeaderElection makes replicas take turns (on in production).
	LeaderElection bool
	// Namespace holds the leader-election Lease and the nodes' heartbeat
	// Leases (default forkbox-system).
	Namespace string
	// MetricsAddr serves controller-runtime's metrics ("" or "0": off);
	// HealthAddr its /healthz and /readyz ("": off).
	MetricsAddr, HealthAddr string
	// Retry is how often a sandbox that fits no node is tried again
	// besides when a node changes (default 30s).
	Retry time.Duration
	// Retention is how long a closed Sandbox's object (its record: get,
	// list --all, its ledger on its node) stays before it is deleted
	// (default DefaultRetention).
	Retention time.Duration
	Log       *slog.Logger
}

// DefaultNamespace holds forkbox's Leases.
const DefaultNamespace = "forkbox-system"

func (o *Options) setDefaults() {
	if o.Namespace == "" {
		o.Namespace = DefaultNamespace
	}
	if o.MetricsAddr == "" {
		o.MetricsAddr = "0"
	}
	if o.Retry == 0 {
		o.Retry = 30 * time.Second
	}
	if o.Retention <= 0 {
		o.Retention = DefaultRetention
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
}

// Run runs the controller until ctx ends.
func Run(ctx context.Context, o Options) error {
	o.setDefaults()
	mgr, err := ctrl.NewManager(o.Config, manager.Options{
		Scheme:                  kube.NewScheme(),
		Logger:                  kube.SetLogger(o.Log),
		LeaderElection:          o.LeaderElection,
		LeaderElectionID:        "forkbox-controller",
		LeaderElectionNamespace: o.Namespace,
		// Cancelling ctx gives up the lease at once, so a successor
		// need not wait for it to expire.
		LeaderElectionReleaseOnCancel: true,
		Metrics:                       metricsserver.Options{BindAddress: o.MetricsAddr},
		HealthProbeBindAddress:        o.HealthAddr,
		Cache:                         CacheOptions(o.Namespace),
	})
	if err != nil {
		return fmt.Errorf("controller manager: %w", err)
	}
	if err := Setup(ctx, mgr, o); err != nil {
		return err
	}
	return mgr.Start(ctx)
}

// CacheOptions restricts the controller's Lease cache to namespace.
func CacheOptions(namespace string) cache.Options {
	return cache.Options{ByObject: map[client.Object]cache.ByObject{
		&coordinationv1.Lease{}: {Namespaces: map[string]cache.Config{namespace: {}}},
	}}
}

// Setup registers the controller's indexes and reconcilers with mgr
// (tests run them in a manager of their own).
func Setup(ctx context.Context, mgr manager.Manager, o Options) error {
	o.setDefaults()
	if err := kube.IndexNodeName(ctx, mgr.GetFieldIndexer()); err != nil {
		return err
	}
	if err := indexSources(ctx, mgr.GetFieldIndexer()); err != nil {
		return err
	}
	rec := mgr.GetEventRecorder("forkbox-controller")
	if err := (&placer{c: mgr.GetClient(), api: mgr.GetAPIReader(), rec: rec, log: o.Log, retry: o.Retry, namespace: o.Namespace, assumed: map[string]string{}}).setup(mgr); err != nil {
		return err
	}
	if err := (&forker{c: mgr.GetClient(), api: mgr.GetAPIReader(), rec: rec, log: o.Log}).setup(mgr); err != nil {
		return err
	}
	if err := (&nodeWatch{c: mgr.GetClient(), api: mgr.GetAPIReader(), rec: rec, log: o.Log, namespace: o.Namespace}).setup(mgr); err != nil {
		return err
	}
	if err := (&environments{c: mgr.GetClient(), rec: rec, log: o.Log}).setup(mgr); err != nil {
		return err
	}
	if err := (&retention{c: mgr.GetClient(), log: o.Log, after: o.Retention}).setup(mgr); err != nil {
		return err
	}
	if err := (&pools{c: mgr.GetClient(), api: mgr.GetAPIReader(), rec: rec, log: o.Log, retry: o.Retry}).setup(mgr); err != nil {
		return err
	}
	return (&checkpoints{c: mgr.GetClient(), log: o.Log, retry: o.Retry, namespace: o.Namespace}).setup(mgr)
}
