// The calls whose command lines and output every OCI runtime tool shares:
// state, list, kill, pause, resume and delete.

package ocicli

import (
	"context"
	"fmt"
	"strconv"
	"syscall"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/runtime"
)

// Command runs one subcommand of the tool (args[0] is the verb) about
// container id ("" for none) and returns its stdout; a failure is
// classified by Errors.Wrap.
type Command func(ctx context.Context, id string, args ...string) ([]byte, error)

// Tool implements the shared calls of runtime.Runtime on top of a driver's
// Command.
type Tool struct {
	Runtime string // "crun", "runsc": the prefix of every message
	Command Command
	// Convert turns the tool's report into a runtime.State; nil =
	// State.Runtime (fields as reported).
	Convert func(State) runtime.State
	// Forget removes what the tool may have left of an unknown id after
	// Delete (nil = nothing).
	Forget func(id string)
}

func (t Tool) convert(s State) runtime.State {
	if t.Convert != nil {
		return t.Convert(s)
	}
	return s.Runtime()
}

// State runs `state id`.
func (t Tool) State(ctx context.Context, id string) (runtime.State, error) {
	if err := ValidID(t.Runtime, id); err != nil {
		return runtime.State{}, err
	}
	out, err := t.Command(ctx, id, "state", id)
	if err != nil {
		return runtime.State{}, err
	}
	s, err := ParseState(t.Runtime, id, out)
	if err != nil {
		return runtime.State{}, err
	}
	return t.convert(s), nil
}

// List runs `list --format json`.
func (t Tool) List(ctx context.Context) ([]runtime.State, error) {
	out, err := t.Command(ctx, "", "list", "--format", "json")
	if err != nil {
		return nil, err
	}
	ss, err := ParseList(t.Runtime, out)
	if err != nil {
		return nil, err
	}
	states := make([]runtime.State, 0, len(ss))
	for _, s := range ss {
		states = append(states, t.convert(s))
	}
	return states, nil
}

// Kill runs `kill [--all] id sig`.
func (t Tool) Kill(ctx context.Context, id string, sig syscall.Signal, all bool) error {
	if err := ValidID(t.Runtime, id); err != nil {
		return err
	}
	args := []string{"kill"}
	if all {
		args = append(args, "--all")
	}
	_, err := t.Command(ctx, id, append(args, id, strconv.Itoa(int(sig)))...)
	return err
}

// Pause runs `pause id` on a running container (else FailedPrecondition).
func (t Tool) Pause(ctx context.Context, id string) error {
	return t.Transition(ctx, id, "pause", runtime.StatusRunning)
}

// Resume runs `resume id` on a paused container (else FailedPrecondition).
func (t Tool) Resume(ctx context.Context, id string) error {
	return t.Transition(ctx, id, "resume", runtime.StatusPaused)
}

// Delete runs `delete [--force] id`. When the tool says the container does
// not exist and state agrees, it calls Forget (if set) and returns nil;
// when state still knows the id, the tool's NotFound error is returned.
func (t Tool) Delete(ctx context.Context, id string, force bool) error {
	if err := ValidID(t.Runtime, id); err != nil {
		return err
	}
	args := []string{"delete"}
	if force {
		args = append(args, "--force")
	}
	_, err := t.Command(ctx, id, append(args, id)...)
	if err != nil && errdefs.IsNotFound(err) {
		// The tools say "does not exist" both for unknown ids and for
		// some half-created ones; make sure no state entry is left.
		if _, serr := t.State(ctx, id); serr == nil {
			return err
		}
		if t.Forget != nil {
			t.Forget(id)
		}
		return nil
	}
	return err
}

// Transition runs `verb id` (pause, resume) if the container's status is
// want, and is FailedPrecondition otherwise.
func (t Tool) Transition(ctx context.Context, id, verb, want string) error {
	st, err := t.State(ctx, id)
	if err != nil {
		return err
	}
	if st.Status != want {
		return fmt.Errorf("%s %s %s: container is %s, not %s: %w", t.Runtime, verb, id, st.Status, want, errdefs.ErrFailedPrecondition)
	}
	_, err = t.Command(ctx, id, verb, id)
	return err
}
