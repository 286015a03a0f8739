package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/runtime/runsc"
	"github.com/forkbox/forkbox/internal/runtime/spec"
	"github.com/forkbox/forkbox/internal/store"
)

// A pre-booted sandbox on the host (preboot.go has the pool): its
// placeholder's bundle at <bundle>/pod, the hostname its placeholder sets,
// the delete of both containers, and the placeholder's spec kept with a
// memory image, which a restore brings back first.

func (d *Daemon) podBundleDir(id string) string { return filepath.Join(d.bundleDir(id), "pod") }

// pooled reports whether sandbox id runs in a pre-booted sandbox (it has a
// placeholder container).
func (d *Daemon) pooled(id string) bool {
	_, err := os.Stat(filepath.Join(d.podBundleDir(id), "config.json"))
	return err == nil
}

// writePodBundle writes the placeholder's bundle: an empty root with the
// agent binary, which holds; CAP_SYS_ADMIN for sethostname only. The
// sandbox's cgroup and limits are set here, for all its containers.
func (d *Daemon) writePodBundle(ctx context.Context, dir, id, nsPath string, key prebootKey) error {
	rootfs := filepath.Join(dir, "rootfs")
	if err := os.MkdirAll(rootfs, 0o700); err != nil {
		return fmt.Errorf("pod bundle: %w", err)
	}
	if err := spec.PrepareRootfs(rootfs); err != nil {
		return err
	}
	s, err := d.podSpec(rootfs, id, nsPath, key)
	if err != nil {
		return err
	}
	d.startSpec(ctx, s, key.runtime, key.cpu, d.cgroupPath(id), true) // its boot: cpulimit.go
	return spec.WriteBundle(dir, s)
}

// podSpec is the placeholder's spec for sandbox id, booted for key.
func (d *Daemon) podSpec(rootfs, id, nsPath string, key prebootKey) (*specs.Spec, error) {
	s, err := spec.NewSpec(spec.SpecOptions{
		Rootfs:      rootfs,
		Hostname:    id,
		Args:        []string{"/.forkbox/agent", "hold"},
		NetNSPath:   nsPath,
		CgroupsPath: d.cgroupPath(id),
		CPU:         key.cpu,
		MemoryBytes: hostMemoryLimit(key.runtime, key.memory),
		Pids:        hostPidsLimit(key.runtime, key.pids),
		Mounts: []specs.Mount{{Destination: "/.forkbox/agent", Type: "bind", Source: d.cfg.AgentPath,
			Options: []string{"rbind", "ro", "nosuid", "nodev"}}},
	})
	if err != nil {
		return nil, err
	}
	caps := []string{"CAP_SYS_ADMIN"}
	s.Process.Capabilities = &specs.LinuxCapabilities{Bounding: caps, Effective: caps, Permitted: caps}
	setAppMemoryLimit(s, key.memory) // the sandbox boots from this spec
	runsc.AsPod(s, podID(id))
	return s, nil
}

// createdFits reports whether a placeholder created ahead for key (a
// member of the created kind, preboot.go) can take a memory image whose
// placeholder spec is pod. runsc checks the image's spec against the one
// the container was created with, so the two must be the same but for
// what is each sandbox's own (root, hostname, netns, cgroup, limits, the
// sandbox id) and mount sources, which runsc does not check. An image of
// an older daemon's placeholder does not fit and is restored the ordinary
// way.
func (d *Daemon) createdFits(pod *specs.Spec, key prebootKey) bool {
	mine, err := d.podSpec("/placeholder", "sb-placeholder", "/run/netns/placeholder", key)
	if err != nil {
		return false
	}
	a, aerr := canonicalPod(pod)
	b, berr := canonicalPod(mine)
	return aerr == nil && berr == nil && bytes.Equal(a, b)
}

// canonicalPod is a placeholder spec without what is a sandbox's own.
func canonicalPod(s *specs.Spec) ([]byte, error) {
	b, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	var c specs.Spec
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, err
	}
	c.Hostname = ""
	if c.Root != nil {
		c.Root.Path = ""
	}
	// runsc checks no dev.gvisor.internal.* annotation, nor ours; the
	// member's memory and CPU are the child's anyway (the key).
	delete(c.Annotations, runsc.AnnotationSandboxID)
	delete(c.Annotations, runsc.AnnotationAppMemoryLimit)
	delete(c.Annotations, runsc.AnnotationCPULimit)
	if len(c.Annotations) == 0 {
		c.Annotations = nil
	}
	for i := range c.Mounts {
		c.Mounts[i].Source = "" // under the root, or the agent binary's path: not checked
	}
	if c.Linux != nil {
		c.Linux.CgroupsPath, c.Linux.Resources = "", nil
		for i := range c.Linux.Namespaces {
			c.Linux.Namespaces[i].Path = ""
		}
	}
	return json.Marshal(c)
}

// hostnamer is the runtime feature a pre-booted sandbox is named with.
type hostnamer interface {
	Exec(ctx context.Context, id string, argv ...string) error
}

