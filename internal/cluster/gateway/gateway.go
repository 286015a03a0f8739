// Package gateway is `forkbox serve --gateway`: the forkbox.v1 Connect API
// in front of a cluster, so that the CLI and the SDKs work against it
// unchanged. It keeps no state of its own:
//
//   - lifecycle calls become forkbox.dev/v1alpha1 objects in one namespace
//     (the gateway's tenant) and wait, with the caller's deadline, for
//     their status: CreateSandbox is a Sandbox that must reach Running,
//     Fork a Fork whose children are answered as they become ready,
//     Checkpoint a Checkpoint, Pause/Hibernate/Close a change of
//     spec.state (a closed sandbox's object stays, its record, until the
//     controller's retention: lifecycle.go),
//     BuildEnvironment an Environment that must be built (environments.go);
//   - sandbox-scoped calls (exec, files, PTY, copy, metrics, timeouts,
//     egress, events) are proxied to the API of the node that runs the
//     sandbox (its ForkboxNode's endpoint), streams pumped both ways,
//     cancelled with the caller;
//   - preview URLs (GetPortURL) are the gateway's own, on its own preview
//     listener with its own port tokens, relayed to the node's (preview.go).
//
// Sandbox IDs. The ID a caller sees is the node's own local ID of the
// sandbox (status.localID, "sb-..."), found again through a cache index.
// So every sandbox-scoped request is forwarded as it came, without
// rewriting its sandbox field or any ID inside a response (exec IDs,
// events, metrics, port URLs all name the same sandbox), and an ID the
// node prints in its logs is the one the caller holds. Object names are
// accepted wherever an ID is (as the daemon accepts names); the one
// field rewritten is then the name, to its local ID. Checkpoint IDs are
// likewise the capturing node's local ID ("ck-...").
//
// Credentials. The caller authenticates to the gateway with its own
// bearer token; the gateway reaches nodes with the node API token (the
// Secret the node DaemonSet reads), which it never forwards to a caller
// and which must differ from the caller's. A caller reaches only the
// sandboxes of the gateway's namespace and only the calls proxied here:
// never a node's image, environment or all-sandboxes API.
//
// +kubebuilder:rbac:groups=forkbox.dev,resources=sandboxes;checkpoints;forks;environments,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=forkbox.dev,resources=forkboxnodes,verbs=get;list;watch
package gateway

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime/debug"
	"time"

	"connectrpc.com/connect"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/forkbox/forkbox/api/forkbox/v1/forkboxv1connect"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/errdefs/errconnect"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/kube"
	"github.com/forkbox/forkbox/internal/httpserve"
	"github.com/forkbox/forkbox/internal/ports"
)

// MaxRequestBytes bounds one request message from a caller (as the
// daemon's server does).
const MaxRequestBytes = 32 << 20

// Options configure a gateway.
type Options struct {
	Config *rest.Config
	// Namespace holds the tenant's objects (default "default").
	Namespace string
	// Addr is the TCP address served; Token the bearer token callers
	// send (required).
	Addr, Token string
	// NodeToken is the bearer token of the nodes' APIs (required, and not
	// Token).
	NodeToken string
	// PortsAddr, when set, serves preview URLs of sandbox ports on this
	// TCP address (preview.go), with host names below PortsDomain
	// (default localhost) and port tokens from the key in file PortsKey
	// (created on first use; replicas share one).
	PortsAddr, PortsDomain, PortsKey string
	// MaxWait bounds a lifecycle call's wait when the caller set no
	// shorter deadline (default 5m).
	MaxWait time.Duration
	Log     *slog.Logger
}

