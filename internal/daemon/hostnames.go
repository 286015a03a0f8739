package daemon

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/network"
)

// Host-wide names a daemon owns. Its cgroup parent, bridge, nftables table
// and veth prefix name state that is global to the host (the last three to
// its network namespace), and its reconcile
// removes whatever it finds under them that is not its own (sweepOrphans):
// two daemons sharing one would tear down each other's sandboxes (a second
// daemon's start once deleted the first one's fresh veths and killed a
// `runsc run` in its cgroup). So a daemon holds an flock per name while it
// runs, and a second daemon that names one already held is refused.

// hostNamesDir holds the lock files: on /run, so a reboot clears them; the
// kernel drops a dead daemon's flocks, so a crash frees its names.
var hostNamesDir = "/run/forkbox-names"

// hostNames is the set of lock files a daemon holds.
type hostNames struct{ files []*os.File }

// lockHostNames takes cfg's host-wide names, or fails with
// FailedPrecondition naming the flag that collides and the daemon holding
// it.
func lockHostNames(cfg Config) (_ *hostNames, err error) {
	or := func(v, def string) string {
		if v == "" {
			return def
		}
		return v
	}
	// Links and nftables tables belong to a network namespace (a cluster
	// test runs its nodes in one each), cgroups to the host.
	netns, err := os.Readlink("/proc/thread-self/ns/net")
	if err != nil {
		return nil, fmt.Errorf("host names: this daemon's network namespace: %v: %w", err, errdefs.ErrInternal)
	}
	names := []struct{ flag, value, scope string }{
		{"--cgroup-parent", cfg.CgroupParent, ""},
		{"--bridge", or(cfg.Bridge, network.DefaultBridge), netns},
		{"--net-table", or(cfg.NetTable, network.DefaultTable), netns},
		{"--veth-prefix", or(cfg.VethPrefix, network.DefaultVeth), netns},
	}
	if err := os.MkdirAll(hostNamesDir, 0o700); err != nil {
		return nil, fmt.Errorf("host names: %v: %w", err, errdefs.ErrInternal)
	}
	h := &hostNames{}
	defer func() {
		if err != nil {
			h.release()
		}
	}()
	for _, n := range names {
		path := filepath.Join(hostNamesDir, strings.TrimPrefix(n.flag, "--")+"="+url.PathEscape(n.value))
		if n.scope != "" {
			path += "@" + url.PathEscape(n.scope)
		}
		f, err := lockName(path)
		if errors.Is(err, unix.EWOULDBLOCK) {
			holder, _ := os.ReadFile(path)
			return nil, fmt.Errorf("another forkbox daemon (pid %s) uses %s %s on this host (in this network namespace, for the network's names): give this one its own --cgroup-parent, --bridge, --net-table and --veth-prefix (they name host-wide state that each daemon's reconcile cleans up): %w",
				strings.TrimSpace(string(holder)), n.flag, n.value, errdefs.ErrFailedPrecondition)
		}
		if err != nil {
			return nil, fmt.Errorf("host names: lock %s: %v: %w", path, err, errdefs.ErrInternal)
		}
		h.files = append(h.files, f)
		if err := f.Truncate(0); err == nil {
			f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
		}
	}
	return h, nil
}

// lockName opens path (creating it) and takes its flock without waiting
// (unix.EWOULDBLOCK when another holds it). Holders remove the file when
// they let go, so a lock taken on a file that is no longer the one at path
// (removed, maybe made again, between the open and the flock) holds
// nothing: lockName then starts over.
func lockName(path string) (*os.File, error) {
	for range 100 {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, err
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			return nil, err
		}
		var held, named unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &held); err != nil {
			f.Close()
			return nil, err
		}
		if err := unix.Stat(path, &named); err == nil && named.Dev == held.Dev && named.Ino == held.Ino {
			return f, nil
		}
		f.Close()
	}
	return nil, fmt.Errorf("%s is removed and made again faster than it can be locked", path)
}

// release gives the names back: each lock file is removed while still
// locked (lockName's check makes that safe), then closed, which drops the
// flock. A daemon that crashed leaves its files, unlocked, for the next.
func (h *hostNames) release() {
	if h == nil {
		return
	}
	for _, f := range h.files {
		os.Remove(f.Name())
		f.Close()
	}
	h.files = nil
}
