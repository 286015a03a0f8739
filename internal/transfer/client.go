package transfer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/snapshot"
	"github.com/forkbox/forkbox/internal/snapshot/btrfs"
)

// Limits bound what a node accepts from a peer.
type Limits struct {
	// MaxBytes bounds everything one pull receives (default 64 GiB; less
	// when this node has less room, see Local.room).
	MaxBytes int64
	// Timeout bounds one pull (default 30m).
	Timeout time.Duration
	// Idle bounds how long a pull waits for its sender's next bytes
	// (default 1m): a sender that stalls is given up long before Timeout.
	Idle time.Duration
	// MaxFiles bounds a memory image's files (default 256).
	MaxFiles int
	// MaxRecordBytes bounds the ledger record (default and most 512 KiB:
	// it travels base64-encoded in the header frame).
	MaxRecordBytes int
}

func (l Limits) withDefaults() Limits {
	if l.MaxBytes == 0 {
		l.MaxBytes = 64 << 30
	}
	if l.Timeout == 0 {
		l.Timeout = 30 * time.Minute
	}
	if l.Idle == 0 {
		l.Idle = time.Minute
	}
	if l.MaxFiles == 0 {
		l.MaxFiles = 256
	}
	if l.MaxRecordBytes == 0 || l.MaxRecordBytes > 512<<10 {
		l.MaxRecordBytes = 512 << 10
	}
	return l
}

// Peer is a node to pull from.
type Peer struct {
	Node string
	// Endpoint is its transfer listener (host:port).
	Endpoint string
	// CertPEM is the certificate it published: the only one accepted.
	CertPEM []byte
}

// Result is what one pull did.
type Result struct {
	Checkpoint string
	// Parent is the ancestor the send was incremental from ("" = full).
	Parent string
	// SendBytes is the size of the btrfs send stream, FileBytes of the
	// memory image's files, WireBytes of everything read (frames).
	SendBytes, FileBytes, WireBytes int64
	Duration                        time.Duration
}

// Client pulls checkpoints into its node.
type Client struct {
	Identity *Identity
	Local    *Local
	Limits   Limits
	Log      *slog.Logger
}

// Pull asks peer for checkpoint req.Checkpoint and commits it here. It
// fails with AlreadyExists when this node holds it already. On any
// failure nothing of it is left here.
func (c *Client) Pull(ctx context.Context, peer Peer, req Request) (Result, error) {
	start := time.Now()
	lim := c.Limits.withDefaults()
	res := Result{Checkpoint: req.Checkpoint}
	if err := validID(req.Checkpoint); err != nil {
		return res, err
	}
	if len(req.Have) > maxHave {
		req.Have = req.Have[:maxHave]
	}
	if c.Local.Holds(ctx, req.Checkpoint) {
		return res, fmt.Errorf("checkpoint %s is here already: %w", req.Checkpoint, errdefs.ErrAlreadyExists)
	}
	pinned, err := CertDER(peer.CertPEM)
	if err != nil {
		return res, fmt.Errorf("node %s: %w", peer.Node, err)
	}
	budget := lim.MaxBytes
	if room, err := c.Local.room(); err != nil {
		return res, err
	} else if room < budget {
		budget = room
	}
	if budget <= 0 {
		return res, fmt.Errorf("pull %s: this node has no room for it (less free space than its reserve): %w", req.Checkpoint, errdefs.ErrResourceExhausted)
	}
	ctx, cancel := context.WithTimeout(ctx, lim.Timeout)
	defer cancel()
	ctx, watch, stop := withStall(ctx, lim.Idle)
	defer stop()
	body, _ := json.Marshal(req)
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+peer.Endpoint+"/v1/pull", bytes.NewReader(body))
	if err != nil {
		return res, fmt.Errorf("node %s endpoint %q: %v: %w", peer.Node, peer.Endpoint, err, errdefs.ErrInvalidArgument)
	}
	tr := &http.Transport{TLSClientConfig: clientTLS(c.Identity, pinned), DisableKeepAlives: true,
		ResponseHeaderTimeout: time.Minute, TLSHandshakeTimeout: 30 * time.Second}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(hreq)
	if err != nil {
		return res, fmt.Errorf("pull %s from node %s: %w", req.Checkpoint, peer.Node,
			pullBound(ctx, lim, fmt.Errorf("%v: %w", err, errdefs.ErrUnavailable)))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return res, fmt.Errorf("pull %s from node %s: %s: %s: %w", req.Checkpoint, peer.Node, resp.Status, bytes.TrimSpace(msg), errdefs.ErrUnavailable)
	}
	fr := &frameReader{r: watch(resp.Body), budget: budget}
	p := &pull{c: c, lim: lim, fr: fr, req: req, peer: peer, res: &res}
	err = p.run(ctx)
	err = pullBound(ctx, lim, err)
	res.WireBytes = fr.total
	res.Duration = time.Since(start)
	if err != nil {
		return res, fmt.Errorf("pull %s from node %s: %w", req.Checkpoint, peer.Node, err)
	}
	c.log().InfoContext(ctx, "checkpoint received", slog.String("checkpoint", req.Checkpoint), slog.String("peer", peer.Node),
		slog.String("parent", res.Parent), slog.Int64("send_bytes", res.SendBytes), slog.Int64("file_bytes", res.FileBytes),
		slog.Duration("took", res.Duration))
	return res, nil
}

