// Command forkbox is the forkbox daemon (`forkbox serve`) and its CLI.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
)

// exitError carries an exit code out of a command (exec exits with the
// command's own code).
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit %d", e.code) }

type globals struct {
	host  string
	token string
	json  bool
}

func (g *globals) client() *client.Client {
	c := &client.Client{Token: g.token}
	switch {
	case g.host == "":
	case len(g.host) > 7 && g.host[:7] == "unix://":
		c.Socket = g.host[7:]
	default:
		c.URL = g.host
	}
	return c
}

// printJSON writes v as indented JSON.
func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func main() {
	g := &globals{}
	root := &cobra.Command{
		Use:           "forkbox",
		Short:         "Sandboxes for AI agents: prepare once, fork cheap copy-on-write children",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVar(&g.host, "host", os.Getenv("FORKBOX_HOST"), "daemon address: unix:///path or http://host:port (default unix:///run/forkbox/forkbox.sock)")
	root.PersistentFlags().StringVar(&g.token, "token", os.Getenv("FORKBOX_TOKEN"), "bearer token for a TCP daemon")
	root.PersistentFlags().BoolVar(&g.json, "json", false, "print JSON")
	root.AddCommand(serveCmd(), uninstallCmd(), imageCmd(g), createCmd(g), execCmd(g), lsCmd(g), inspectCmd(g), logsCmd(g), rmCmd(g), credsCmd(g), envCmd(g))
	root.AddCommand(checkpointCmds(g)...)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := root.ExecuteContext(ctx)
	stop()
	if err == nil {
		return
	}
	var ee exitError
	if errors.As(err, &ee) {
		os.Exit(ee.code)
	}
	msg := err.Error()
	if errdefs.IsUnavailable(err) && strings.Contains(msg, "dial ") {
		msg += "; is the daemon running? start it (as root) with `forkbox serve`, or point --host at it"
	}
	if g.json {
		printJSON(map[string]string{"error": msg, "class": errdefs.ClassName(err)})
	} else {
		fmt.Fprintf(os.Stderr, "forkbox: %s (%s)\n", msg, errdefs.ClassName(err))
	}
	os.Exit(1)
}
