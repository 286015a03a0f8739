package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/httpserve"
	"github.com/forkbox/forkbox/internal/mcpserver"
)

func mcpCmd(g *globals) *cobra.Command {
	var addr, token string
	cmd := &cobra.Command{
		Use:   "mcp [--http ADDR]",
		Short: "Serve the Model Context Protocol (tools: create, exec, fork, ...) over stdio, or streamable HTTP",
		Long: `mcp serves forkbox to MCP clients (agents, IDEs): tools to create sandboxes,
exec in them, read and write files, fork, checkpoint, list, restore and close
them, and each sandbox's ledger as the resource forkbox://sandboxes/{id}/ledger.
It talks to the daemon like the other commands (--host, --token).

By default it speaks MCP on stdin/stdout, for clients that start it as a
subprocess. With --http ADDR it serves streamable HTTP on ADDR instead, and
every request must carry "Authorization: Bearer <token>" (--api-token,
FORKBOX_API_TOKEN, else the --token of the daemon): on loopback too, since
any user of the host can reach a loopback port, and the server acts with
this command's access to the daemon.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s := mcpserver.New(g.client())
			if addr == "" {
				return serveStdio(cmd.Context(), s)
			}
			if token == "" {
				token = g.token
			}
			return serveMCPHTTP(cmd.Context(), s, addr, token)
		},
	}
	cmd.Flags().StringVar(&addr, "http", "", "serve streamable HTTP on this address (host:port) instead of stdio")
	cmd.Flags().StringVar(&token, "api-token", os.Getenv("FORKBOX_API_TOKEN"), "bearer token required of HTTP clients (default: --token)")
	return cmd
}

func serveStdio(ctx context.Context, s *mcp.Server) error {
	err := s.Run(ctx, &mcp.StdioTransport{})
	// The client closing stdin, or a signal, ends the session normally.
	if ctx.Err() != nil || errors.Is(err, mcp.ErrConnectionClosed) {
		return nil
	}
	return err
}

func serveMCPHTTP(ctx context.Context, s *mcp.Server, addr, token string) error {
	if token == "" {
		return fmt.Errorf("--http needs a token for its clients to send, since any user of the host can reach %s "+
			"(--api-token or FORKBOX_API_TOKEN, e.g. --api-token \"$(head -c 24 /dev/urandom | base64)\"): %w", addr, errdefs.ErrInvalidArgument)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen %s: %v: %w", addr, err, errdefs.ErrInvalidArgument)
	}
	srv := httpserve.New(mcpserver.HTTPHandler(s, token), false)
	slog.Info("MCP listening on streamable HTTP (token required)", "addr", "http://"+ln.Addr().String())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
		<-errc
		return nil
	}
}
