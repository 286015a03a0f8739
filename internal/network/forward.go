package network

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/forkbox/forkbox/errdefs"
	"golang.org/x/sys/unix"
)

// IPv4 forwarding is one host-wide switch shared by every forkbox network on
// the host (a daemon, a second daemon with its own table, tests). The state
// that restores it lives in forwardDir, outside any one daemon's run
// directory, so that it survives daemon restarts (a tmpfs: a reboot resets
// both the switch and the record):
//
//	forwardDir/prev          the value before forkbox switched it on; absent
//	                         if it was already on (then nothing is restored)
//	forwardDir/holder-TABLE  one per Manager that needs forwarding
//	forwardDir/lock          flock'd around every change
//
// The last holder to let go restores prev. The switch belongs to a network
// namespace: a daemon in a namespace other than the host's (a node of the
// cluster tests) keeps prev and its holders in forwardDir/netns-INODE, so
// it never restores the host's switch to its own namespace's value.
var (
	forwardDir  = "/run/forkbox/ip_forward.d"
	forwardPath = "/proc/sys/net/ipv4/ip_forward"
)

// netnsRecord names the record directory of this process's network
// namespace under forwardDir ("" for the host's: the kernel's initial
// namespace, whose nsfs inode is fixed, PROC_NET_INIT_INO; /proc/1 may
// not be readable even to root). It is the calling thread's namespace,
// the one whose ip_forward /proc/sys shows it, not /proc/self's: that is
// the main thread's, which a goroutine that locked it into another
// namespace and exited leaves there for good (Go cannot end the main
// thread), while every unlocked goroutine runs in the process's own.
var netnsRecord = sync.OnceValue(func() string {
	self, err := os.Stat("/proc/thread-self/ns/net")
	if err != nil {
		return ""
	}
	if st, ok := self.Sys().(*syscall.Stat_t); !ok || st.Ino == initNetnsIno {
		return ""
	}
	return NetnsRecordName(self)
})

// initNetnsIno is the inode of the initial network namespace's nsfs file.
const initNetnsIno = 0xEFFFFFF9

// NetnsRecordName is the directory under forwardDir that holds the
// forwarding record of the network namespace ns (a stat of its nsfs file),
// for whoever deletes that namespace and must remove its record.
func NetnsRecordName(ns os.FileInfo) string {
	st, ok := ns.Sys().(*syscall.Stat_t)
	if !ok {
		return ""
	}
	return fmt.Sprintf("netns-%d", st.Ino)
}

// ForwardRecordDir is the host-wide directory of forwarding records.
func ForwardRecordDir() string { return forwardDir }

// recordDir holds prev and the holders of this process's namespace.
func recordDir() string {
	return filepath.Join(forwardDir, netnsRecord())
}

