package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/runtime/runsc"
	"github.com/forkbox/forkbox/internal/runtime/spec"
	"github.com/forkbox/forkbox/internal/snapshot/btrfs"
	"github.com/forkbox/forkbox/internal/store"
	"github.com/forkbox/forkbox/internal/transfer"
)

// Checkpoints shipped between nodes (cluster mode, package transfer): a
// received checkpoint keeps its ID, its snapshot is a read-only received
// subvolume in the store, its memory image sits where the daemon's own
// do, and its ledger record names the source sandbox of the node that
// took it (which does not exist here: children inherit its config, not
// its credentials). A crash half-way leaves a snapshot or an image with
// no record, which reconcile removes.

// TransferLocal returns this daemon's side of checkpoint transfers. It
// needs the btrfs snapshotter.
func (d *Daemon) TransferLocal() (*transfer.Local, error) {
	bs, ok := d.snaps.(*btrfs.Snapshotter)
	if !ok {
		return nil, fmt.Errorf("checkpoint transfer needs the btrfs snapshotter: %w", errdefs.ErrFailedPrecondition)
	}
	return &transfer.Local{Snaps: bs, MemRoot: d.memImageDir(""), Ledger: transferLedger{d}, Log: d.log,
		Images: transfer.ImageStore{Store: d.images, Checkpoint: d.checkpointImageRef}}, nil
}

// checkpointImageRef is the image reference and manifest digest that
// checkpoint id's children mount: what a node pulling it must hold.
func (d *Daemon) checkpointImageRef(ctx context.Context, id string) (string, string, error) {
	ck, err := d.store.GetCheckpoint(ctx, id)
	if err != nil {
		return "", "", err
	}
	return ck.Image, ck.ImageDigest, nil
}

// CheckpointUUID returns the btrfs identity of checkpoint id's snapshot
// (its received UUID if it was received): what a transfer of it must
// carry. "" where the snapshotter is not btrfs.
func (d *Daemon) CheckpointUUID(id string) (string, error) {
	bs, ok := d.snaps.(*btrfs.Snapshotter)
	if !ok {
		return "", nil
	}
	in, err := btrfs.Subvolume(bs.CommittedPath(id))
	if err != nil {
		return "", err
	}
	return in.Origin(), nil
}

// transferLedger is the daemon's transfer.Ledger.
type transferLedger struct{ d *Daemon }

// transferRecord is what a checkpoint's record carries to another node.
type transferRecord struct {
	Checkpoint store.Checkpoint `json:"checkpoint"`
	// Bundle is the source's bundle directory on the sending node, which
	// the memory image's spec names.
	Bundle string `json:"bundle"`
}

func (l transferLedger) Record(ctx context.Context, id string) ([]byte, error) {
	ck, err := l.d.store.GetCheckpoint(ctx, id)
	if err != nil {
		return nil, err
	}
	return json.Marshal(transferRecord{Checkpoint: *ck, Bundle: l.d.bundleDir(ck.SandboxID)})
}

func (l transferLedger) Commit(ctx context.Context, id string, rec []byte, memDir, imageDigest string) error {
	var r transferRecord
	if err := json.Unmarshal(rec, &r); err != nil {
		return fmt.Errorf("received record of %s: %v: %w", id, err, errdefs.ErrInvalidArgument)
	}
	ck := &r.Checkpoint
	switch {
	case ck.ID != id:
		return fmt.Errorf("received record is of %q, not %q: %w", ck.ID, id, errdefs.ErrInvalidArgument)
	case ck.Kind != KindFilesystem && ck.Kind != KindMemory:
		return fmt.Errorf("received checkpoint %s of kind %q: %w", id, ck.Kind, errdefs.ErrInvalidArgument)
	case (ck.Kind == KindMemory) != (memDir != ""):
		return fmt.Errorf("received checkpoint %s is %s with memory image %q: %w", id, ck.Kind, memDir, errdefs.ErrInvalidArgument)
	case !validID(ck.SandboxID) || !filepath.IsAbs(r.Bundle) && memDir != "":
		return fmt.Errorf("received checkpoint %s names source %q, bundle %q: %w", id, ck.SandboxID, r.Bundle, errdefs.ErrInvalidArgument)
	case imageDigest == "" || ck.ImageDigest != imageDigest:
		// The image the pull fetched, not one the sender names: an image
		// only this node holds would reach the sender through its own
		// checkpoint's children.
		return fmt.Errorf("received checkpoint %s names image %q (%q), not the %q ensured for it: %w", id, ck.Image, ck.ImageDigest, imageDigest, errdefs.ErrInvalidArgument)
	}
	if _, ok := l.d.runtimes[ck.Runtime]; !ok {
		return fmt.Errorf("received checkpoint %s is of runtime %q, which this node lacks: %w", id, ck.Runtime, errdefs.ErrFailedPrecondition)
	}
	// The source is another node's sandbox: one of this node's named so
	// would have its bundle's paths, and its agent token, taken for the
	// checkpoint's.
	if _, err := l.d.store.GetSandbox(ctx, ck.SandboxID); !errdefs.IsNotFound(err) {
		if err == nil {
			err = fmt.Errorf("received checkpoint %s names source %s, a sandbox of this node: %w", id, ck.SandboxID, errdefs.ErrInvalidArgument)
		}
		return err
	}
	if memDir != "" {
		if err := l.d.adoptMemImage(memDir, l.d.bundleDir(ck.SandboxID)); err != nil {
			return err
		}
	}
	ck.Size = -1
	return l.d.store.AddReceivedCheckpoint(ctx, ck)
}

