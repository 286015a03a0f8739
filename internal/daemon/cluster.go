package daemon

import (
	"maps"
	"slices"
)

// Runtimes returns the names of the runtimes this daemon offers, sorted
// (what a cluster node registers).
func (d *Daemon) Runtimes() []string { return slices.Sorted(maps.Keys(d.runtimes)) }

// RuntimeBinaries returns the binary of each runtime name as configured
// ("" = found in PATH).
func (d *Daemon) RuntimeBinaries() map[string]string {
	return map[string]string{RuntimeGVisor: d.cfg.RuntimeBinary, RuntimeCrun: d.cfg.CrunBinary}
}

// MaxSandboxes is the daemon's limit on live sandboxes.
func (d *Daemon) MaxSandboxes() int { return d.cfg.MaxSandboxes }

// StateDir is the daemon's state directory.
func (d *Daemon) StateDir() string { return d.cfg.StateDir }
