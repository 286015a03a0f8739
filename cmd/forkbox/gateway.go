package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/cluster/gateway"
	"github.com/forkbox/forkbox/internal/cluster/kube"
)

// gatewayFlags are serve's flags for the gateway (serve --gateway).
type gatewayFlags struct {
	on                   bool
	namespace, nodeToken string
	portsKey             string
}

func (gf *gatewayFlags) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.BoolVar(&gf.on, "gateway", false, "serve the API in front of a cluster instead of running a daemon: calls become forkbox.dev objects, sandbox calls go to their node (needs --tcp, --api-token, --node-token, --kubeconfig; see README, Gateway)")
	f.StringVar(&gf.namespace, "gateway-namespace", envOr("FORKBOX_GATEWAY_NAMESPACE", "default"), "gateway: the namespace whose sandboxes its callers own")
	f.StringVar(&gf.portsKey, "ports-key", os.Getenv("FORKBOX_PORTS_KEY"), "gateway: the key file of its preview URLs' port tokens, with --ports (32 random bytes, made on first use; replicas share one, e.g. from a Secret)")
	f.StringVar(&gf.nodeToken, "node-token", os.Getenv("FORKBOX_NODE_TOKEN"), "gateway: the bearer token of the nodes' APIs (their --api-token; never the callers')")
}

// run serves the gateway until the process is told to stop.
func (gf *gatewayFlags) run(ctx context.Context, df *daemonFlags, cf *clusterFlags) error {
	if cf.on {
		return fmt.Errorf("--gateway and --cluster: a gateway runs no daemon; run the node agents apart: %w", errdefs.ErrInvalidArgument)
	}
	if df.tcp == "" {
		return fmt.Errorf("--gateway needs --tcp ADDR to listen on: %w", errdefs.ErrInvalidArgument)
	}
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(df.level)); err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lv}))
	cfg, err := kube.Config(cf.kubeconfig)
	if err != nil {
		return err
	}
	kube.SetLogger(log)
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
	defer stop()
	return gateway.Run(ctx, gateway.Options{Config: cfg, Namespace: gf.namespace, Addr: df.tcp, Token: df.token,
		NodeToken: gf.nodeToken, PortsAddr: df.cfg.PortsAddr, PortsDomain: df.cfg.PortsDomain, PortsKey: gf.portsKey, Log: log})
}