func validID(id string) bool {
	return id != "" && len(id) <= 200 && !strings.ContainsAny(id, "/\\\x00") && id != "." && id != ".."
}

// foreignAnnotations are the annotations a received memory image's specs
// may hold: those the daemon sets.
var foreignAnnotations = []string{runsc.AnnotationContainerType, runsc.AnnotationSandboxID, runsc.AnnotationContainerName,
	runsc.AnnotationAppMemoryLimit, runsc.AnnotationCPULimit}

// maxForeignSpec bounds a received memory image's spec files.
const maxForeignSpec = 1 << 20

// adoptMemImage makes a received memory image's specs name this node's
// paths, and refuses a spec that asks for more than the daemon's specs
// give a sandbox (spec.CheckForeign): the specs come from another node.
// Its bind mounts are made again, not filtered: each must be one the
// daemon makes (the identity files, the agent, the root's own /tmp), and
// gets this node's source and options (read-only but /tmp). A bind the
// sender chose could make a host file writable from inside the sandbox:
// its own config.json, whose hooks a later restore runs as root.
func (d *Daemon) adoptMemImage(dir, to string) error {
	for _, name := range []string{spec.ConfigName, podSpecFile} {
		p := filepath.Join(dir, name)
		b, err := readSmall(p, maxForeignSpec)
		if os.IsNotExist(err) && name == podSpecFile {
			continue
		}
		var s specs.Spec
		if err == nil {
			err = json.Unmarshal(b, &s)
		}
		if err == nil {
			err = spec.CheckForeign(&s, foreignAnnotations)
		}
		if err == nil {
			root := filepath.Join(to, "rootfs")
			if name == podSpecFile {
				root = filepath.Join(to, "pod", "rootfs")
			}
			err = d.ownMounts(&s, root, to)
		}
		if err != nil {
			return fmt.Errorf("received memory image: %s: %v: %w", name, err, errdefs.ErrInvalidArgument)
		}
		// Which pod it belongs to is this node's to say (a restore marks
		// it: runsc.AsPod, AsTenant): named by the sender, it could join
		// another sandbox's pod here.
		for _, k := range []string{runsc.AnnotationContainerType, runsc.AnnotationSandboxID, runsc.AnnotationContainerName} {
			delete(s.Annotations, k)
		}
		out, err := json.Marshal(&s)
		if err == nil {
			err = os.WriteFile(p, out, 0o600)
		}
		if err != nil {
			return fmt.Errorf("received memory image: %v: %w", err, errdefs.ErrInternal)
		}
	}
	return nil
}

// ownMounts gives a spec taken from a memory image (received from another
// node, or this node's, of another sandbox) the root and the bind mounts
// the daemon makes for the sandbox whose bundle is bundle and root is root
// (the bundle's rootfs, or its placeholder's): the identity files, the
// agent, and the root's own /tmp, each with this node's source and
// options. Any other bind is refused. A restore that kept the image's
// sources would bind another sandbox's directories, or a path that is
// gone with it (or was never on this node), and fail.
func (d *Daemon) ownMounts(s *specs.Spec, root, bundle string) error {
	s.Root.Path = root
	for i := range s.Mounts {
		m := &s.Mounts[i]
		if m.Type != "bind" && !slices.Contains(m.Options, "bind") && !slices.Contains(m.Options, "rbind") {
			continue // not a host path (a received spec's types were checked: spec.CheckForeign)
		}
		dst := path.Clean(m.Destination)
		switch {
		case dst == agentMountPoint:
			m.Source, m.Options = d.cfg.AgentPath, []string{"rbind", "ro", "nosuid", "nodev"}
		case dst == "/etc/hostname" || dst == "/etc/hosts" || dst == "/etc/resolv.conf" || dst == "/etc/machine-id":
			m.Source, m.Options = filepath.Join(bundle, "etc", path.Base(dst)), slices.Clone(spec.EtcMountOptions)
		case dst == "/tmp":
			m.Source, m.Options = filepath.Join(root, "tmp"), []string{"rbind", "rprivate"}
		default:
			return fmt.Errorf("a bind mount at %s (from %q), which the daemon does not make", m.Destination, m.Source)
		}
		m.Destination, m.Type = dst, "bind"
	}
	return nil
}

// readSmall reads file p, refusing one past max bytes.
func readSmall(p string, max int64) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err == nil && int64(len(b)) > max {
		err = fmt.Errorf("%s is over %d bytes", filepath.Base(p), max)
	}
	return b, err
}

// agentMountPoint is where the agent binary is bound in a sandbox.
const agentMountPoint = "/.forkbox/agent"