// pullBound is err, or the pull's bound it ran into: its sender stalled
// (Limits.Idle), or it took longer than Limits.Timeout.
func pullBound(ctx context.Context, lim Limits, err error) error {
	switch {
	case err == nil:
		return nil
	case stalled(ctx) != nil:
		return stalled(ctx)
	case errors.Is(ctx.Err(), context.DeadlineExceeded) && !errdefs.IsDeadlineExceeded(err):
		return fmt.Errorf("the pull took longer than %v: %v: %w", lim.Timeout, err, errdefs.ErrDeadlineExceeded)
	}
	return err
}

func (c *Client) log() *slog.Logger {
	if c.Log == nil {
		return slog.Default()
	}
	return c.Log
}

// pull is one pull's receiving state.
type pull struct {
	c    *Client
	lim  Limits
	fr   *frameReader
	req  Request
	peer Peer
	res  *Result
	hd   header
	// pending is a frame read past the send stream.
	pendTyp byte
	pend    []byte
}

func (p *pull) run(ctx context.Context) (err error) {
	typ, b, err := p.fr.next()
	if err != nil {
		return err
	}
	if typ != frameHeader {
		return fmt.Errorf("the stream does not start with a header: %w", errdefs.ErrInvalidArgument)
	}
	if err := p.fr.json(b, typ, &p.hd); err != nil {
		return err
	}
	want, err := p.checkHeader(ctx)
	if err != nil {
		return err
	}
	p.res.Parent = p.hd.Parent
	local := p.c.Local
	memDir := ""
	defer func() {
		if memDir != "" && err != nil {
			_ = os.RemoveAll(memDir)
		}
	}()
	err = local.Snaps.Receive(ctx, p.hd.Checkpoint, func(ctx context.Context, dir string) error {
		if err := p.receive(ctx, dir, want); err != nil {
			return err
		}
		var err error
		memDir, err = p.files(ctx)
		return err
	}, snapshot.WithLabels(map[string]string{"received-from": p.peer.Node}))
	if err != nil {
		return err
	}
	// The snapshot is committed; the memory image goes into place, then
	// the ledger records the checkpoint. Undone on failure (and found by
	// reconcile after a crash: neither has a ledger record).
	final := ""
	if memDir != "" {
		final = filepath.Join(local.MemRoot, p.hd.Checkpoint)
		if err = os.Rename(memDir, final); err != nil {
			err = fmt.Errorf("memory image into place: %v: %w", err, errdefs.ErrInternal)
		} else {
			memDir = final
		}
	}
	if err == nil {
		err = local.Ledger.Commit(ctx, p.hd.Checkpoint, p.hd.Record, final, p.req.ImageDigest)
	}
	if err != nil {
		if rerr := local.Snaps.Remove(context.WithoutCancel(ctx), p.hd.Checkpoint); rerr != nil {
			err = errors.Join(err, rerr)
		}
	}
	return err
}

