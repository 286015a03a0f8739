package nodeagent

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/kube"
	"github.com/forkbox/forkbox/internal/daemon"
)

// agent is one node's link between its objects and its daemon.
type agent struct {
	o   Options
	log *slog.Logger
	c   client.Client // cached reads (this node's objects), writes
	api client.Reader // uncached reads (objects of other nodes, Secrets)
	d   *daemon.Daemon
	rec recorder.EventRecorder
	t   *transfers // nil without transfers

	// setups holds the UIDs of the builder Sandboxes whose setup this
	// process started (see setup.go).
	setups sync.Map
	// credsApplied holds, per Sandbox UID, the Secret resourceVersion each
	// credential was last applied at (credentials.go).
	credsApplied sync.Map

	// registered says a beat registered the node (heartbeat's own: no
	// other goroutine reads it).
	registered bool
	// noForeignCopies says the last look found no Checkpoint of another
	// node naming a copy here (heartbeat's own, as registered).
	noForeignCopies bool
}

// heartbeat registers the node, then renews its Lease every third of the
// lease duration until ctx ends; the node's facts (images, runtimes) are
// refreshed with each renewal. The manager owns it and waits for it.
func (a *agent) heartbeat(ctx context.Context) error {
	every := a.o.LeaseDuration / 3
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if err := a.beat(ctx); err != nil && ctx.Err() == nil {
			a.log.WarnContext(ctx, "node heartbeat failed; retrying", slog.Any("err", err))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// beat renews the node's Lease and registers or refreshes its
// ForkboxNode and status, within two thirds of the lease. Once the node is
// known, the renewal (the write a lapse depends on) goes first: an API
// server slow to answer the rest on a loaded host does not leave the lease
// unrenewed, nor the node's sandboxes Lost. That renewal only renews a
// lease that exists; one that failed is tried again after the
// registration, and a lease that is gone (its ForkboxNode was deleted, and
// the lease with it) is made then, so that it names the node that exists.
func (a *agent) beat(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, a.o.LeaseDuration*2/3)
	defer cancel()
	renewed := a.registered && a.renewExisting(ctx) == nil
	n, err := a.register(ctx)
	if err != nil {
		return err
	}
	a.registered = true
	if !renewed {
		if err := a.renew(ctx, n); err != nil {
			return err
		}
	}
	if err := a.writeNodeStatus(ctx, n); err != nil {
		return err
	}
	a.collectReplicas(ctx)
	return nil
}

func (a *agent) register(ctx context.Context) (*fbv1.ForkboxNode, error) {
	n := &fbv1.ForkboxNode{ObjectMeta: metav1.ObjectMeta{Name: a.o.NodeName}}
	if _, err := controllerutil.CreateOrPatch(ctx, a.c, n, func() error {
		n.Spec.Endpoint = a.o.Endpoint
		n.Spec.PreviewEndpoint = a.o.PreviewEndpoint
		return nil
	}); err != nil {
		return nil, fmt.Errorf("register node %s: %w", a.o.NodeName, err)
	}
	return n, nil
}

// writeNodeStatus records the node's facts, and Ready after a renewal.
func (a *agent) writeNodeStatus(ctx context.Context, n *fbv1.ForkboxNode) error {
	patch := client.MergeFrom(n.DeepCopy())
	n.Status.Runtimes = a.runtimes(ctx)
	n.Status.AgentVersion = a.o.Version
	n.Status.Allocatable = allocatable(a.d.MaxSandboxes())
	n.Status.Images = a.images(ctx)
	n.Status.LeaseName = a.o.NodeName
	n.Status.Transfer = a.transferInfo()
	kube.SetCondition(&n.Status.Conditions, fbv1.ConditionReady, true, "LeaseRenewed", "the node agent renews its Lease", n.Generation)
	if err := a.c.Status().Patch(ctx, n, patch); err != nil {
		return fmt.Errorf("node %s status: %w", a.o.NodeName, err)
	}
	return nil
}

// renew renews the node's Lease, making it, owned by n, if there is none.
func (a *agent) renew(ctx context.Context, n *fbv1.ForkboxNode) error {
	err := a.renewExisting(ctx)
	if !errors.IsNotFound(err) {
		return err
	}
	now := metav1.NewMicroTime(time.Now())
	secs := int32(a.o.LeaseDuration / time.Second)
	l := coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: a.o.Namespace, Name: a.o.NodeName,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: fbv1.GroupVersion.String(), Kind: "ForkboxNode", Name: n.Name, UID: n.UID}}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &a.o.NodeName, LeaseDurationSeconds: &secs, RenewTime: &now, AcquireTime: &now},
	}
	if err := a.c.Create(ctx, &l); err != nil {
		return fmt.Errorf("create lease %s/%s: %w", a.o.Namespace, a.o.NodeName, err)
	}
	return nil
}

// renewExisting renews the node's Lease if it exists (NotFound if not).
func (a *agent) renewExisting(ctx context.Context) error {
	var l coordinationv1.Lease
	if err := a.api.Get(ctx, types.NamespacedName{Namespace: a.o.Namespace, Name: a.o.NodeName}, &l); err != nil {
		if errors.IsNotFound(err) {
			return err
		}
		return fmt.Errorf("get lease: %w", err)
	}
	now := metav1.NewMicroTime(time.Now())
	secs := int32(a.o.LeaseDuration / time.Second)
	patch := client.MergeFrom(l.DeepCopy())
	l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, l.Spec.RenewTime = &a.o.NodeName, &secs, &now
	if err := a.c.Patch(ctx, &l, patch); err != nil {
		return fmt.Errorf("renew lease: %w", err)
	}
	return nil
}

// runtimes lists the daemon's runtimes with their binaries' versions.
func (a *agent) runtimes(ctx context.Context) []fbv1.RuntimeInfo {
	bins := a.d.RuntimeBinaries()
	var out []fbv1.RuntimeInfo
	for _, name := range a.d.Runtimes() {
		bin := bins[name]
		if bin == "" {
			bin = map[string]string{daemon.RuntimeGVisor: "runsc", daemon.RuntimeCrun: "crun"}[name]
		}
		out = append(out, fbv1.RuntimeInfo{Name: fbv1.Runtime(name), Version: binaryVersion(ctx, bin)})
	}
	return out
}

// binaryVersion is the first line bin prints for --version, bounded in
// time and size ("" when it prints nothing in 5s).
func binaryVersion(ctx context.Context, bin string) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, _ := exec.CommandContext(ctx, bin, "--version").Output()
	line, _, _ := strings.Cut(string(out), "\n")
	return kube.Truncate(strings.TrimSpace(line), 256)
}

func (a *agent) images(ctx context.Context) []string {
	imgs, err := a.d.Images().List(ctx)
	if err != nil {
		return nil
	}
	out := make([]string, 0, min(len(imgs), 512))
	for _, im := range imgs[:min(len(imgs), 512)] {
		out = append(out, im.Name)
	}
	return out
}

// allocatable is what this host gives sandboxes: the daemon's slots, the
// host's cores and memory.
func allocatable(slots int) fbv1.Allocatable {
	cpu := resource.NewQuantity(int64(goruntime.NumCPU()), resource.DecimalSI)
	al := fbv1.Allocatable{Slots: int32(slots), CPU: cpu}
	if mem := memTotal(); mem > 0 {
		al.Memory = resource.NewQuantity(mem, resource.BinarySI)
	}
	return al
}

func memTotal() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), "MemTotal:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}