// setPodHostname names a pre-booted sandbox for its tenant: the hostname of
// the sandbox's first container is the one all of them see.
func (d *Daemon) setPodHostname(ctx context.Context, sb *store.Sandbox) error {
	h, ok := d.runtimes[sb.Runtime].(hostnamer)
	if !ok {
		return fmt.Errorf("runtime %s cannot run a helper in a sandbox", sb.Runtime)
	}
	if err := h.Exec(ctx, podID(sb.ID), "/.forkbox/agent", "sethostname", sb.Config.Hostname); err != nil {
		return fmt.Errorf("set the hostname: %w", err)
	}
	return nil
}

// deleteContainers deletes a sandbox's container and, when it ran in a
// pre-booted sandbox, its placeholder (the sandbox itself). The placeholder
// goes first: runsc cannot delete a second container whose sandbox has
// stopped (after a checkpoint) without failing, though it forgets it; the
// runsc driver's Delete counts that as done.
func (d *Daemon) deleteContainers(ctx context.Context, sb *store.Sandbox) error {
	rt, ok := d.runtimes[sb.Runtime]
	if !ok {
		return nil
	}
	if !d.pooled(sb.ID) {
		return rt.Delete(ctx, sb.ID, true)
	}
	return errors.Join(rt.Delete(ctx, podID(sb.ID), true), rt.Delete(ctx, sb.ID, true))
}

// podSpecFile holds, beside a memory image of a sandbox that ran in a
// pre-booted sandbox, its placeholder's spec.
const podSpecFile = "pod.json"

// readPodSpec reads the placeholder spec kept with a memory image (nil:
// the source was not pre-booted).
func (d *Daemon) readPodSpec(imageDir string) (*specs.Spec, error) {
	b, err := os.ReadFile(filepath.Join(imageDir, podSpecFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("the memory checkpoint's placeholder spec: %w", err)
	}
	var s specs.Spec
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("the memory checkpoint's placeholder spec: %v: %w", err, errdefs.ErrInternal)
	}
	return &s, nil
}

// writeRestoredPod writes sb's placeholder bundle from the source's spec:
// the same args and mount list (runsc checks them), sb's root, mount
// sources, netns, cgroup and limit.
func (d *Daemon) writeRestoredPod(ctx context.Context, sb *store.Sandbox, s *specs.Spec, nsPath string) error {
	dir := d.podBundleDir(sb.ID)
	rootfs := filepath.Join(dir, "rootfs")
	if err := os.MkdirAll(rootfs, 0o700); err != nil {
		return fmt.Errorf("pod bundle: %w", err)
	}
	if err := spec.PrepareRootfs(rootfs); err != nil {
		return err
	}
	if err := d.ownMounts(s, rootfs, d.bundleDir(sb.ID)); err != nil {
		return fmt.Errorf("the memory checkpoint's placeholder spec: %v: %w", err, errdefs.ErrFailedPrecondition)
	}
	for i := range s.Linux.Namespaces {
		if s.Linux.Namespaces[i].Type == specs.NetworkNamespace {
			s.Linux.Namespaces[i].Path = nsPath
		}
	}
	d.ownCgroup(ctx, s, sb)
	runsc.AsPod(s, podID(sb.ID))
	return spec.WriteBundle(dir, s)
}

// ownCgroup gives a spec taken from a memory image (the source's, perhaps
// another node's) sb's own cgroup, memory and pids limits and device
// rules, and the CPU limit its restore runs with (restoreCPU): none of
// them is the image's to say.
func (d *Daemon) ownCgroup(ctx context.Context, s *specs.Spec, sb *store.Sandbox) {
	if s.Linux == nil {
		s.Linux = &specs.Linux{}
	}
	s.Linux.CgroupsPath = d.cgroupPath(sb.ID)
	// Only what the daemon sets (spec.NewSpec): the image's other cgroup
	// settings go.
	r := &specs.LinuxResources{Devices: spec.DefaultDevices()}
	if p := hostPidsLimit(sb.Runtime, sb.Config.Pids); p > 0 {
		r.Pids = &specs.LinuxPids{Limit: &p}
	}
	if m := hostMemoryLimit(sb.Runtime, sb.Config.MemoryBytes); m > 0 {
		r.Memory = &specs.LinuxMemory{Limit: &m}
	}
	s.Linux.Resources = r
	d.restoreCPU(ctx, s, sb)
	ownAppMemoryLimit(s, sb)
}

// ownAppMemoryLimit gives a spec taken from a memory image sb's own Sentry
// memory limit (none but under gVisor), not the image's.
func ownAppMemoryLimit(s *specs.Spec, sb *store.Sandbox) {
	delete(s.Annotations, runsc.AnnotationAppMemoryLimit)
	if sb.Runtime == RuntimeGVisor {
		setAppMemoryLimit(s, sb.Config.MemoryBytes)
	}
}

// copyFile copies a small file (a spec).
func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o600)
}
