package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/daemon"
	"github.com/forkbox/forkbox/internal/e2b"
	"github.com/forkbox/forkbox/internal/memvault"
	"github.com/forkbox/forkbox/internal/metrics"
	"github.com/forkbox/forkbox/internal/server"
)

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// daemonFlags are the flags that say where a daemon keeps its state.
type daemonFlags struct {
	cfg                                  daemon.Config
	socket, tcp, token, level, btr, disk string
	copyMax                              string
	memKey, memVault                     string
	metrics, ui                          string
	e2b, e2bTemplate                     string
	metricsMax                           int
}

func (df *daemonFlags) config() (daemon.Config, error) {
	cfg := df.cfg
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(df.level)); err != nil {
		return cfg, err
	}
	cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lv}))
	if df.btr != "" {
		n, err := daemon.ParseMemory(df.btr)
		if err != nil {
			return cfg, err
		}
		cfg.BtrfsSize = n
	}
	if df.memKey != "" {
		k, err := memvault.ReadKey(df.memKey)
		if err != nil {
			return cfg, fmt.Errorf("--memory-image-key: %w", err)
		}
		cfg.MemoryImageKey = k
	}
	if df.memVault != "" {
		n, err := daemon.ParseMemory(df.memVault)
		if err != nil {
			return cfg, fmt.Errorf("--memory-vault-size: %w", err)
		}
		cfg.MemoryVaultSize = n
	}
	n, err := daemon.ParseDisk(df.disk)
	if err != nil {
		return cfg, fmt.Errorf("--default-disk: %w", err)
	}
	cfg.DefaultDisk = n
	if cfg.MaxCopyBytes, err = daemon.ParseDisk(df.copyMax); err != nil || cfg.MaxCopyBytes == 0 {
		return cfg, fmt.Errorf("--max-copy-size %q: want a size such as 1Gi: %w", df.copyMax, errdefs.ErrInvalidArgument)
	}
	return cfg, nil
}

func uninstallCmd() *cobra.Command {
	df := &daemonFlags{}
	var purge bool
	cmd := &cobra.Command{
		Use:   "uninstall",
		Short: "Close every sandbox and remove the daemon's host state (stop the daemon first)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if _, err := (&client.Client{Socket: df.socket}).ListSandboxes(cmd.Context(), false); err == nil {
				return fmt.Errorf("a daemon is answering on %s: stop it first: %w", df.socket, errdefs.ErrFailedPrecondition)
			}
			cfg, err := df.config()
			if err != nil {
				return err
			}
			d, err := daemon.New(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			return d.Uninstall(cmd.Context(), purge)
		},
	}
	df.register(cmd)
	cmd.Flags().BoolVar(&purge, "purge", false, "also delete the state directory (images, checkpoints, ledger)")
	return cmd
}

