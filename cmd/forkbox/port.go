package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
)

func portCmd(g *globals) *cobra.Command {
	var forward string
	cmd := &cobra.Command{
		Use:   "port SANDBOX PORT [--forward LOCALADDR]",
		Short: "Print the preview URL of a sandbox port, or forward a local TCP port to it",
		Long: `Print the preview URL of a sandbox port (the daemon runs with --ports ADDR).
The URL carries the sandbox's port token: it reaches every port of this
sandbox (but the agent's) and nothing else, and does not expire. --json prints
{url, token, host, host_url, path_url}; path_url is for non-browser clients
that cannot set Host: it takes no cookie, so send the token (?forkbox_token=
or the X-Forkbox-Port-Token header) with every request.

With --forward LOCALADDR (e.g. 127.0.0.1:9000), listen there and tunnel each
connection to the port through the preview listener (HTTP CONNECT), until
interrupted.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			port, err := strconv.Atoi(args[1])
			if err != nil {
				return fmt.Errorf("port %q is not a number: %w", args[1], errdefs.ErrInvalidArgument)
			}
			ctx := cmd.Context()
			sb, err := g.client().Sandbox(ctx, args[0])
			if err != nil {
				return err
			}
			u, err := sb.PortURL(ctx, port)
			if err != nil {
				return err
			}
			if forward == "" {
				if g.json {
					return printJSON(u)
				}
				fmt.Println(u.URL)
				return nil
			}
			ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
			defer stop()
			return forwardPort(ctx, u, forward, sb.ID, port)
		},
	}
	cmd.Flags().StringVar(&forward, "forward", "", "listen on this local address and tunnel each connection to the port")
	return cmd
}

// forwardPort serves local connections on addr, each tunnelled to the
// sandbox port, until ctx ends; then it closes them and waits.
func forwardPort(ctx context.Context, u *client.PortURL, addr, id string, port int) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", addr, errdefs.ErrInvalidArgument)
	}
	fmt.Fprintf(os.Stderr, "forwarding %s to port %d of %s (Ctrl-C to stop)\n", l.Addr(), port, id)
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		local, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer local.Close()
			remote, err := u.Dial(ctx)
			if err != nil {
				fmt.Fprintf(os.Stderr, "forward %s: %v\n", local.RemoteAddr(), err)
				return
			}
			defer remote.Close()
			closeBoth := context.AfterFunc(ctx, func() { local.Close(); remote.Close() })
			defer closeBoth()
			done := make(chan struct{})
			go func() {
				io.Copy(remote, local)
				if c, ok := remote.(*net.TCPConn); ok {
					c.CloseWrite()
				}
				close(done)
			}()
			io.Copy(local, remote)
			local.Close()
			remote.Close()
			<-done
		}()
	}
}
