package main

import (
	"fmt"
	"io"
	"os"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/forkbox/forkbox/client"
)

// statsCmd is `forkbox stats`: a table of live sandboxes' usage that
// refreshes (like `docker stats`) until Ctrl-C, or one reading with
// --no-stream or --json.
func statsCmd(g *globals) *cobra.Command {
	var noStream bool
	var interval time.Duration
	cmd := &cobra.Command{
		Use:   "stats [SANDBOX]",
		Short: "Live CPU, memory, disk, network and process counts of sandboxes",
		Long: `Live CPU, memory, disk, network and process counts of one sandbox, or of every
live one. The table refreshes every --interval until Ctrl-C; --no-stream prints
it once, --json prints one reading as JSON. CPU % is the CPU time used over the
last interval (100% = one core). Under gVisor, CPU, memory and PIDS are the
runtime's on the host (the sentry runs the sandbox's processes; PIDS counts its
threads); under crun they are the sandbox's processes' own.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := ""
			if len(args) == 1 {
				name = args[0]
			}
			c := g.client()
			ctx := cmd.Context()
			read := func() ([]*client.Metrics, error) { return c.SandboxMetrics(ctx, name) }
			list, err := read()
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(list)
			}
			if noStream {
				return printStats(os.Stdout, list, nil)
			}
			if interval <= 0 {
				interval = time.Second
			}
			tick := time.NewTicker(interval)
			defer tick.Stop()
			var prev []*client.Metrics
			tty := term.IsTerminal(int(os.Stdout.Fd()))
			for {
				if tty {
					fmt.Print("\033[H\033[2J") // home, clear
				} else if prev != nil {
					fmt.Println()
				}
				if err := printStats(os.Stdout, list, prev); err != nil {
					return err
				}
				select {
				case <-ctx.Done():
					return nil
				case <-tick.C:
				}
				prev = list
				if list, err = read(); err != nil {
					if ctx.Err() != nil {
						return nil
					}
					return err
				}
			}
		},
	}
	cmd.Flags().BoolVar(&noStream, "no-stream", false, "print one reading and exit")
	cmd.Flags().DurationVar(&interval, "interval", time.Second, "refresh interval")
	return cmd
}

// printStats writes the table; CPU % comes from prev (the last reading),
// "-" on the first.
func printStats(out io.Writer, list, prev []*client.Metrics) error {
	before := map[string]*client.Metrics{}
	for _, m := range prev {
		before[m.SandboxId] = m
	}
	sort.Slice(list, func(i, j int) bool { return list[i].Name < list[j].Name })
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "SANDBOX\tNAME\tRUNTIME\tCPU %\tCPU TIME\tMEM USAGE / LIMIT\tDISK / LIMIT\tNET RX / TX\tPIDS")
	for _, m := range list {
		cpu := "-"
		if p, ok := before[m.SandboxId]; ok {
			if dt := float64(m.TimeUnixMs-p.TimeUnixMs) / 1000; dt > 0 {
				cpu = fmt.Sprintf("%.1f%%", 100*(m.CpuSeconds-p.CpuSeconds)/dt)
			}
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%.2fs\t%s / %s\t%s / %s\t%s / %s\t%s\n", m.SandboxId, m.Name, m.Runtime, cpu, m.CpuSeconds,
			size(m.MemoryBytes), limit(m.MemoryLimitBytes), size(m.DiskBytes), limit(m.DiskLimitBytes),
			size(m.NetRxBytes), size(m.NetTxBytes), pids(m))
	}
	return w.Flush()
}

func pids(m *client.Metrics) string {
	if m.PidsLimit > 0 {
		return fmt.Sprintf("%d / %d", m.Pids, m.PidsLimit)
	}
	return fmt.Sprint(m.Pids)
}

func limit(n int64) string {
	if n <= 0 {
		return "-"
	}
	return size(n)
}

// size prints bytes with a binary suffix.
func size(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%dB", n)
	}
	f, suffix := float64(n), ""
	for _, s := range []string{"KiB", "MiB", "GiB", "TiB"} {
		f /= unit
		suffix = s
		if f < unit {
			break
		}
	}
	return fmt.Sprintf("%.1f%s", f, suffix)
}
