package main

import (
	"encoding/json"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
)

// envFile is the JSON form of an environment definition for `env build`:
//
//	{"name": "py", "image": "IMAGE", "resources": {"cpu": "1", "memory": "1Gi"},
//	 "env": {"K": "V"}, "setup": ["shell command", {"path": "/f", "content": "..."}],
//	 "max_age": "24h", "pool_size": 2, "runtime": "gvisor",
//	 "start": {"run": "httpd -f -p 8080", "ready_port": 8080, "ready_command": "...", "ready_timeout": "30s"}}
//
// "start" may also be just the command string.
type envFile struct {
	Name      string            `json:"name"`
	Image     string            `json:"image"`
	Resources client.Resources  `json:"resources"`
	Env       map[string]string `json:"env"`
	Cwd       string            `json:"cwd"`
	Runtime   string            `json:"runtime"`
	Egress    string            `json:"egress"`
	Setup     []json.RawMessage `json:"setup"`
	MaxAge    string            `json:"max_age"`
	PoolSize  int               `json:"pool_size"`
	Start     json.RawMessage   `json:"start"`
}

// startFile is the "start" of an environment file.
type startFile struct {
	Run          string `json:"run"`
	ReadyPort    int32  `json:"ready_port"`
	ReadyCommand string `json:"ready_command"`
	ReadyTimeout string `json:"ready_timeout"`
}

func parseStart(raw json.RawMessage) (*client.StartCommand, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var f startFile
	if json.Unmarshal(raw, &f.Run) != nil {
		if err := json.Unmarshal(raw, &f); err != nil || f.Run == "" {
			return nil, fmt.Errorf("start: want a command string or {\"run\", \"ready_port\", \"ready_command\", \"ready_timeout\"}: %w", errdefs.ErrInvalidArgument)
		}
	}
	s := &client.StartCommand{Run: f.Run, ReadyPort: f.ReadyPort, ReadyCommand: f.ReadyCommand}
	if f.ReadyTimeout != "" {
		d, err := time.ParseDuration(f.ReadyTimeout)
		if err != nil {
			return nil, fmt.Errorf("start: ready_timeout %q: %v: %w", f.ReadyTimeout, err, errdefs.ErrInvalidArgument)
		}
		s.ReadyTimeoutMs = d.Milliseconds()
	}
	return s, nil
}

func loadEnvFile(path string) (string, client.EnvironmentOptions, error) {
	var o client.EnvironmentOptions
	b, err := os.ReadFile(path)
	if err != nil {
		return "", o, fmt.Errorf("environment file: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	var f envFile
	if err := json.Unmarshal(b, &f); err != nil {
		return "", o, fmt.Errorf("environment file %s: %v: %w", path, err, errdefs.ErrInvalidArgument)
	}
	o = client.EnvironmentOptions{Image: f.Image, Resources: f.Resources, Env: f.Env, Cwd: f.Cwd, Runtime: f.Runtime,
		Egress: f.Egress, PoolSize: f.PoolSize}
	if o.Start, err = parseStart(f.Start); err != nil {
		return "", o, err
	}
	if f.MaxAge != "" {
		if o.MaxAge, err = time.ParseDuration(f.MaxAge); err != nil {
			return "", o, fmt.Errorf("max_age %q: %v: %w", f.MaxAge, err, errdefs.ErrInvalidArgument)
		}
	}
	for i, raw := range f.Setup {
		var cmd string
		if json.Unmarshal(raw, &cmd) == nil {
			o.Setup = append(o.Setup, client.Run(cmd))
			continue
		}
		var w struct {
			Path    string `json:"path"`
			Content string `json:"content"`
			Mode    uint32 `json:"mode"`
		}
		if err := json.Unmarshal(raw, &w); err != nil || w.Path == "" {
			return "", o, fmt.Errorf("setup step %d: want a command string or {\"path\", \"content\"}: %w", i+1, errdefs.ErrInvalidArgument)
		}
		o.Setup = append(o.Setup, client.WriteFile(w.Path, []byte(w.Content), w.Mode))
	}
	return f.Name, o, nil
}

func envCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "env", Short: "Environments: build once, fork per sandbox"}
	var file string
	build := &cobra.Command{
		Use:   "build -f ENV.json",
		Short: "Build an environment (or find it built), with progress per step",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			name, o, err := loadEnvFile(file)
			if err != nil {
				return err
			}
			tty := !g.json && term.IsTerminal(int(os.Stderr.Fd()))
			start := time.Now()
			info, err := g.client().Environment(name, o).Build(cmd.Context(), func(p *client.BuildProgress) {
				switch {
				case g.json:
				case p.Phase == "output":
					if tty {
						os.Stderr.Write(p.Output)
					}
				case p.Phase == "step":
					fmt.Fprintf(os.Stderr, "[%d/%d] %s\n", p.Step, p.Steps, p.Message)
				case p.Phase == "step_done" && p.ExitCode != 0:
					fmt.Fprintf(os.Stderr, "[%d/%d] exited %d\n", p.Step, p.Steps, p.ExitCode)
				case p.Message != "":
					fmt.Fprintf(os.Stderr, "%s: %s\n", p.Phase, p.Message)
				}
			})
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(info)
			}
			fmt.Printf("%s\t%s\t%s\t%s\n", info.Definition.Name, info.State, info.Checkpoint, time.Since(start).Round(time.Millisecond))
			return nil
		},
	}
	build.Flags().StringVarP(&file, "file", "f", "", "environment definition (JSON)")
	build.MarkFlagRequired("file")

	ls := &cobra.Command{
		Use: "ls", Short: "List environments", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			list, err := g.client().ListEnvironments(cmd.Context())
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(list)
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "NAME\tSTATE\tSTEPS\tSNAPSHOT\tBUILT\tPOOL")
			for _, e := range list {
				built := "-"
				if e.BuiltAtUnixMs > 0 {
					built = time.UnixMilli(e.BuiltAtUnixMs).Format(time.DateTime)
				}
				fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%d/%d\n", e.Definition.Name, e.State, len(e.Definition.Steps), e.Checkpoint,
					built, e.PoolReady, e.Definition.PoolSize)
			}
			return w.Flush()
		},
	}
	inspect := &cobra.Command{
		Use: "inspect NAME", Short: "Show an environment (JSON)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			e, err := g.client().GetEnvironment(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printJSON(e)
		},
	}
	rm := &cobra.Command{
		Use: "rm NAME", Short: "Delete an environment, its pool and snapshots", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.client().DeleteEnvironment(cmd.Context(), args[0])
		},
	}
	cmd.AddCommand(build, ls, inspect, rm)
	return cmd
}
