package main

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/forkbox/forkbox/client"
)

// timeoutCmd is `forkbox timeout SANDBOX DURATION`: E2B's setTimeout.
func timeoutCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "timeout SANDBOX DURATION",
		Short: "Set a sandbox's deadline to now + DURATION (0 = no timeout of its own) and print it",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := time.ParseDuration(args[1])
			if err != nil {
				return fmt.Errorf("duration %q: want e.g. 90s, 10m or 2h", args[1])
			}
			sb, err := g.client().Sandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if err := sb.SetTimeout(cmd.Context(), d); err != nil {
				return err
			}
			if g.json {
				return printJSON(withExpiry(sb.Info))
			}
			fmt.Printf("%s\texpires %s\n", sb.ID, expires(sb.Info.ExpiresAtUnixMs))
			return nil
		},
	}
}

// expires renders a deadline for people.
func expires(ms int64) string {
	if ms == 0 {
		return "never"
	}
	return time.UnixMilli(ms).UTC().Format(time.RFC3339)
}

// withExpiry is a sandbox's JSON with its deadline also as RFC 3339
// (expires_at; absent when it never expires).
func withExpiry(info *client.Info) any {
	b, err := json.Marshal(info)
	if err != nil {
		return info
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return info
	}
	if info.ExpiresAtUnixMs != 0 {
		m["expires_at"] = expires(info.ExpiresAtUnixMs)
	}
	return m
}