func serveCmd() *cobra.Command {
	df := &daemonFlags{}
	cf := &clusterFlags{}
	gf := &gatewayFlags{}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the forkbox daemon (as root), or with --gateway the API in front of a cluster",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if gf.on {
				return gf.run(cmd.Context(), df, cf)
			}
			if df.e2b != "" && df.token == "" {
				return fmt.Errorf("--e2b needs --api-token (it is the E2B API key callers send): %w", errdefs.ErrInvalidArgument)
			}
			cfg, err := df.config()
			if err != nil {
				return err
			}
			log := cfg.Log
			ctx := cmd.Context()
			cfg.APIToken = df.token
			d, err := daemon.New(ctx, cfg)
			if err != nil {
				return err
			}
			defer d.Close()
			m := metrics.New(metrics.Options{Sandboxes: d.Store(), CgroupParent: cfg.CgroupParent,
				MaxSandboxSeries: df.metricsMax, Log: log, Preboot: func() metrics.PrebootCounts {
					s := d.PrebootStats()
					return metrics.PrebootCounts{Ready: s.Ready, Created: s.ReadyCreated, Pending: s.Pending,
						Hits: s.Hits, Misses: s.Misses}
				}, RunscStandby: func() metrics.StandbyCounts {
					s := d.RunscStandbyStats()
					return metrics.StandbyCounts{Ready: s.Ready, Pending: s.Pending, Hits: s.Hits, Misses: s.Misses}
				}})
			// The E2B endpoint listens before the API does: once the API
			// answers (what a caller, or a test, waits for), every listener
			// is up (TestE2BEndpointAbuse was refused once in CI when the
			// E2B one came second).
			var e2bSrv *e2b.Server
			if df.e2b != "" {
				if e2bSrv, err = e2b.New(d, e2b.Config{APIKey: df.token, DefaultTemplate: df.e2bTemplate, Log: log}); err == nil {
					_, err = e2bSrv.Listen(df.e2b)
				}
				if err != nil {
					return err
				}
			}
			srv, err := server.Listen(d, df.socket, df.tcp, df.token, log,
				server.Web{Metrics: m, MetricsAddr: df.metrics, UIAddr: df.ui})
			if err != nil {
				if e2bSrv != nil {
					e2bSrv.Shutdown(context.Background())
				}
				return err
			}
			ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
			defer stop()
			agentCtx, stopAgent := context.WithCancel(ctx)
			defer stopAgent()
			agent, err := cf.start(agentCtx, d, log)
			if err != nil {
				srv.Shutdown(context.Background())
				return err
			}
			var agentErr error
			select {
			case <-ctx.Done():
				log.Info("shutting down; sandboxes keep running and are found again on the next start")
				if agent != nil {
					agentErr = <-agent
				}
			case agentErr = <-agent: // the node agent stopped by itself: so does the node
				log.Error("node agent stopped", "err", agentErr)
				agentErr = fmt.Errorf("node agent: %w", agentErr)
			}
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if e2bSrv != nil {
				e2bSrv.Shutdown(sctx)
			}
			return errors.Join(agentErr, srv.Shutdown(sctx))
		},
	}
	df.register(cmd)
	cf.register(cmd)
	gf.register(cmd)
	f := cmd.Flags()
	f.StringVar(&df.metrics, "metrics", "", "also serve Prometheus metrics at /metrics on this address (token required when one is set; loopback only without)")
	f.StringVar(&df.ui, "ui", "", "serve the dashboard on this address (needs --api-token; open http://ADDR/?token=T)")
	f.StringVar(&df.cfg.PortsAddr, "ports", "", "serve preview URLs of sandbox ports on this address (http://<port>-<id>.localhost:PORT/, each with its sandbox's token; see `forkbox port`); with --gateway, the gateway's own (needs --ports-key), relayed to the nodes' --ports")
	f.StringVar(&df.cfg.PortsDomain, "ports-domain", "localhost", "domain of preview host names: <port>-<sandbox id>.<domain> (point a wildcard DNS name at the listener)")
	f.StringVar(&df.e2b, "e2b", "", "also serve an E2B-compatible endpoint (REST and envd) on this address (needs --api-token, the E2B API key): E2B_API_URL=E2B_SANDBOX_URL=http://ADDR")
	f.StringVar(&df.e2bTemplate, "e2b-default-template", "", "what E2B's default templateID \"base\" creates from: an environment, image or snapshot")
	f.IntVar(&df.metricsMax, "metrics-max-sandboxes", metrics.DefaultMaxSandboxSeries, "at most this many sandboxes get CPU and memory series (the oldest first)")
	f.BoolVar(&df.cfg.CgroupFavorDynMods, "cgroup-favordynmods", false, "switch the host's cgroup favordynmods option on at start: moving processes between cgroups stops waiting for RCU grace periods, forks and exits cost more (host-wide; its locking stays until reboot on Linux 6.18+; see README)")
	f.IntVar(&df.cfg.RunscStandby, "runsc-standby", 2, "keep this many runsc processes started ahead (about 5 MB each), so that gVisor's creates, restores and wakes skip runsc's own start (0 = none; needs forkbox's runsc build)")
	f.BoolVar(&df.cfg.PropagateSandboxMounts, "propagate-sandbox-mounts", false, "let each sandbox's rootfs and netns mounts propagate wherever the state and run directories' mounts do, as a Kubernetes node with Bidirectional volumes needs (deploy/node.yaml sets it); runsc's mount view then keeps the host's mounts as at start, even those the host unmounts later")
	f.BoolVar(&df.cfg.RunscHugePages, "runsc-huge-pages", true, "run runsc and its Sentry from a copy on a tmpfs of huge pages in the run directory (about 150 MB of memory), which starts each gVisor sandbox's processes faster where page faults are costly; false runs the installed binary")
	f.IntVar(&df.cfg.Preboot, "preboot", 2, "keep this many gVisor sandboxes booted ahead of demand (about 40 MB each), for creates and fork children that match their resources and egress (0 = none)")
	return cmd
}

