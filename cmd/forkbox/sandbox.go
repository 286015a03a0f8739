package main

import (
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
)

func parseKV(flag string, kvs []string) (map[string]string, error) {
	env := map[string]string{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%s %q: want KEY=VALUE: %w", flag, kv, errdefs.ErrInvalidArgument)
		}
		env[k] = v
	}
	return env, nil
}

func createCmd(g *globals) *cobra.Command {
	var o client.CreateOptions
	var env []string
	var environment string
	cmd := &cobra.Command{
		Use:   "create (--image IMAGE | --environment NAME) [--name NAME]",
		Short: "Create a sandbox and wait until it is ready",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if o.Env, err = parseKV("--env", env); err != nil {
				return err
			}
			if (o.Image == "") == (environment == "") {
				return fmt.Errorf("create needs --image or --environment, not both: %w", errdefs.ErrInvalidArgument)
			}
			start := time.Now()
			if environment != "" {
				return createFromEnvironment(cmd, g, environment, o, start)
			}
			sb, err := g.client().CreateSandbox(cmd.Context(), o)
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(sb.Info)
			}
			fmt.Printf("%s\t%s\tready in %s\n", sb.ID, sb.Info.Name, time.Since(start).Round(time.Millisecond))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Image, "image", "", "image name or digest")
	f.StringVar(&environment, "environment", "", "a built environment: take a sandbox from its warm pool, else fork its snapshot (flags below override what it gives)")
	f.StringVar(&o.Name, "name", "", "sandbox name (default: its ID)")
	f.StringVar(&o.Resources.CPU, "cpu", "", "CPU cores, e.g. 1 or 0.5 (default 1)")
	f.StringVar(&o.Resources.Memory, "memory", "", "memory, e.g. 512Mi or 2Gi (default 512Mi)")
	f.Int64Var(&o.Resources.Pids, "pids", 0, "process limit (default 1024)")
	f.StringVar(&o.Resources.Disk, "disk", "", "most the sandbox may write to disk, e.g. 2Gi; 0 = no limit (default: the daemon's --default-disk)")
	f.StringArrayVar(&env, "env", nil, "KEY=VALUE, repeatable")
	f.StringVar(&o.Cwd, "cwd", "", "working directory of execs")
	f.StringVar(&o.Egress, "egress", "", "outbound network: none, all, or allow (default none; allow with --egress-allow)")
	f.StringSliceVar(&o.EgressAllow, "egress-allow", nil, "comma-separated CIDRs and DNS names (api.example.com, *.example.com) the sandbox may reach")
	f.StringSliceVar(&o.EgressDeny, "egress-deny", nil, "comma-separated CIDRs (and names, with --egress-allow) it may not; wins over --egress-allow")
	f.StringVar(&o.Runtime, "runtime", "", "runtime: gvisor or crun (default: the daemon's)")
	f.DurationVar(&o.Timeout, "timeout", 0, "close the sandbox this long after it starts, e.g. 30s or 2h; forks inherit it (default: none)")
	f.StringVar(&o.OnTimeout, "on-timeout", "", "what expiry does: close (default) or hibernate (gvisor; the next exec wakes it)")
	return cmd
}

// createFromEnvironment hands over a sandbox of a built environment. Only
// the flags given override what the environment gives; with none, a warm
// pool sandbox is taken when one is ready.
func createFromEnvironment(cmd *cobra.Command, g *globals, name string, o client.CreateOptions, start time.Time) error {
	f := cmd.Flags()
	if f.Changed("runtime") {
		return fmt.Errorf("--runtime: a sandbox of an environment runs on the environment's runtime: %w", errdefs.ErrInvalidArgument)
	}
	var ov client.Overrides
	ov.Name, ov.Resources, ov.Cwd = o.Name, o.Resources, o.Cwd
	if len(o.Env) > 0 {
		ov.Env = o.Env
	}
	if f.Changed("egress") {
		ov.Egress = o.Egress
	}
	sb, err := g.client().SandboxFromEnvironment(cmd.Context(), name, ov)
	if err != nil {
		return err
	}
	if g.json {
		return printJSON(map[string]any{"sandbox": sb.Info, "from_pool": sb.FromPool, "handover_ms": sb.HandoverMS})
	}
	from := "forked from the snapshot"
	if sb.FromPool {
		from = "from the warm pool"
	}
	fmt.Printf("%s\t%s\tready in %s (%s)\n", sb.ID, sb.Info.Name, time.Since(start).Round(time.Millisecond), from)
	return nil
}

