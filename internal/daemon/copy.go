package daemon

import (
	"context"
	"io"
	"time"

	"github.com/forkbox/forkbox/internal/agent"
	"github.com/forkbox/forkbox/internal/store"
)

// Copies in and out of a sandbox (`forkbox cp`) are tar streams through
// its agent, which extracts them below the target directory without
// following symlinks (package tarcopy). Both directions are bounded by
// Config.MaxCopyBytes: the daemon counts what passes, and so does the
// agent. A copy in is recorded in the ledger (path and sizes), and not
// replayed by Resume: its content is not kept.

// DefaultMaxCopy is `forkbox serve --max-copy-size`'s default.
const DefaultMaxCopy = 1 << 30

// copyTimeout bounds one copy in time: a caller or a sandbox that stalls
// its stream cannot hold the sandbox's agent connection for ever.
const copyTimeout = 30 * time.Minute

// CopyResult is what a copy moved.
type CopyResult = agent.CopyResult

// CopyTo extracts the tar stream r into the directory dir of a sandbox.
func (d *Daemon) CopyTo(ctx context.Context, idOrName, dir string, r io.Reader) (CopyResult, error) {
	sb, done, err := d.running(ctx, idOrName)
	if err != nil {
		return CopyResult{}, err
	}
	defer done()
	cctx, cancel := context.WithTimeout(ctx, copyTimeout)
	defer cancel()
	res, err := d.agent(sb).Untar(cctx, dir, r, d.cfg.MaxCopyBytes)
	data := map[string]any{"path": dir, "bytes": res.Bytes, "entries": res.Entries}
	if err != nil {
		data["error"] = err.Error()
	}
	if _, lerr := d.store.AppendEvent(ctx, sb.ID, store.EventFilesCopied, data); err == nil {
		err = lerr
	}
	return res, err
}

// CopyFrom writes a file or directory of a sandbox to w as a tar stream.
func (d *Daemon) CopyFrom(ctx context.Context, idOrName, path string, w io.Writer) (CopyResult, error) {
	sb, done, err := d.running(ctx, idOrName)
	if err != nil {
		return CopyResult{}, err
	}
	defer done()
	ctx, cancel := context.WithTimeout(ctx, copyTimeout)
	defer cancel()
	return d.agent(sb).Tar(ctx, path, w, d.cfg.MaxCopyBytes)
}
