// Bundle writing: config.json (temp + rename) and the small /etc files a
// sandbox gets bind-mounted from its bundle dir.

package spec

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/forkbox/forkbox/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// ConfigName is the spec file inside a bundle dir.
const ConfigName = "config.json"

// WriteBundle writes s as dir/config.json, atomically (temp file + fsync +
// rename). dir is created if missing. s.Root.Path must be absolute.
func WriteBundle(dir string, s *specs.Spec) error {
	if s == nil || s.Root == nil || !filepath.IsAbs(s.Root.Path) {
		return fmt.Errorf("bundle %s: spec root path must be absolute: %w", dir, errdefs.ErrInvalidArgument)
	}
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("bundle %s: encode spec: %v: %w", dir, err, errdefs.ErrInternal)
	}
	return writeFileAtomic(dir, ConfigName, b, 0o600)
}

// ReadBundle reads dir/config.json.
func ReadBundle(dir string) (*specs.Spec, error) {
	b, err := os.ReadFile(filepath.Join(dir, ConfigName))
	if os.IsNotExist(err) {
		return nil, fmt.Errorf("bundle %s: no %s: %w", dir, ConfigName, errdefs.ErrNotFound)
	} else if err != nil {
		return nil, fmt.Errorf("bundle %s: %v: %w", dir, err, errdefs.ErrInternal)
	}
	var s specs.Spec
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("bundle %s: decode spec: %v: %w", dir, err, errdefs.ErrInternal)
	}
	return &s, nil
}

// ReadRestoreBundle is ReadBundle of a spec a restore starts the runtime
// with, which a memory image brought: one with hooks is refused (forkbox
// writes none, and the runtime would run them on the host, as root).
func ReadRestoreBundle(dir string) (*specs.Spec, error) {
	s, err := ReadBundle(dir)
	if err == nil && s.Hooks != nil {
		return nil, fmt.Errorf("bundle %s: its spec has hooks, which forkbox never writes: %w", dir, errdefs.ErrFailedPrecondition)
	}
	return s, err
}

// EtcFiles are the identity files a sandbox gets at /etc/hostname,
// /etc/hosts and /etc/resolv.conf.
type EtcFiles struct {
	Hostname    string
	Hosts       []string // extra "IP name..." lines after the localhost ones
	Nameservers []string // IPs; none = no nameserver line
	Search      []string // search domains
}