func execCmd(g *globals) *cobra.Command {
	var o client.ExecOptions
	var env []string
	var stdin, background, tty bool
	cmd := &cobra.Command{
		Use:   "exec SANDBOX [flags] -- CMD [ARG...]",
		Short: "Run a command in a sandbox; exits with the command's exit code",
		Long: "Run a command in a sandbox; exits with the command's exit code.\n\n" +
			"With -t the command runs on a terminal in the sandbox (forkbox exec -it SANDBOX -- sh):\n" +
			"the local terminal is put in raw mode, its size follows the window, and with -i\n" +
			"what you type (Ctrl-C too) goes to the remote terminal.",
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if o.Env, err = parseKV("--env", env); err != nil {
				return err
			}
			o.Argv = args[1:]
			if tty {
				if background {
					return fmt.Errorf("--tty and --detach do not go together: %w", errdefs.ErrInvalidArgument)
				}
				sb, err := g.client().Sandbox(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				res, err := runPty(cmd.Context(), sb, o, stdin)
				if err != nil {
					return err
				}
				if res.OOMKilled {
					fmt.Fprintln(os.Stderr, "forkbox: the command was killed: the sandbox ran out of memory")
				} else if res.TimedOut {
					fmt.Fprintln(os.Stderr, "forkbox: the command timed out and was killed")
				}
				if res.ExitCode != 0 {
					return exitError{res.ExitCode}
				}
				return nil
			}
			if stdin {
				if o.Stdin, err = readAllLimited(os.Stdin); err != nil {
					return err
				}
			}
			sb, err := g.client().Sandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if background {
				pid, err := sb.Start(cmd.Context(), o)
				if err != nil {
					return err
				}
				if g.json {
					return printJSON(map[string]int{"pid": pid})
				}
				fmt.Println(pid)
				return nil
			}
			o.Stdout, o.Stderr = os.Stdout, os.Stderr
			res, err := sb.Exec(cmd.Context(), o)
			if err != nil {
				return err
			}
			if g.json {
				printJSON(res)
			} else if res.OOMKilled {
				fmt.Fprintln(os.Stderr, "forkbox: the command was killed: the sandbox ran out of memory")
			} else if res.TimedOut {
				fmt.Fprintln(os.Stderr, "forkbox: the command timed out and was killed")
			}
			if res.ExitCode != 0 {
				return exitError{res.ExitCode}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&env, "env", nil, "KEY=VALUE, repeatable")
	f.StringVar(&o.Cwd, "cwd", "", "working directory")
	f.DurationVar(&o.Timeout, "timeout", 0, "kill the command after this long")
	f.BoolVarP(&stdin, "interactive", "i", false, "send this command's stdin to the command")
	f.BoolVarP(&background, "detach", "d", false, "run in the background and print the pid")
	f.BoolVarP(&tty, "tty", "t", false, "run the command on a terminal (with -i: an interactive one)")
	return cmd
}

func readAllLimited(f *os.File) ([]byte, error) {
	const max = 16 << 20
	buf := make([]byte, 0, 4096)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := f.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if len(buf) > max {
			return nil, fmt.Errorf("stdin is larger than %d bytes: %w", max, errdefs.ErrResourceExhausted)
		}
		if err != nil {
			return buf, nil
		}
	}
}

func lsCmd(g *globals) *cobra.Command {
	var all bool
	var pageSize int
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List sandboxes (every page of the list, oldest first)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			list, err := g.client().ListAll(cmd.Context(), client.ListOptions{All: all, PageSize: pageSize})
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(list)
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "ID\tNAME\tSTATE\tIMAGE\tRUNTIME\tIP\tCREATED\tEXPIRES")
			for _, s := range list {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Id, s.Name, s.State, s.Image, s.Runtime, s.Ip,
					time.UnixMilli(s.CreatedAtUnixMs).Format(time.DateTime), expires(s.ExpiresAtUnixMs))
			}
			return w.Flush()
		},
	}
	cmd.Flags().BoolVarP(&all, "all", "a", false, "include closed sandboxes")
	cmd.Flags().IntVar(&pageSize, "page-size", 1000, "sandboxes per API page (1 to 1000; ls follows every page)")
	return cmd
}

func inspectCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "inspect SANDBOX",
		Short: "Show a sandbox (JSON)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := g.client().Sandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printJSON(withExpiry(sb.Info))
		},
	}
}

func logsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "logs SANDBOX",
		Short: "Show a sandbox's ledger",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			evs, err := g.client().Events(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(evs)
			}
			for _, e := range evs {
				fmt.Printf("%s  %-22s %v\n", e.Time.Format("15:04:05.000"), e.Type, e.Data)
			}
			return nil
		},
	}
}

func rmCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "rm SANDBOX...",
		Short: "Close sandboxes; nothing of them is left on the host",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			// Every one is tried: a failure is reported and the others
			// still closed; the last failure is the command's error.
			c := g.client()
			var last error
			for i, id := range args {
				sb, err := c.Sandbox(cmd.Context(), id)
				if err == nil {
					err = sb.Close(cmd.Context())
				}
				if err != nil {
					if last != nil {
						fmt.Fprintf(os.Stderr, "forkbox: %v (%s)\n", last, errdefs.ClassName(last))
					}
					last = fmt.Errorf("rm %s: %w", args[i], err)
					continue
				}
				if !g.json {
					fmt.Println(sb.ID)
				}
			}
			return last
		},
	}
}
