package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/tarcopy"
)

// hostCopyMax bounds what `cp` writes or extracts on the host side; the
// daemon's --max-copy-size is the bound that matters.
const hostCopyMax = 1 << 40

// remotePath splits "SANDBOX:PATH"; a local path (absolute, relative with
// "./", or with no colon) is not one.
func remotePath(arg string) (sandbox, p string, ok bool) {
	if strings.HasPrefix(arg, "/") || strings.HasPrefix(arg, ".") {
		return "", "", false
	}
	sb, p, ok := strings.Cut(arg, ":")
	if !ok || sb == "" || strings.Contains(sb, "/") {
		return "", "", false
	}
	return sb, p, true
}

func cpCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "cp SRC SANDBOX:PATH | cp SANDBOX:PATH DST",
		Short: "Copy files and directories into or out of a sandbox (tar-streamed, like docker cp)",
		Long: `Copy a file or directory into or out of a sandbox, with modes and mtimes.
If the destination is an existing directory (or ends with /), the source is
copied into it; otherwise it is copied as the destination. SRC or DST "-" is a
tar stream on stdin or stdout. Symlinks are copied as symlinks. Entries are
kept below the destination: a stream with ".." or absolute names, or one that
would write through a symlink, is refused. Setuid bits are dropped on the host.
A local path with a colon in its first element is written ./a:b.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			srcSB, srcPath, srcRemote := remotePath(args[0])
			dstSB, dstPath, dstRemote := remotePath(args[1])
			if srcRemote == dstRemote {
				return fmt.Errorf("cp: exactly one of SRC and DST must be SANDBOX:PATH: %w", errdefs.ErrInvalidArgument)
			}
			ctx := cmd.Context()
			c := g.client()
			if dstRemote {
				sb, err := c.Sandbox(ctx, dstSB)
				if err != nil {
					return err
				}
				return copyIn(cmd, sb, args[0], dstPath)
			}
			sb, err := c.Sandbox(ctx, srcSB)
			if err != nil {
				return err
			}
			return copyOut(cmd, sb, srcPath, args[1])
		},
	}
}

func copyIn(cmd *cobra.Command, sb *client.Sandbox, src, dst string) error {
	ctx := cmd.Context()
	if !path.IsAbs(dst) {
		return fmt.Errorf("cp: sandbox path %q: want an absolute path: %w", dst, errdefs.ErrInvalidArgument)
	}
	if src == "-" {
		_, err := sb.CopyTo(ctx, dst, os.Stdin)
		return err
	}
	if _, err := os.Lstat(src); err != nil {
		return fmt.Errorf("cp: %v: %w", err, errdefs.ErrNotFound)
	}
	// Into an existing directory, or as the destination itself.
	dir, name := dst, filepath.Base(src)
	if !strings.HasSuffix(dst, "/") {
		// A directory too large to list (ResourceExhausted) is one all
		// the same: the agent says "not a directory" first.
		if _, err := sb.ListFiles(ctx, dst); err != nil && !errdefs.IsResourceExhausted(err) {
			if !errdefs.IsNotFound(err) && !errdefs.IsInvalidArgument(err) {
				return err
			}
			dir, name = path.Dir(dst), path.Base(dst)
		}
	}
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := tarcopy.Write(ctx, pw, src, name, hostCopyMax)
		pw.CloseWithError(err)
		done <- err
	}()
	res, err := sb.CopyTo(ctx, dir, pr)
	pr.CloseWithError(errors.New("copy ended"))
	if werr := <-done; werr != nil && err == nil {
		err = werr
	}
	if err != nil {
		return err
	}
	if !quiet(cmd) {
		fmt.Fprintf(os.Stderr, "copied %d entries (%s) to %s:%s\n", res.Entries, size(res.Bytes), sb.ID, path.Join(dir, name))
	}
	return nil
}

func copyOut(cmd *cobra.Command, sb *client.Sandbox, src, dst string) error {
	ctx := cmd.Context()
	if dst == "-" {
		return sb.CopyFrom(ctx, src, os.Stdout)
	}
	dir, top := dst, ""
	if fi, err := os.Stat(dst); err != nil || !fi.IsDir() {
		if strings.HasSuffix(dst, "/") {
			return fmt.Errorf("cp: %s is not a directory: %w", dst, errdefs.ErrNotFound)
		}
		dir, top = filepath.Dir(dst), filepath.Base(dst)
	}
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	var res tarcopy.Result
	go func() {
		var err error
		res, err = tarcopy.Extract(ctx, pr, dir, tarcopy.ExtractOptions{MaxBytes: hostCopyMax, TopName: top})
		if err == nil {
			_, err = io.Copy(io.Discard, pr) // the archive's padding
		}
		pr.CloseWithError(err)
		done <- err
	}()
	err := sb.CopyFrom(ctx, src, pw)
	pw.CloseWithError(err)
	if xerr := <-done; xerr != nil {
		err = xerr // the extraction's own error, not the broken pipe it left
	}
	if err != nil {
		return err
	}
	if !quiet(cmd) {
		fmt.Fprintf(os.Stderr, "copied %d entries (%s) from %s:%s\n", res.Entries, size(res.Bytes), sb.ID, src)
	}
	return nil
}

// quiet reports whether --json is set (the copy then prints nothing).
func quiet(cmd *cobra.Command) bool {
	v, _ := cmd.Flags().GetBool("json")
	return v
}