// WriteEtcFiles writes dir/etc/{hostname,hosts,resolv.conf} (each atomically)
// and returns the bind mounts that place them in the sandbox. Pass the mounts
// to SpecOptions.Mounts.
//
// The mounts are read-only (EROFS inside), unlike Docker's: the files live
// in the bundle directory on the host's state filesystem, outside the
// sandbox's writable layer and so outside its disk limit, and a tenant who
// could write them could fill the filesystem that holds every other
// sandbox and the ledger. Keeping them out of the layer is what gives every
// sandbox its own identity: a snapshot never carries them, so a fork (and
// a memory fork, whose restored spec points at the child's own bundle)
// gets the files the daemon writes for it, never its parent's. A program
// that must change name resolution can use its own files (HOSTALIASES,
// LOCALDOMAIN, RES_OPTIONS) or ask for it in the sandbox's config.
func WriteEtcFiles(dir string, f EtcFiles) ([]specs.Mount, error) {
	if strings.ContainsAny(f.Hostname, "/ \t\n\x00") {
		return nil, fmt.Errorf("etc files: hostname %q is not valid: %w", f.Hostname, errdefs.ErrInvalidArgument)
	}
	var hosts strings.Builder
	hosts.WriteString("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
	if f.Hostname != "" {
		fmt.Fprintf(&hosts, "127.0.1.1\t%s\n", f.Hostname)
	}
	for _, l := range f.Hosts {
		if strings.ContainsAny(l, "\n\x00") {
			return nil, fmt.Errorf("etc files: hosts line %q is not valid: %w", l, errdefs.ErrInvalidArgument)
		}
		hosts.WriteString(l + "\n")
	}
	var resolv strings.Builder
	for _, ns := range f.Nameservers {
		if strings.ContainsAny(ns, " \t\n\x00") || ns == "" {
			return nil, fmt.Errorf("etc files: nameserver %q is not valid: %w", ns, errdefs.ErrInvalidArgument)
		}
		fmt.Fprintf(&resolv, "nameserver %s\n", ns)
	}
	if len(f.Search) > 0 {
		fmt.Fprintf(&resolv, "search %s\n", strings.Join(f.Search, " "))
	}
	etc := filepath.Join(dir, "etc")
	files := []struct{ name, data string }{
		{"hostname", f.Hostname + "\n"},
		{"hosts", hosts.String()},
		{"resolv.conf", resolv.String()},
	}
	mounts := make([]specs.Mount, 0, len(files))
	for _, fl := range files {
		if err := writeFileAtomic(etc, fl.name, []byte(fl.data), 0o644); err != nil {
			return nil, err
		}
		mounts = append(mounts, specs.Mount{
			Destination: "/etc/" + fl.name,
			Type:        "bind",
			Source:      filepath.Join(etc, fl.name),
			Options:     append([]string(nil), EtcMountOptions...),
		})
	}
	return mounts, nil
}

// EtcMountOptions are the options of the identity files' bind mounts:
// read-only, nothing executable, no devices or setuid (see WriteEtcFiles).
var EtcMountOptions = []string{"rbind", "rprivate", "ro", "nosuid", "nodev", "noexec"}

// writeClass is the class of a failed bundle write: ResourceExhausted when
// the state filesystem is full, Internal otherwise.
func writeClass(err error) error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return errdefs.ErrResourceExhausted
	}
	return errdefs.ErrInternal
}

func writeFileAtomic(dir, name string, data []byte, mode os.FileMode) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("write %s: %v: %w", filepath.Join(dir, name), err, errdefs.ErrInternal)
	}
	tmp, err := os.CreateTemp(dir, "."+name+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %v: %w", filepath.Join(dir, name), err, writeClass(err))
	}
	fail := func(err error) error {
		tmp.Close()
		os.Remove(tmp.Name())
		return fmt.Errorf("write %s: %v: %w", filepath.Join(dir, name), err, writeClass(err))
	}
	if _, err := tmp.Write(data); err != nil {
		return fail(err)
	}
	if err := tmp.Chmod(mode); err != nil {
		return fail(err)
	}
	if err := tmp.Sync(); err != nil {
		return fail(err)
	}
	if err := tmp.Close(); err != nil {
		return fail(err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, name)); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("write %s: %v: %w", filepath.Join(dir, name), err, errdefs.ErrInternal)
	}
	return nil
}

// PrepareRootfs makes the directories NewSpec's mounts need inside an
// already mounted rootfs: tmp (mode 1777) when the image lacks it.
func PrepareRootfs(rootfs string) error {
	tmp := filepath.Join(rootfs, "tmp")
	fi, err := os.Lstat(tmp)
	switch {
	case err == nil && fi.IsDir():
		return nil
	case err == nil:
		return fmt.Errorf("rootfs %s: tmp is not a directory: %w", rootfs, errdefs.ErrInvalidArgument)
	case !os.IsNotExist(err):
		return fmt.Errorf("rootfs %s: %v: %w", rootfs, err, errdefs.ErrInternal)
	}
	if err := os.Mkdir(tmp, 0o1777); err != nil {
		return fmt.Errorf("rootfs %s: %v: %w", rootfs, err, errdefs.ErrInternal)
	}
	if err := os.Chmod(tmp, 0o1777|os.ModeSticky); err != nil {
		return fmt.Errorf("rootfs %s: %v: %w", rootfs, err, errdefs.ErrInternal)
	}
	return nil
}
