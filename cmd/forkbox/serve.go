package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/internal/daemon"
	"github.com/forkbox/forkbox/internal/server"
)

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func serveCmd() *cobra.Command {
	var cfg daemon.Config
	var socket, tcp, token, level, btrfsSize string
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the forkbox daemon (as root)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			var lv slog.Level
			if err := lv.UnmarshalText([]byte(level)); err != nil {
				return err
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lv}))
			if btrfsSize != "" {
				n, err := daemon.ParseMemory(btrfsSize)
				if err != nil {
					return err
				}
				cfg.BtrfsSize = n
			}
			cfg.Log = log
			ctx := cmd.Context()
			d, err := daemon.New(ctx, cfg)
			if err != nil {
				return err
			}
			defer d.Close()
			srv, err := server.Listen(d, socket, tcp, token, log)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
			defer stop()
			<-ctx.Done()
			log.Info("shutting down; sandboxes keep running and are found again on the next start")
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			return srv.Shutdown(sctx)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.StateDir, "state-dir", envOr("FORKBOX_STATE_DIR", "/var/lib/forkbox"), "state directory")
	f.StringVar(&cfg.RunDir, "run-dir", envOr("FORKBOX_RUN_DIR", "/run/forkbox"), "runtime state directory")
	f.StringVar(&socket, "socket", envOr("FORKBOX_SOCKET", client.DefaultSocket), "unix socket of the API")
	f.StringVar(&tcp, "tcp", "", "also listen on this TCP address (needs --token)")
	f.StringVar(&token, "api-token", os.Getenv("FORKBOX_API_TOKEN"), "bearer token required on the TCP listener")
	f.StringVar(&cfg.AgentPath, "agent", "", "forkbox-agent binary (default: next to this binary)")
	f.StringVar(&cfg.RuntimeBinary, "runsc", "", "runsc binary (default: from PATH)")
	f.StringVar(&cfg.CrunBinary, "crun", "", "crun binary (default: from PATH)")
	f.StringVar(&cfg.DefaultRuntime, "runtime", "gvisor", "default runtime: gvisor (untrusted code) or crun (trusted code, fastest)")
	f.StringVar(&cfg.Snapshotter, "snapshotter", "btrfs", "btrfs (O(1) forks) or copy (slow fallback)")
	f.StringVar(&btrfsSize, "btrfs-size", "", "size of the sparse btrfs file made when the state dir is not on btrfs (default 16Gi)")
	f.StringVar(&cfg.Subnet, "subnet", "", "sandbox subnet (default 10.88.0.0/16)")
	f.StringVar(&cfg.Bridge, "bridge", "", "host bridge of the sandbox network (default forkbox0)")
	f.StringVar(&cfg.NetTable, "net-table", "", "nftables table of the sandbox network (default forkbox)")
	f.StringVar(&cfg.VethPrefix, "veth-prefix", "", "prefix of host-side veth names, at most 5 bytes (default fbx)")
	f.StringVar(&cfg.CgroupParent, "cgroup-parent", "forkbox", "cgroup under which sandboxes get theirs")
	f.IntVar(&cfg.MaxSandboxes, "max-sandboxes", 100, "limit on live sandboxes")
	f.StringVar(&level, "log-level", "info", "debug, info, warn or error")
	return cmd
}
