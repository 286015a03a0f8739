package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/forkbox/forkbox/client"
)

// egressCmd changes a live sandbox's egress policy.
func egressCmd(g *globals) *cobra.Command {
	var o client.EgressOptions
	cmd := &cobra.Command{
		Use:   "egress SANDBOX [none|all] [--allow LIST] [--deny LIST]",
		Short: "Change a running sandbox's egress: none, all, or an allowlist (--allow) minus a denylist (--deny)",
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 2 {
				o.Egress = args[1]
			}
			if o.Egress == "" && len(o.Allow) == 0 {
				return fmt.Errorf("give none, all, or --allow LIST")
			}
			sb, err := g.client().Sandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if err := sb.SetEgress(cmd.Context(), o); err != nil {
				return err
			}
			if g.json {
				return printJSON(sb.Info)
			}
			fmt.Printf("%s\tegress %s", sb.ID, sb.Info.Egress)
			if len(sb.Info.EgressAllow) > 0 {
				fmt.Printf("\tallow %s", strings.Join(sb.Info.EgressAllow, ","))
			}
			if len(sb.Info.EgressDeny) > 0 {
				fmt.Printf("\tdeny %s", strings.Join(sb.Info.EgressDeny, ","))
			}
			fmt.Println()
			return nil
		},
	}
	cmd.Flags().StringSliceVar(&o.Allow, "allow", nil, "comma-separated CIDRs and DNS names the sandbox may reach")
	cmd.Flags().StringSliceVar(&o.Deny, "deny", nil, "comma-separated CIDRs (and names, with --allow) it may not; wins over --allow")
	return cmd
}
