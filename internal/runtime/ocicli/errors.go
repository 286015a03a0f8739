// Error classes of the messages OCI runtime tools print on stderr.

package ocicli

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/forkbox/forkbox/errdefs"
)

// Rule maps messages containing any of Phrases (compared in lower case) to
// Class.
type Rule struct {
	Class   error
	Phrases []string
}

// The rules every OCI runtime tool needs: an unknown container or a missing
// file, a known id, and an illegal state transition. Drivers add their own
// phrases with Precondition and choose the order.
var (
	NotFound      = Rule{errdefs.ErrNotFound, []string{"does not exist", "no such file", "not found"}}
	AlreadyExists = Rule{errdefs.ErrAlreadyExists, []string{"already exists"}}
)

// Precondition is the FailedPrecondition rule: "not running", "not paused"
// and the runtime's own wording in extra.
func Precondition(extra ...string) Rule {
	return Rule{errdefs.ErrFailedPrecondition, append([]string{"not running", "not paused"}, extra...)}
}

// Errors turns a failed command of one runtime tool into an error of the
// right class: the first rule with a phrase in the message wins, Internal
// when none matches.
type Errors struct {
	Runtime string // "crun", "runsc": the prefix of every message
	Rules   []Rule
}

// Classify returns the class of msg.
func (e Errors) Classify(msg string) error {
	m := strings.ToLower(msg)
	for _, r := range e.Rules {
		for _, p := range r.Phrases {
			if strings.Contains(m, p) {
				return r.Class
			}
		}
	}
	return errdefs.ErrInternal
}

// Wrap turns err from `<runtime> verb ... id` with the tool's stderr into
// an error of the class of stderr (or of err when stderr is empty),
// carrying the last 5 lines of it. If ctx is done, the error wraps
// ctx.Err() instead.
func (e Errors) Wrap(ctx context.Context, verb, id string, err error, stderr string) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%s %s %s: %w", e.Runtime, verb, id, ctx.Err())
	}
	msg := strings.TrimSpace(stderr)
	if msg == "" {
		msg = err.Error()
	}
	return fmt.Errorf("%s %s %s: %s: %w", e.Runtime, verb, id, LastLines(msg, 5), e.Classify(msg))
}

// Reclass returns err with class from replaced by class to (same message),
// or err unchanged when it is not of class from. A create call uses it when
// the tool's "not found" is about something the spec names, not about the
// container.
func Reclass(err, from, to error) error {
	if !errors.Is(err, from) {
		return err
	}
	return fmt.Errorf("%s: %w", strings.TrimSuffix(err.Error(), ": "+from.Error()), to)
}