func (df *daemonFlags) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&df.cfg.StateDir, "state-dir", envOr("FORKBOX_STATE_DIR", "/var/lib/forkbox"), "state directory")
	f.StringVar(&df.cfg.RunDir, "run-dir", envOr("FORKBOX_RUN_DIR", "/run/forkbox"), "runtime state directory")
	f.StringVar(&df.socket, "socket", envOr("FORKBOX_SOCKET", client.DefaultSocket), "unix socket of the API")
	f.StringVar(&df.tcp, "tcp", "", "also listen on this TCP address (needs --token)")
	f.StringVar(&df.token, "api-token", os.Getenv("FORKBOX_API_TOKEN"), "bearer token required on the TCP listener")
	f.StringVar(&df.disk, "default-disk", "10Gi", "disk limit of a sandbox that asks for none (0 = none)")
	f.StringVar(&df.copyMax, "max-copy-size", "1Gi", "largest tar stream one `forkbox cp` may move, either way")
	f.BoolVar(&df.cfg.BtrfsPreallocate, "btrfs-preallocate", false, "allocate the whole btrfs file when it is made, so sandboxes together cannot fill the state dir's filesystem")
	f.StringVar(&df.cfg.AgentPath, "agent", "", "forkbox-agent binary (default: next to this binary)")
	f.StringVar(&df.cfg.RuntimeBinary, "runsc", "", "runsc binary (default: from PATH)")
	f.StringVar(&df.cfg.CrunBinary, "crun", "", "crun binary (default: from PATH)")
	f.StringVar(&df.cfg.DefaultRuntime, "runtime", "gvisor", "default runtime: gvisor (untrusted code) or crun (trusted code, fastest)")
	f.StringVar(&df.cfg.Snapshotter, "snapshotter", "btrfs", "btrfs (O(1) forks) or copy (slow fallback)")
	f.StringVar(&df.memKey, "memory-image-key", "", "keep memory images (memory checkpoints, hibernated sandboxes) encrypted at rest under this key file: 64 random bytes, mode 0600 (head -c 64 /dev/urandom); needs a kernel with fscrypt and mkfs.ext4")
	f.StringVar(&df.memVault, "memory-vault-size", "", "size of the sparse file of the encrypted memory image vault (default 64Gi; with --memory-image-key)")
	f.StringVar(&df.btr, "btrfs-size", "", "size of the sparse btrfs file made when the state dir is not on btrfs (default 16Gi)")
	f.StringVar(&df.cfg.Subnet, "subnet", "", "sandbox subnet (default 10.88.0.0/16)")
	f.StringVar(&df.cfg.Bridge, "bridge", "", "host bridge of the sandbox network (default forkbox0)")
	f.StringVar(&df.cfg.NetTable, "net-table", "", "nftables table of the sandbox network (default forkbox)")
	f.StringVar(&df.cfg.VethPrefix, "veth-prefix", "", "prefix of host-side veth names, at most 5 bytes (default fbx)")
	f.StringVar(&df.cfg.CgroupParent, "cgroup-parent", "forkbox", "cgroup under which sandboxes get theirs")
	f.DurationVar(&df.cfg.CheckpointRetention, "checkpoint-retention", 0, "delete checkpoints of closed sandboxes once older than this (0 = keep)")
	f.DurationVar(&df.cfg.IdleHibernate, "idle-hibernate", 0, "hibernate gvisor sandboxes idle for this long; the next exec wakes them (0 = never)")
	f.DurationVar(&df.cfg.MaxLifetime, "max-lifetime", 0, "no sandbox lives longer than this from its start (or its last wake): longer timeouts are clamped (0 = no cap)")
	f.DurationVar(&df.cfg.IdleTimeout, "idle-timeout", 0, "expire (close, or hibernate per the sandbox's on_timeout) a sandbox with no exec or file activity for this long (0 = never)")
	f.DurationVar(&df.cfg.PtyStallTimeout, "pty-stall-timeout", daemon.DefaultPtyStallTimeout, "end a terminal session (exec -t) whose client has taken none of its output for this long")
	f.IntVar(&df.cfg.MaxSandboxes, "max-sandboxes", 100, "limit on live sandboxes")
	f.StringVar(&df.cfg.DNSUpstream, "dns-upstream", "", "resolver (ip:port) the sandboxes' DNS proxy forwards allowed names to (default: the first in /etc/resolv.conf)")
	f.StringVar(&df.level, "log-level", "info", "debug, info, warn or error")
}