// checkHeader checks the header against the request and this node.
func (p *pull) checkHeader(ctx context.Context) (expect, error) {
	hd := p.hd
	if hd.Checkpoint != p.req.Checkpoint {
		return expect{}, refuse("it carries checkpoint %q, not %q", hd.Checkpoint, p.req.Checkpoint)
	}
	if p.req.UUID != "" && hd.UUID != p.req.UUID {
		return expect{}, refuse("it carries subvolume %s, not %s", hd.UUID, p.req.UUID)
	}
	if hd.UUID == "" {
		return expect{}, refuse("no subvolume UUID")
	}
	if len(hd.Record) > p.lim.MaxRecordBytes {
		return expect{}, fmt.Errorf("a ledger record of %d bytes, limit %d: %w", len(hd.Record), p.lim.MaxRecordBytes, errdefs.ErrResourceExhausted)
	}
	want := expect{Name: hd.Checkpoint, UUID: hd.UUID}
	if hd.Parent != "" {
		if !slices.Contains(p.req.Have, hd.Parent) {
			return expect{}, refuse("incremental from %q, which was not offered", hd.Parent)
		}
		h, err := p.c.Local.held(ctx, hd.Parent)
		if err != nil {
			return expect{}, fmt.Errorf("the agreed base %s: %w", hd.Parent, err)
		}
		if h.info.Origin() != hd.ParentUUID {
			return expect{}, refuse("the base %s is subvolume %s here, %s there", hd.Parent, h.info.Origin(), hd.ParentUUID)
		}
		want.ParentUUID, want.base, want.baseDir = hd.ParentUUID, h.info.UUID, h.path
	}
	// btrfs receive finds a base and clone sources by UUID: a second
	// subvolume here with the same one (a sender may name any UUID for
	// its own checkpoint) could stand in for another's.
	if other, err := p.c.Local.uuidHeld(hd.UUID); err != nil || other != "" {
		if err == nil {
			err = refuse("subvolume UUID %s is already checkpoint %s's on this node", hd.UUID, other)
		}
		return expect{}, err
	}
	return want, nil
}

// receive runs btrfs receive in dir on the checked send stream.
func (p *pull) receive(ctx context.Context, dir string, want expect) (err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cmd := exec.CommandContext(ctx, "btrfs", "receive", "-q", "-e", "-C", dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stderr bytes.Buffer
	cmd.Stdout = io.Discard
	cmd.Stderr = &limitedBuffer{b: &stderr, max: 4096}
	in, err := cmd.StdinPipe()
	if err != nil {
		return fmt.Errorf("btrfs receive: %v: %w", err, errdefs.ErrInternal)
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("btrfs receive: %v: %w", err, errdefs.ErrUnavailable)
	}
	waited := false
	defer func() {
		if !waited {
			cancel()
			in.Close()
			_ = cmd.Wait()
		}
	}()
	check := newStreamCheck(want, in)
	for {
		typ, b, err := p.fr.next()
		if err != nil {
			return err
		}
		if typ != frameSend {
			p.pendTyp, p.pend = typ, slices.Clone(b)
			break
		}
		if _, err := check.Write(b); err != nil {
			return err
		}
	}
	if err := check.Close(); err != nil {
		return err
	}
	p.res.SendBytes = check.n
	in.Close()
	waited = true
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("btrfs receive: %v: %s: %w", err, bytes.TrimSpace(stderr.Bytes()), errdefs.ErrInvalidArgument)
	}
	sub := filepath.Join(dir, want.Name)
	info, err := btrfs.Subvolume(sub)
	if err != nil {
		return fmt.Errorf("the received subvolume: %w", err)
	}
	if !info.ReadOnly || info.ReceivedUUID != want.UUID {
		return fmt.Errorf("the received subvolume is read-only=%v with received UUID %q, want read-only with %s: %w",
			info.ReadOnly, info.ReceivedUUID, want.UUID, errdefs.ErrInvalidArgument)
	}
	if want.base != "" && info.ParentUUID != want.base {
		return fmt.Errorf("the received subvolume is a snapshot of %q, not of the agreed base %s: %w", info.ParentUUID, want.base, errdefs.ErrInvalidArgument)
	}
	return nil
}

