package daemon

import (
	"fmt"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/store"
)

// transitions is the sandbox lifecycle, in one place. A state change not
// listed here is a FailedPrecondition error.
//
//	creating ──► running ◄──► paused
//	    │          ▲  │            │
//	    │          │  ▼            │
//	    │   hibernated ◄─ hibernating
//	    ▼           │            ▼
//	  failed ──► closing ──► closed
var transitions = map[string][]string{
	store.StateCreating:    {store.StateRunning, store.StateFailed, store.StateClosing},
	store.StateRunning:     {store.StateClosing, store.StateFailed, store.StateStopped, store.StatePaused, store.StateHibernating},
	store.StatePaused:      {store.StateRunning, store.StateClosing, store.StateFailed},
	store.StateHibernating: {store.StateHibernated, store.StateRunning, store.StateFailed, store.StateClosing},
	store.StateHibernated:  {store.StateRunning, store.StateClosing, store.StateFailed},
	store.StateStopped:     {store.StateClosing},
	store.StateFailed:      {store.StateClosing, store.StateClosed},
	store.StateClosing:     {store.StateClosed},
	store.StateClosed:      {},
}

// checkTransition returns nil if a sandbox may go from one state to another.
func checkTransition(id, from, to string) error {
	for _, s := range transitions[from] {
		if s == to {
			return nil
		}
	}
	return fmt.Errorf("sandbox %s is %s, cannot become %s: %w", id, from, to, errdefs.ErrFailedPrecondition)
}
