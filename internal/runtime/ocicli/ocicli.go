// Package ocicli holds what the drivers of OCI runtime command-line tools
// (runtime/crun, runtime/runsc) share: container id validation, the error
// classes of the messages the tools print, decoding of `state` and `list
// --format json` output, and the prologue of a detached run (bundle checks,
// the stdio log and /dev/null). It runs no runtime binary itself; each
// driver builds and runs its own commands.
package ocicli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/runtime"
)

// ValidID rejects ids an OCI runtime would refuse or that could escape its
// state root. runtimeName prefixes the InvalidArgument error.
func ValidID(runtimeName, id string) error {
	if id == "" || len(id) > 128 || strings.ContainsAny(id, "/\\ \t\n\x00") || id == "." || id == ".." {
		return fmt.Errorf("%s: container id %q is not valid: %w", runtimeName, id, errdefs.ErrInvalidArgument)
	}
	return nil
}

// LastLines returns the last n lines of s joined by " | ".
func LastLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// State is one container in `state` / `list --format json` output.
type State struct {
	ID     string `json:"id"`
	Pid    int    `json:"pid"`
	Status string `json:"status"`
	Bundle string `json:"bundle"`
}

// Runtime converts s as reported, fields unchanged.
func (s State) Runtime() runtime.State {
	return runtime.State{ID: s.ID, Status: s.Status, Pid: s.Pid, Bundle: s.Bundle}
}

// ParseState decodes `state id` output; a decoding failure is Internal.
func ParseState(runtimeName, id string, out []byte) (State, error) {
	var s State
	if err := json.Unmarshal(out, &s); err != nil {
		return State{}, fmt.Errorf("%s state %s: decode %q: %v: %w", runtimeName, id, out, err, errdefs.ErrInternal)
	}
	return s, nil
}

// ParseList decodes `list --format json` output (empty or "null" when no
// container is known); a decoding failure is Internal.
func ParseList(runtimeName string, out []byte) ([]State, error) {
	var ss []State
	if t := bytes.TrimSpace(out); len(t) > 0 && !bytes.Equal(t, []byte("null")) {
		if err := json.Unmarshal(t, &ss); err != nil {
			return nil, fmt.Errorf("%s list: decode %q: %v: %w", runtimeName, t, err, errdefs.ErrInternal)
		}
	}
	return ss, nil
}