// next returns the frame read past the send stream first.
func (p *pull) next() (byte, []byte, error) {
	if p.pend != nil {
		t, b := p.pendTyp, p.pend
		p.pend = nil
		return t, b, nil
	}
	return p.fr.next()
}

// files receives the memory image's files into a staging dir (returned)
// and the trailer, and checks the counts.
func (p *pull) files(ctx context.Context) (dir string, err error) {
	if p.hd.Memory {
		if dir, err = p.c.Local.stagingDir(); err != nil {
			return "", err
		}
		defer func() {
			if err != nil {
				_ = os.RemoveAll(dir)
				dir = ""
			}
		}()
	}
	var got trailer
	for {
		if err := ctx.Err(); err != nil {
			return dir, fmt.Errorf("receive the memory image: %v: %w", err, errdefs.ErrDeadlineExceeded)
		}
		typ, b, err := p.next()
		if err != nil {
			return dir, err
		}
		switch typ {
		case frameTrailer:
			var t trailer
			if err := p.fr.json(b, typ, &t); err != nil {
				return dir, err
			}
			got.SendBytes = p.res.SendBytes
			if t != got {
				return dir, fmt.Errorf("the sender counted %+v, this node received %+v: %w", t, got, errdefs.ErrUnavailable)
			}
			if p.hd.Memory && got.Files == 0 {
				return dir, refuse("a memory checkpoint without its image")
			}
			p.res.FileBytes = got.FileBytes
			return dir, nil
		case frameFile:
			if !p.hd.Memory {
				return dir, refuse("a file for a checkpoint without memory")
			}
			var fh fileHeader
			if err := p.fr.json(b, typ, &fh); err != nil {
				return dir, err
			}
			if got.Files++; got.Files > p.lim.MaxFiles {
				return dir, fmt.Errorf("more than %d memory image files: %w", p.lim.MaxFiles, errdefs.ErrResourceExhausted)
			}
			if err := relPath([]byte(fh.Name)); err != nil || fh.Name == "" || fh.Size < 0 {
				return dir, refuse("memory image file %q of %d bytes", fh.Name, fh.Size)
			}
			if err := p.file(dir, fh); err != nil {
				return dir, err
			}
			got.FileBytes += fh.Size
		default:
			return dir, refuse("frame %q out of place", typ)
		}
	}
}

// file writes one memory image file of fh.Size bytes from data frames.
func (p *pull) file(dir string, fh fileHeader) error {
	dst := filepath.Join(dir, filepath.FromSlash(fh.Name))
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return fmt.Errorf("memory image file %s: %v: %w", fh.Name, err, errdefs.ErrInternal)
	}
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return refuse("memory image file %q: %v", fh.Name, err)
	}
	defer f.Close()
	for left := fh.Size; left > 0; {
		typ, b, err := p.fr.next()
		if err != nil {
			return err
		}
		if typ != frameData || int64(len(b)) > left {
			return refuse("memory image file %q: more or other than its %d bytes", fh.Name, fh.Size)
		}
		if _, err := f.Write(b); err != nil {
			return fmt.Errorf("memory image file %s: %v: %w", fh.Name, err, errdefs.ErrInternal)
		}
		left -= int64(len(b))
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("memory image file %s: %v: %w", fh.Name, err, errdefs.ErrInternal)
	}
	return nil
}
