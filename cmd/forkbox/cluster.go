package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/cluster/controller"
	"github.com/forkbox/forkbox/internal/cluster/kube"
	"github.com/forkbox/forkbox/internal/cluster/nodeagent"
	"github.com/forkbox/forkbox/internal/daemon"
	"github.com/forkbox/forkbox/internal/transfer"
)

// clusterFlags are serve's flags for cluster mode (serve --cluster).
type clusterFlags struct {
	on                         bool
	node, kubeconfig, endpoint string
	namespace                  string
	lease                      time.Duration
	transferListen             string
	transferAdvertise          string
	transferMax                int64
	previewAdvertise           string
}

func (cf *clusterFlags) register(cmd *cobra.Command) {
	f := cmd.Flags()
	host, _ := os.Hostname()
	f.BoolVar(&cf.on, "cluster", false, "also run as a node of a Kubernetes cluster: register a ForkboxNode and run the Sandboxes bound to it (see README, Cluster mode)")
	f.StringVar(&cf.node, "node-name", envOr("FORKBOX_NODE_NAME", host), "cluster mode: this node's ForkboxNode name")
	f.StringVar(&cf.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "cluster mode: kubeconfig file (default: the in-cluster service account)")
	f.StringVar(&cf.endpoint, "node-endpoint", "", "cluster mode: where this node's API is reached (host:port), registered on its ForkboxNode")
	f.StringVar(&cf.namespace, "cluster-namespace", controller.DefaultNamespace, "cluster mode: namespace of the node's heartbeat Lease")
	f.DurationVar(&cf.lease, "lease-duration", 40*time.Second, "cluster mode: the node is NotReady when its Lease is not renewed for this long")
	f.StringVar(&cf.transferListen, "transfer-listen", "", "cluster mode: serve this node's checkpoints to other nodes on this address, e.g. :7071 (mutual TLS, pinned certificates), and pull the ones its sandboxes need; empty: off, children go only to nodes that hold their checkpoint")
	f.StringVar(&cf.transferAdvertise, "transfer-advertise", "", "cluster mode: where other nodes reach the transfer listener (host:port; default: --transfer-listen when it names a host, else the host of --node-endpoint or this host's name, with its port)")
	f.StringVar(&cf.previewAdvertise, "node-preview-endpoint", "", "cluster mode: where the gateway reaches this node's preview listener (--ports), registered on its ForkboxNode (default: --ports when it names a host, else the host of --node-endpoint with its port)")
	f.Int64Var(&cf.transferMax, "transfer-max-bytes", 64<<30, "cluster mode: the most one checkpoint pulled from another node may bring")
}

// transferOptions are the node agent's transfer settings (nil: off).
func (cf *clusterFlags) transferOptions(d *daemon.Daemon) (*nodeagent.TransferOptions, error) {
	if cf.transferListen == "" {
		return nil, nil
	}
	lhost, port, err := net.SplitHostPort(cf.transferListen)
	if err != nil {
		return nil, fmt.Errorf("--transfer-listen %q: %v: %w", cf.transferListen, err, errdefs.ErrInvalidArgument)
	}
	adv := cf.transferAdvertise
	if ip := net.ParseIP(lhost); adv == "" && lhost != "" && (ip == nil || !ip.IsUnspecified()) {
		adv = cf.transferListen
	}
	if adv == "" {
		host, _ := os.Hostname()
		if h, _, err := net.SplitHostPort(cf.endpoint); err == nil && h != "" {
			host = h
		}
		adv = net.JoinHostPort(host, port)
	}
	return &nodeagent.TransferOptions{Listen: cf.transferListen, Advertise: adv, Dir: filepath.Join(d.StateDir(), "transfer"),
		Limits: transfer.Limits{MaxBytes: cf.transferMax}}, nil
}

// previewEndpoint is where the gateway reaches the daemon's preview
// listener bound to addr ("" without one): --node-preview-endpoint, or
// addr when it names a host, else the host of --node-endpoint (or this
// host's name) with addr's port.
func (cf *clusterFlags) previewEndpoint(addr string) string {
	if cf.previewAdvertise != "" || addr == "" {
		return cf.previewAdvertise
	}
	lhost, port, err := net.SplitHostPort(addr)
	if err != nil {
		return ""
	}
	if ip := net.ParseIP(lhost); lhost != "" && (ip == nil || !ip.IsUnspecified()) {
		return addr
	}
	host, _ := os.Hostname()
	if h, _, err := net.SplitHostPort(cf.endpoint); err == nil && h != "" {
		host = h
	}
	return net.JoinHostPort(host, port)
}

// start runs the node agent beside the daemon until ctx ends; done
// yields its error once it has stopped (nil channel: not in cluster mode).
func (cf *clusterFlags) start(ctx context.Context, d *daemon.Daemon, log *slog.Logger) (done <-chan error, err error) {
	if !cf.on {
		return nil, nil
	}
	cfg, err := kube.Config(cf.kubeconfig)
	if err != nil {
		return nil, err
	}
	to, err := cf.transferOptions(d)
	if err != nil {
		return nil, err
	}
	ch := make(chan error, 1)
	go func() {
		ch <- nodeagent.Run(ctx, nodeagent.Options{Daemon: d, Config: cfg, NodeName: cf.node, Endpoint: cf.endpoint,
			PreviewEndpoint: cf.previewEndpoint(d.PortsAddr()),
			Namespace:       cf.namespace, LeaseDuration: cf.lease, Version: version(), Transfer: to,
			Log: log.With(slog.String("component", "node-agent"))})
	}()
	return ch, nil
}

func controllerCmd() *cobra.Command {
	var kubeconfig, namespace, metrics, health, level string
	var leaderElect bool
	var retention time.Duration
	cmd := &cobra.Command{
		Use:   "controller",
		Short: "Run the cluster controller: placement, forks, node leases (one replica leads)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var lv slog.Level
			if err := lv.UnmarshalText([]byte(level)); err != nil {
				return err
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lv}))
			cfg, err := kube.Config(kubeconfig)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, os.Interrupt)
			defer stop()
			if retention <= 0 {
				return fmt.Errorf("--closed-retention %s: want a positive duration: %w", retention, errdefs.ErrInvalidArgument)
			}
			if err := controller.Run(ctx, controller.Options{Config: cfg, LeaderElection: leaderElect, Namespace: namespace,
				MetricsAddr: metrics, HealthAddr: health, Retention: retention, Log: log}); err != nil {
				return fmt.Errorf("controller: %w", err)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file (default: the in-cluster service account)")
	f.StringVar(&namespace, "namespace", controller.DefaultNamespace, "namespace of the leader-election Lease and of the nodes' Leases")
	f.BoolVar(&leaderElect, "leader-elect", true, "take turns with other replicas through a Lease")
	f.StringVar(&metrics, "metrics-addr", "0", "serve controller metrics on this address (0 = off)")
	f.StringVar(&health, "health-addr", "", "serve /healthz and /readyz on this address")
	f.StringVar(&level, "log-level", "info", "debug, info, warn or error")
	f.DurationVar(&retention, "closed-retention", controller.DefaultRetention, "how long a closed sandbox's object stays (its record and ledger, as one host keeps them) before it is deleted")
	return cmd
}

// version is the module version this binary was built from ("devel" in
// a checkout).
func version() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "devel"
}