// withForwardLock runs f holding the host-wide forwarding lock.
func withForwardLock(f func() error) error {
	if err := os.MkdirAll(forwardDir, 0o755); err != nil {
		return fmt.Errorf("network: create %s: %v: %w", forwardDir, err, errdefs.ErrInternal)
	}
	lf, err := os.OpenFile(filepath.Join(forwardDir, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("network: forwarding lock: %v: %w", err, errdefs.ErrInternal)
	}
	defer lf.Close()
	if err := unix.Flock(int(lf.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("network: forwarding lock: %v: %w", err, errdefs.ErrInternal)
	}
	defer unix.Flock(int(lf.Fd()), unix.LOCK_UN)
	return f()
}

func (m *Manager) holderPath() string { return ForwardHolder(m.cfg.Table) }

// ForwardHolder is the file that says the Manager of table, in this
// process's network namespace, holds IPv4 forwarding on: present from its
// first egress sandbox until its Destroy (or ReleaseForwarding).
func ForwardHolder(table string) string {
	return filepath.Join(recordDir(), "holder-"+table)
}

// enableForwarding turns on IPv4 forwarding, needed for egress "all", and
// registers this Manager as a holder. The value it replaces is recorded.
func (m *Manager) enableForwarding() error {
	m.forwardMu.Lock()
	defer m.forwardMu.Unlock()
	if m.forwardOn {
		if b, err := os.ReadFile(forwardPath); err == nil && strings.TrimSpace(string(b)) == "1" {
			return nil
		}
		// Something else on the host switched it off under us: on again
		// (sandboxes set up or changed from now on have egress again).
		m.log.Warn("net.ipv4.ip_forward was switched off by something else on the host; switching it on again")
	}
	err := withForwardLock(func() error {
		if err := os.MkdirAll(recordDir(), 0o755); err != nil {
			return fmt.Errorf("network: create %s: %v: %w", recordDir(), err, errdefs.ErrInternal)
		}
		if err := os.WriteFile(m.holderPath(), nil, 0o644); err != nil {
			return fmt.Errorf("network: record forwarding holder: %v: %w", err, errdefs.ErrInternal)
		}
		b, err := os.ReadFile(forwardPath)
		if err != nil {
			return fmt.Errorf("network: read %s: %v: %w", forwardPath, err, errdefs.ErrInternal)
		}
		prev := strings.TrimSpace(string(b))
		if prev == "1" {
			return nil
		}
		// Record first: a crash between the two writes leaves a record
		// that restores what the host had, never a lost value.
		if err := os.WriteFile(filepath.Join(recordDir(), "prev"), []byte(prev+"\n"), 0o644); err != nil {
			return fmt.Errorf("network: record ip_forward: %v: %w", err, errdefs.ErrInternal)
		}
		if err := os.WriteFile(forwardPath, []byte("1\n"), 0o644); err != nil {
			return fmt.Errorf("network: enable ip_forward: %v: %w", err, errdefs.ErrInternal)
		}
		m.log.Info("enabled net.ipv4.ip_forward for sandbox egress; it is restored when the last forkbox network is destroyed")
		return nil
	})
	if err != nil {
		return err
	}
	m.forwardOn = true
	return nil
}

// ReleaseForwarding drops the hold on IPv4 forwarding of the Manager of
// table, without the rest of a Manager (whose New may fail on a host left
// half torn down): what a cleanup that must not leave the host's switch on
// calls when it cannot Destroy.
func ReleaseForwarding(table string, log *slog.Logger) error {
	if log == nil {
		log = slog.Default()
	}
	m := &Manager{cfg: Config{Table: table}, log: log}
	return m.releaseForwarding()
}

// releaseForwarding drops this Manager's hold on IPv4 forwarding. When no
// holder is left, the value recorded before forkbox switched it on is put
// back. A Manager that never held it changes nothing.
func (m *Manager) releaseForwarding() error {
	m.forwardMu.Lock()
	defer m.forwardMu.Unlock()
	m.forwardOn = false
	if _, err := os.Stat(m.holderPath()); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return withForwardLock(func() error {
		if err := os.Remove(m.holderPath()); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("network: drop forwarding holder: %v: %w", err, errdefs.ErrInternal)
		}
		holders, err := filepath.Glob(filepath.Join(recordDir(), "holder-*"))
		if err != nil || len(holders) > 0 {
			return err
		}
		if netnsRecord() != "" {
			defer os.Remove(recordDir()) // a namespace's record goes with its last holder
		}
		prevPath := filepath.Join(recordDir(), "prev")
		prev, err := os.ReadFile(prevPath)
		if errors.Is(err, fs.ErrNotExist) {
			return nil // forwarding was on before forkbox
		}
		if err != nil {
			return fmt.Errorf("network: read %s: %v: %w", prevPath, err, errdefs.ErrInternal)
		}
		if err := os.WriteFile(forwardPath, prev, 0o644); err != nil {
			return fmt.Errorf("network: restore ip_forward: %v: %w", err, errdefs.ErrInternal)
		}
		m.log.Info("restored net.ipv4.ip_forward", "value", strings.TrimSpace(string(prev)))
		return os.Remove(prevPath)
	})
}
