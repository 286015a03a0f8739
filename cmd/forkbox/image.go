package main

import (
	"fmt"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/forkbox/forkbox/client"
)

// progress returns a progress callback that draws a bar on a terminal and
// prints nothing otherwise.
func progress(g *globals, what string) (func(*client.Progress), func()) {
	if g.json || !term.IsTerminal(int(os.Stderr.Fd())) {
		return nil, func() {}
	}
	bar := progressbar.NewOptions64(-1, progressbar.OptionSetWriter(os.Stderr), progressbar.OptionSetDescription(what),
		progressbar.OptionShowBytes(true), progressbar.OptionClearOnFinish())
	return func(p *client.Progress) {
			if p.Total > 0 {
				bar.ChangeMax64(p.Total)
			}
			bar.Describe(what + " " + p.Phase)
			bar.Set64(p.Done)
		}, func() {
			bar.Finish()
		}
}

func printImage(g *globals, img *client.Image) error {
	if g.json {
		return printJSON(img)
	}
	fmt.Printf("%s\t%s\n", img.Name, img.Digest)
	return nil
}

func imageCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "image", Short: "Manage images"}
	var name string
	var upload bool
	imp := &cobra.Command{
		Use:   "import FILE",
		Short: "Import an oci-archive or docker-archive tarball",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			path, err := filepath.Abs(args[0])
			if err != nil {
				return err
			}
			var archive []byte
			if upload {
				// This machine's file, sent in the request: what a remote
				// daemon or a gateway (which imports on every node) needs.
				if archive, err = os.ReadFile(path); err != nil {
					return err
				}
			}
			p, done := progress(g, "import")
			var img *client.Image
			if upload {
				img, err = g.client().ImportImageArchive(cmd.Context(), archive, name, p)
			} else {
				img, err = g.client().ImportImage(cmd.Context(), path, name, p)
			}
			done()
			if err != nil {
				return err
			}
			return printImage(g, img)
		},
	}
	imp.Flags().StringVar(&name, "name", "", "image name (default: the name in the archive)")
	imp.Flags().BoolVar(&upload, "upload", false, "send this machine's file (at most 32 MiB) instead of naming a path on the daemon's host: over TCP, and to a gateway")
	var insecure bool
	pull := &cobra.Command{
		Use:   "pull REF",
		Short: "Pull an image from a registry",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, done := progress(g, "pull")
			img, err := g.client().PullImage(cmd.Context(), args[0], insecure, p)
			done()
			if err != nil {
				return err
			}
			return printImage(g, img)
		},
	}
	pull.Flags().BoolVar(&insecure, "insecure", false, "allow a plain-HTTP registry")
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List images",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			list, err := g.client().ListImages(cmd.Context())
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(list)
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "NAME\tDIGEST\tSIZE\tLAYERS\tCREATED")
			for _, i := range list {
				fmt.Fprintf(w, "%s\t%.19s\t%d\t%d\t%s\n", i.Name, i.Digest, i.Size, i.Layers, time.UnixMilli(i.CreatedAtUnixMs).Format(time.DateTime))
			}
			return w.Flush()
		},
	}
	rm := &cobra.Command{
		Use:   "rm IMAGE...",
		Short: "Remove images no live sandbox uses",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, n := range args {
				if err := g.client().RemoveImage(cmd.Context(), n); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.AddCommand(imp, pull, ls, rm)
	return cmd
}
