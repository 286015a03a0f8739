// Command forkbox is the forkbox daemon (`forkbox serve`) and its CLI.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
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
	root.AddCommand(serveCmd(), uninstallCmd(), imageCmd(g), createCmd(g), execCmd(g), lsCmd(g), inspectCmd(g), logsCmd(g), rmCmd(g), credsCmd(g), envCmd(g), statsCmd(g), cpCmd(g), timeoutCmd(g), egressCmd(g))
	root.AddCommand(checkpointCmds(g)...)
	root.AddCommand(mcpCmd(g), portCmd(g), controllerCmd())

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
	if daemonUnreachable(err, g.host) {
		msg += "; is the daemon running? start it (as root) with `forkbox serve`, or point --host at it"
	}
	if g.json {
		printJSON(map[string]string{"error": msg, "class": errdefs.ClassName(err)})
	} else {
		fmt.Fprintf(os.Stderr, "forkbox: %s (%s)\n", msg, errdefs.ClassName(err))
	}
	os.Exit(1)
}

// daemonUnreachable reports whether err is the client's own failure to dial
// the daemon at host (the --host value; "" is the default socket), as
// opposed to an error the daemon returned. An Unavailable error from the
// daemon, such as a sandbox's agent not answering, may mention a dial too,
// but not one to the daemon's own address: the transport's error starts
// with "dial unix <socket>:" or "dial tcp <addr>:<port>:" (or "dial tcp:
// lookup <host>" when the name does not resolve).
func daemonUnreachable(err error, host string) bool {
	if !errdefs.IsUnavailable(err) {
		return false
	}
	msg := err.Error()
	if host == "" || strings.HasPrefix(host, "unix://") {
		sock := strings.TrimPrefix(host, "unix://")
		if sock == "" {
			sock = client.DefaultSocket
		}
		return strings.HasPrefix(msg, "dial unix "+sock+":")
	}
	u, perr := url.Parse(host)
	if perr != nil || u.Host == "" {
		return false
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"https": "443"}[u.Scheme]
		if port == "" {
			port = "80"
		}
	}
	if strings.HasPrefix(msg, "dial tcp: lookup "+u.Hostname()) {
		return true
	}
	first, _, _ := strings.Cut(msg, ": ")
	return strings.HasPrefix(first, "dial tcp ") && strings.HasSuffix(first, ":"+port)
}
