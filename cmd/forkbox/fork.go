package main

import (
	"context"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
)

func checkpointCmds(g *globals) []*cobra.Command {
	var tag string
	var memory bool
	ck := &cobra.Command{
		Use:   "checkpoint SANDBOX [--tag TAG]",
		Short: "Capture a sandbox as an immutable snapshot",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := g.client().Sandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			var c *client.Checkpoint
			if memory {
				c, err = sb.CheckpointMemory(cmd.Context(), tag)
			} else {
				c, err = sb.Checkpoint(cmd.Context(), tag)
			}
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(c)
			}
			fmt.Printf("%s\t%s\tfrozen %.1f ms\n", c.Id, c.Tag, c.CaptureMs)
			return nil
		},
	}
	ck.Flags().StringVar(&tag, "tag", "", "tag stored in the ledger")
	ck.Flags().BoolVar(&memory, "live", false, "capture memory and processes too (gvisor)")

	list := &cobra.Command{
		Use:   "checkpoints SANDBOX",
		Short: "List a sandbox's checkpoints",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := g.client().Sandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			cks, err := sb.ListCheckpoints(cmd.Context())
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cks)
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "ID\tTAG\tKIND\tSIZE\tCREATED")
			for _, c := range cks {
				fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\n", c.Id, c.Tag, c.Kind, c.Size, time.UnixMilli(c.CreatedAtUnixMs).Format(time.DateTime))
			}
			return w.Flush()
		},
	}

	var o client.ForkOptions
	var env, creds []string
	var cpu, mem, disk string
	fork := &cobra.Command{
		Use:   "fork SANDBOX [-n N] [--tag TAG] [--env K=V]...",
		Short: "Checkpoint a sandbox and start children from it; it keeps running",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if o.Overrides.Env, err = parseKV("--env", env); err != nil {
				return err
			}
			if o.Credentials, err = parseKV("--credential", creds); err != nil {
				return err
			}
			o.Overrides.Resources = client.Resources{CPU: cpu, Memory: mem, Disk: disk}
			sb, err := g.client().Sandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if !g.json {
				return forkStreamed(cmd.Context(), sb, o)
			}
			res, err := sb.Fork(cmd.Context(), o)
			if err != nil {
				return err
			}
			type child struct {
				Sandbox    *client.Info `json:"sandbox,omitempty"`
				Error      string       `json:"error,omitempty"`
				ErrorClass string       `json:"error_class,omitempty"`
				StartMS    float64      `json:"start_ms"`
			}
			out := struct {
				Checkpoint *client.Checkpoint `json:"checkpoint"`
				Captured   string             `json:"captured"`
				CaptureMS  float64            `json:"capture_ms"`
				FlushMS    float64            `json:"flush_ms"`
				TotalMS    float64            `json:"total_ms"`
				Children   []child            `json:"children"`
			}{res.Checkpoint, res.Captured, res.CaptureMS, res.FlushMS, res.TotalMS, nil}
			failed := 0
			for _, c := range res.Children {
				ch := child{StartMS: c.StartMS}
				if c.Sandbox != nil {
					ch.Sandbox = c.Sandbox.Info
				}
				if c.Err != nil {
					failed++
					ch.Error, ch.ErrorClass = c.Err.Error(), errdefs.ClassName(c.Err)
				}
				out.Children = append(out.Children, ch)
			}
			if err := printJSON(out); err != nil {
				return err
			}
			if failed > 0 {
				return exitError{1}
			}
			return nil
		},
	}
	f := fork.Flags()
	f.IntVarP(&o.Count, "count", "n", 1, "number of children (1-100); each is printed as soon as it is ready")
	f.StringVar(&o.Tag, "tag", "", "tag of the checkpoint")
	f.StringArrayVar(&env, "env", nil, "KEY=VALUE override, repeatable")
	f.StringArrayVar(&creds, "credential", nil, "NAME=VALUE for a per-fork credential, repeatable")
	f.StringVar(&cpu, "cpu", "", "CPU override")
	f.StringVar(&mem, "memory", "", "memory override")
	f.StringVar(&disk, "disk", "", "disk limit override, e.g. 2Gi; 0 = no limit (default: the parent's)")
	f.StringVar(&o.Overrides.Name, "name", "", "name of the child (count 1)")
	f.StringVar(&o.Overrides.Egress, "egress", "", "egress override: none, all or allow (with the lists, replaces the parent's policy)")
	f.StringSliceVar(&o.Overrides.EgressAllow, "egress-allow", nil, "egress allowlist override (CIDRs and names, comma-separated)")
	f.StringSliceVar(&o.Overrides.EgressDeny, "egress-deny", nil, "egress denylist override")
	f.StringVar(&o.FromCheckpoint, "from-checkpoint", "", "fork from this existing checkpoint")
	f.BoolVar(&o.BestEffort, "best-effort", false, "start as many children as there are slots for")
	f.BoolVar(&o.Memory, "live", false, "fork memory and processes too (gvisor): children continue the source's processes")
	f.DurationVar(&o.Overrides.Timeout, "timeout", 0, "timeout of the children from their start, e.g. 30m (default: the parent's)")
	f.StringVar(&o.Overrides.OnTimeout, "on-timeout", "", "what the children's expiry does: close or hibernate (default: the parent's)")

	var rname string
	var ro client.Overrides
	var rcreds []string
	restore := &cobra.Command{
		Use:   "restore CHECKPOINT [--name NAME]",
		Short: "Start a new sandbox from a checkpoint (clean exec history)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			creds, err := parseKV("--credential", rcreds)
			if err != nil {
				return err
			}
			sb, err := g.client().RestoreSnapshot(cmd.Context(), args[0], client.Overrides{Name: rname, Timeout: ro.Timeout, OnTimeout: ro.OnTimeout}, creds)
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(sb.Info)
			}
			fmt.Printf("%s\t%s\n", sb.ID, sb.Info.Name)
			return nil
		},
	}
	restore.Flags().StringVar(&rname, "name", "", "name of the new sandbox")
	restore.Flags().DurationVar(&ro.Timeout, "timeout", 0, "timeout of the new sandbox from its start (default: the checkpoint's)")
	restore.Flags().StringVar(&ro.OnTimeout, "on-timeout", "", "what its expiry does: close or hibernate (default: the checkpoint's)")
	restore.Flags().StringArrayVar(&rcreds, "credential", nil, "NAME=VALUE for a per-fork credential of the checkpoint's sandbox, repeatable")

	resume := &cobra.Command{
		Use:   "resume SESSION",
		Short: "Bring back a closed or crashed session: restore its last checkpoint, replay the execs after it",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			res, err := g.client().Resume(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(res)
			}
			fmt.Printf("%s\t%s\tfrom %s\n", res.Sandbox.ID, res.Sandbox.Info.Name, res.Checkpoint.Id)
			for _, r := range res.Replayed {
				what := r.Shell
				if what == "" {
					what = fmt.Sprint(r.Argv)
				}
				switch {
				case r.Skipped:
					fmt.Printf("  skipped  %s (%s)\n", what, r.SkipReason)
				case r.Error != "":
					fmt.Printf("  error    %s: %s\n", what, r.Error)
				default:
					fmt.Printf("  exit %-3d %s\n", r.ExitCode, what)
				}
			}
			return nil
		},
	}
	pause := &cobra.Command{
		Use: "pause SANDBOX", Short: "Freeze a sandbox in place", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := g.client().Sandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return sb.Pause(cmd.Context())
		},
	}
	unpause := &cobra.Command{
		Use: "unpause SANDBOX", Short: "Thaw a paused sandbox", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := g.client().Sandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return sb.Unpause(cmd.Context())
		},
	}
	hibernate := &cobra.Command{
		Use: "hibernate SANDBOX", Short: "Save a sandbox's memory and processes to disk and release them (gvisor)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := g.client().Sandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return sb.Hibernate(cmd.Context())
		},
	}
	wake := &cobra.Command{
		Use: "wake SANDBOX", Short: "Restore a hibernated sandbox (an exec also wakes it)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := g.client().Sandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return sb.Wake(cmd.Context())
		},
	}
	return []*cobra.Command{ck, list, fork, restore, resume, pause, unpause, hibernate, wake}
}

func credsCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "creds", Short: "Manage a sandbox's credentials (values are never shown)"}
	var o client.CredentialOptions
	var fromEnv string
	set := &cobra.Command{
		Use:   "set SANDBOX NAME [--env VAR] [--file NAME] [--per-fork]",
		Short: "Set a credential; the value is read from stdin (or --from-env)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var value string
			if fromEnv != "" {
				value = os.Getenv(fromEnv)
			} else {
				b, err := readAllLimited(os.Stdin)
				if err != nil {
					return err
				}
				value = string(b)
			}
			sb, err := g.client().Sandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return sb.Credentials().Set(cmd.Context(), args[1], value, o)
		},
	}
	set.Flags().StringVar(&o.Env, "env", "", "inject as this env variable (default: the name)")
	set.Flags().StringVar(&o.File, "file", "", "inject as /run/secrets/FILE")
	set.Flags().BoolVar(&o.PerFork, "per-fork", false, "do not copy to forks (each fork must supply it)")
	set.Flags().StringVar(&fromEnv, "from-env", "", "read the value from this env variable of the CLI")
	ls := &cobra.Command{
		Use: "ls SANDBOX", Short: "List credentials", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := g.client().Sandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			list, err := sb.Credentials().List(cmd.Context())
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(list)
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "NAME\tENV\tFILE\tPER-FORK")
			for _, c := range list {
				fmt.Fprintf(w, "%s\t%s\t%s\t%v\n", c.Name, c.Env, c.File, c.PerFork)
			}
			return w.Flush()
		},
	}
	rm := &cobra.Command{
		Use: "rm SANDBOX NAME", Short: "Remove a credential", Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := g.client().Sandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return sb.Credentials().Delete(cmd.Context(), args[1])
		},
	}
	cmd.AddCommand(set, ls, rm)
	return cmd
}

// forkStreamed forks and prints the capture, then each child as soon as it
// is ready (or has failed), then the total.
func forkStreamed(ctx context.Context, sb *client.Sandbox, o client.ForkOptions) error {
	fs, err := sb.ForkStream(ctx, o)
	if err != nil {
		return err
	}
	defer fs.Close()
	fmt.Printf("checkpoint %s (%s): frozen %.1f ms after %.0f ms of writeback; starting %d\n",
		fs.Checkpoint.Id, fs.Captured, fs.CaptureMS, fs.FlushMS, fs.Count)
	failed, seen := 0, 0
	for i, c := range fs.Children() {
		seen++
		if c.Err != nil {
			failed++
			fmt.Printf("%d\terror\t%s (%s)\n", i, c.Err, errdefs.ClassName(c.Err))
			continue
		}
		fmt.Printf("%d\t%s\t%s\tready in %.0f ms\n", i, c.Sandbox.ID, c.Sandbox.Info.Name, c.StartMS)
	}
	if err := fs.Err(); err != nil {
		return err
	}
	fmt.Printf("%d started, %d failed; total %.0f ms\n", seen-failed, failed, fs.TotalMS)
	if failed > 0 || seen < fs.Count {
		return exitError{1}
	}
	return nil
}
