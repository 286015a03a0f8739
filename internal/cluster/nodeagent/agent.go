// Package nodeagent is the cluster half of `forkbox serve --cluster`: it
// registers the host as a ForkboxNode, renews the node's heartbeat Lease,
// watches only the Sandboxes and Checkpoints bound to this node (a field
// selector on spec.nodeName, served by the CRDs' selectable field), drives
// the in-process daemon to match them, and writes their status and
// Kubernetes Events.
//
// Local facts (subvolumes, processes, netns) stay in the daemon's SQLite
// ledger, which its own reconcile trusts; the objects are the cluster's
// truth. A local sandbox is named after its object's UID, so an agent
// that crashed between creating it and writing status finds it again.
//
// +kubebuilder:rbac:groups=forkbox.dev,resources=forkboxnodes,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups=forkbox.dev,resources=forkboxnodes/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=forkbox.dev,resources=sandboxes;checkpoints,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=forkbox.dev,resources=sandboxes/status;checkpoints/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=forkbox.dev,resources=sandboxes/finalizers;checkpoints/finalizers,verbs=update
// +kubebuilder:rbac:groups=forkbox.dev,resources=environments,verbs=get;list;watch
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
package nodeagent

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"golang.org/x/time/rate"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/kube"
	"github.com/forkbox/forkbox/internal/daemon"
)

// Options configure a node agent.
type Options struct {
	Daemon *daemon.Daemon
	Config *rest.Config
	// NodeName names the ForkboxNode (required).
	NodeName string
	// Endpoint is where the node's API is reached (host:port), if any.
	Endpoint string
	// PreviewEndpoint is where the node's preview listener is reached
	// (host:port), if it has one.
	PreviewEndpoint string
	// Namespace holds the heartbeat Lease (default forkbox-system).
	Namespace string
	// LeaseDuration is how long a renewal counts (default 40s); the agent
	// renews every third of it.
	LeaseDuration time.Duration
	// Resync is how often a bound sandbox's local state is looked at
	// again besides on changes to its object (default 30s).
	Resync time.Duration
	// Transfer, when set, serves this node's checkpoints to peers and
	// pulls those its sandboxes need (nil: the node takes only sandboxes
	// whose checkpoint it holds).
	Transfer *TransferOptions
	// Version is the forkbox version registered.
	Version string
	Log     *slog.Logger
}

func (o *Options) setDefaults() error {
	if o.NodeName == "" || o.Daemon == nil || o.Config == nil {
		return fmt.Errorf("node agent: a node name, a daemon and a kubernetes config are required: %w", errdefs.ErrInvalidArgument)
	}
	if o.Namespace == "" {
		o.Namespace = "forkbox-system"
	}
	if o.LeaseDuration == 0 {
		o.LeaseDuration = 40 * time.Second
	}
	if o.LeaseDuration < 2*time.Second {
		return fmt.Errorf("node agent: lease duration %s: want at least 2s: %w", o.LeaseDuration, errdefs.ErrInvalidArgument)
	}
	if o.Resync == 0 {
		o.Resync = 30 * time.Second
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	return nil
}

// Run runs the agent until ctx ends.
func Run(ctx context.Context, o Options) error {
	if err := o.setDefaults(); err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(o.Config, manager.Options{
		Scheme:  kube.NewScheme(),
		Logger:  kube.SetLogger(o.Log.With(slog.String("node", o.NodeName))),
		Metrics: metricsserver.Options{BindAddress: "0"},
		Cache:   CacheOptions(o.NodeName, o.Namespace),
	})
	if err != nil {
		return fmt.Errorf("node agent manager: %w", err)
	}
	if err := Setup(ctx, mgr, o); err != nil {
		return err
	}
	return mgr.Start(ctx)
}

// CacheOptions make a manager's cache hold only what node needs: its own
// Sandboxes and Checkpoints (selected by the API server, not filtered
// here) and the Leases of namespace.
func CacheOptions(node, namespace string) cache.Options {
	mine := fields.OneTermEqualSelector(fbv1.NodeNameField, node)
	return cache.Options{ByObject: map[client.Object]cache.ByObject{
		&fbv1.Sandbox{}:         {Field: mine},
		&fbv1.Checkpoint{}:      {Field: mine},
		&coordinationv1.Lease{}: {Namespaces: map[string]cache.Config{namespace: {}}},
	}}
}

// Setup registers the agent's heartbeat and reconcilers with mgr, whose
// cache must select Sandboxes and Checkpoints of this node only (tests
// run it in a manager of their own).
func Setup(ctx context.Context, mgr manager.Manager, o Options) error {
	if err := o.setDefaults(); err != nil {
		return err
	}
	a := &agent{o: o, log: o.Log.With(slog.String("node", o.NodeName)), c: mgr.GetClient(), api: mgr.GetAPIReader(),
		d: o.Daemon, rec: mgr.GetEventRecorder("forkbox-node")}
	return a.setup(ctx, mgr)
}

func (a *agent) setup(ctx context.Context, mgr manager.Manager) error {
	if err := kube.IndexNodeName(ctx, mgr.GetFieldIndexer()); err != nil {
		return err
	}
	if err := a.setupTransfer(ctx, mgr); err != nil {
		return err
	}
	if err := mgr.Add(manager.RunnableFunc(a.heartbeat)); err != nil {
		return err
	}
	// Several at once: an Environment's setup runs inside one reconcile
	// (never two of one object at a time) and must not hold up the rest.
	if err := ctrl.NewControllerManagedBy(mgr).Named("node-sandboxes").For(&fbv1.Sandbox{}).
		WithOptions(controller.Options{MaxConcurrentReconciles: 4, RateLimiter: retryLimiter()}).Complete(&sandboxes{a}); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).Named("node-checkpoints").For(&fbv1.Checkpoint{}).
		WithOptions(controller.Options{RateLimiter: retryLimiter()}).Complete(&checkpoints{a})
}

// maxRetryDelay is the longest a failing create or capture waits for its
// next try.
const maxRetryDelay = 30 * time.Second

// retryLimiter spaces an object's retries as controller-runtime's default
// does (from 5 ms, doubling each failure, 10 a second over all objects)
// but never more than maxRetryDelay apart: the default's 1,000 s left a
// sandbox whose create had failed a dozen times for a passing reason (the
// daemon's limit, a pull) waiting long past any caller's deadline, and
// past the reason.
func retryLimiter() workqueue.TypedRateLimiter[reconcile.Request] {
	return workqueue.NewTypedMaxOfRateLimiter(
		workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](5*time.Millisecond, maxRetryDelay),
		&workqueue.TypedBucketRateLimiter[reconcile.Request]{Limiter: rate.NewLimiter(rate.Limit(10), 100)},
	)
}