func (o *Options) setDefaults() error {
	if o.Config == nil || o.Token == "" || o.NodeToken == "" || o.Addr == "" {
		return fmt.Errorf("gateway: a kubernetes config, an address, an API token and the nodes' API token are required: %w", errdefs.ErrInvalidArgument)
	}
	if subtle.ConstantTimeCompare([]byte(o.Token), []byte(o.NodeToken)) == 1 {
		return fmt.Errorf("gateway: the callers' API token must differ from the nodes' (a caller would hold the nodes' admin API): %w", errdefs.ErrInvalidArgument)
	}
	if o.Namespace == "" {
		o.Namespace = "default"
	}
	if o.MaxWait == 0 {
		o.MaxWait = 5 * time.Minute
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	return nil
}

// Gateway serves the API from the cluster's objects and its nodes.
type Gateway struct {
	o       Options
	log     *slog.Logger
	c       client.Client // reads from the cache, writes to the API server
	api     client.Reader // reads from the API server
	cache   cache.Cache
	changed *notifier
	nodes   *nodeClients
	preview *preview // nil without Options.PortsAddr
}

// Run serves until ctx ends.
func Run(ctx context.Context, o Options) error {
	if err := o.setDefaults(); err != nil {
		return err
	}
	var keys *ports.Keys
	if o.PortsAddr != "" {
		var err error
		if keys, err = openPreviewKeys(o.PortsKey, o.Namespace); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	g, cacheDone, err := start(ctx, o)
	if err != nil {
		return err
	}
	if keys != nil {
		if err := g.startPreview(keys); err != nil {
			cancel()
			<-cacheDone
			return err
		}
	}
	ln, err := net.Listen("tcp", o.Addr)
	if err != nil {
		g.closePreview()
		cancel()
		<-cacheDone
		return fmt.Errorf("gateway: listen %s: %w", o.Addr, err)
	}
	srv := httpserve.New(g.Handler(), true)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	g.log.Info("gateway listening (token required)", "addr", ln.Addr().String(), "namespace", o.Namespace)
	var serr error
	serving, caching := true, true
	select {
	case <-ctx.Done():
	case serr = <-served:
		serving = false
	case serr = <-cacheDone:
		caching = false
		serr = fmt.Errorf("gateway: cache stopped: %w", serr)
	}
	sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer scancel()
	err = errors.Join(srv.Shutdown(sctx), g.closePreview())
	if serving {
		<-served
	}
	cancel()
	if caching {
		<-cacheDone
	}
	g.nodes.close()
	if errors.Is(serr, http.ErrServerClosed) {
		serr = nil
	}
	return errors.Join(serr, err)
}

// closePreview stops the preview listener, if any, and waits for what it
// serves.
func (g *Gateway) closePreview() error {
	if g.preview == nil {
		return nil
	}
	return g.preview.close()
}

// start builds the gateway's cache (the namespace's Sandboxes,
// Checkpoints, Forks and Environments, and the ForkboxNodes), its
// indexes and event hooks, and waits for it to sync; cacheDone yields
// once it has stopped.
func start(ctx context.Context, o Options) (*Gateway, <-chan error, error) {
	scheme := kube.NewScheme()
	ch, err := cache.New(o.Config, cache.Options{Scheme: scheme, DefaultNamespaces: map[string]cache.Config{o.Namespace: {}}})
	if err != nil {
		return nil, nil, fmt.Errorf("gateway cache: %w", err)
	}
	if err := indexFields(ctx, ch); err != nil {
		return nil, nil, err
	}
	g := &Gateway{o: o, log: o.Log.With(slog.String("component", "gateway")), cache: ch, changed: newNotifier(),
		nodes: newNodeClients(o.NodeToken)}
	for _, obj := range []client.Object{&fbv1.Sandbox{}, &fbv1.Checkpoint{}, &fbv1.Fork{}, &fbv1.Environment{}, &fbv1.ForkboxNode{}} {
		inf, err := ch.GetInformer(ctx, obj)
		if err != nil {
			return nil, nil, fmt.Errorf("gateway informer: %w", err)
		}
		if _, err := inf.AddEventHandler(g.changed.handler()); err != nil {
			return nil, nil, err
		}
	}
	done := make(chan error, 1)
	go func() { done <- ch.Start(ctx) }()
	if !ch.WaitForCacheSync(ctx) {
		return nil, done, fmt.Errorf("gateway: the cache did not sync: %w", errdefs.ErrUnavailable)
	}
	if g.c, err = client.New(o.Config, client.Options{Scheme: scheme, Cache: &client.CacheOptions{Reader: ch}}); err != nil {
		return nil, done, err
	}
	if g.api, err = client.New(o.Config, client.Options{Scheme: scheme}); err != nil {
		return nil, done, err
	}
	return g, done, nil
}

// Handler is the gateway's API: the daemon's three services, behind the
// callers' bearer token.
func (g *Gateway) Handler() http.Handler {
	opts := []connect.HandlerOption{
		connect.WithReadMaxBytes(MaxRequestBytes),
		connect.WithInterceptors(errconnect.Interceptor(g.log)),
		connect.WithRecover(func(ctx context.Context, spec connect.Spec, _ http.Header, p any) error {
			g.log.Error("panic in handler", "procedure", spec.Procedure, "panic", p, "stack", string(debug.Stack()))
			return connect.NewError(connect.CodeInternal, fmt.Errorf("internal error in %s (see the gateway log)", spec.Procedure))
		}),
	}
	mux := http.NewServeMux()
	mux.Handle(forkboxv1connect.NewSandboxServiceHandler(&sandboxes{g}, opts...))
	mux.Handle(forkboxv1connect.NewImageServiceHandler(&images{g}, opts...))
	mux.Handle(forkboxv1connect.NewEnvironmentServiceHandler(&environments{g}, opts...))
	return g.requireToken(withStreamControl(mux))
}

func (g *Gateway) requireToken(next http.Handler) http.Handler {
	want := []byte("Bearer " + g.o.Token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			w.Header().Set("Connection", "close") // a refused caller keeps no connection
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			w.Write([]byte(`{"code":"unauthenticated","message":"the gateway needs Authorization: Bearer <its API token>"}`))
			return
		}
		next.ServeHTTP(w, r)
	})
}
