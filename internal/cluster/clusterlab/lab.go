// Package clusterlab runs forkbox's cluster mode on this machine for the
// programs that show and measure it (tools/clusterdemo, the cluster
// section of tools/bench): a control plane and the test cluster of
// package clustertest, with the busybox test image on every node, and
// what those programs read off the objects: a sandbox until it runs and
// answers an exec, a checkpoint until it is ready, objects until they are
// gone, and the pulls of a checkpoint from its Transferred events.
package clusterlab

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/cluster/clustertest"
	"github.com/forkbox/forkbox/internal/cluster/kube"
	"github.com/forkbox/forkbox/internal/testimage"
)

// Lab is a running control plane and test cluster.
type Lab struct {
	Plane   *clustertest.Plane
	Cluster *clustertest.Cluster
	// Image is the busybox test image, imported on every node.
	Image string

	watch client.WithWatch
	say   func(format string, a ...any)
}

// Missing says what this machine lacks for a Lab, or "": root, the
// control plane's binaries (KUBEBUILDER_ASSETS), the tools the nodes run,
// the test image.
func Missing() string {
	if os.Geteuid() != 0 {
		return "needs root (it mounts btrfs, makes network namespaces, runs sandboxes)"
	}
	if why := clustertest.Missing(); why != "" {
		return why
	}
	for _, bin := range []string{"runsc", "crun", "mkfs.btrfs", "nsenter", "ip"} {
		if _, err := exec.LookPath(bin); err != nil {
			return bin + " is not installed (run ./scripts/setup.sh)"
		}
	}
	if err := testimage.Available(); err != nil {
		return err.Error()
	}
	return ""
}

// Up starts a control plane and a cluster shaped by o, and imports the
// test image on every node; say hears what it does. On failure it removes
// what it made.
func Up(ctx context.Context, o clustertest.Options, say func(format string, a ...any)) (_ *Lab, err error) {
	if why := Missing(); why != "" {
		return nil, fmt.Errorf("%s: %w", why, errdefs.ErrFailedPrecondition)
	}
	// controller-runtime's clients log through its global logger (and
	// print a stack when none is set): slog's default gets their lines.
	kube.SetLogger(slog.Default())
	l := &Lab{Plane: &clustertest.Plane{}, say: say}
	say("starting the control plane (kube-apiserver, etcd)")
	if err := l.Plane.Start(); err != nil {
		return nil, fmt.Errorf("control plane: %w", err)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, l.Close())
		}
	}()
	nodes := o.Nodes
	if nodes == 0 {
		nodes = 3 // clustertest's default
	}
	say("starting forkbox controller and %d node agents", nodes)
	if l.Cluster, err = clustertest.StartCluster(ctx, l.Plane, o); err != nil {
		return nil, err
	}
	for _, n := range l.Cluster.Nodes {
		say("node %s: netns %s, endpoint %s, state %s", n.Name, n.NetNS, n.Endpoint, n.StateDir)
	}
	if l.watch, err = client.NewWithWatch(l.Plane.Config, client.Options{Scheme: l.Plane.Client.Scheme()}); err != nil {
		return nil, err
	}
	img, err := testimage.Busybox()
	if err != nil {
		return nil, err
	}
	archive := filepath.Join(l.Cluster.Dir, "busybox.tar")
	if err := testimage.WriteOCIArchive(img, "lab.local/busybox:latest", archive); err != nil {
		return nil, err
	}
	if l.Image, err = l.Cluster.ImportImage(ctx, archive); err != nil {
		return nil, err
	}
	return l, nil
}

// Client is an admin's client of the control plane.
func (l *Lab) Client() client.Client { return l.Plane.Client }

// Watcher is an admin's client that can also watch.
func (l *Lab) Watcher() client.WithWatch { return l.watch }

// Logs is the end of every process's log (3000 bytes of each), for a
// failure report.
func (l *Lab) Logs() string {
	if l.Cluster == nil {
		return ""
	}
	return l.Cluster.Logs(3000)
}

// Close removes the cluster (and audits the host for leftovers), then
// stops the control plane.
func (l *Lab) Close() error {
	var errs []error
	if l.Cluster != nil {
		l.say("cleaning up: stopping the agents and the controller, `forkbox uninstall --purge` in each node's namespace, " +
			"then removing the namespaces, the bridge and " + l.Cluster.Dir)
		if err := l.Cluster.Close(context.Background()); err != nil {
			errs = append(errs, err)
		} else {
			l.say("nothing left behind (leak audit: mounts, loop devices, processes, netns, links, cgroups)")
		}
		l.Cluster = nil
	}
	if l.Plane != nil && l.Plane.Env != nil {
		l.say("stopping the control plane")
		errs = append(errs, l.Plane.Stop())
		l.Plane.Env = nil
	}
	return errors.Join(errs...)
}
