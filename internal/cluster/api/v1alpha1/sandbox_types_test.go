package v1alpha1

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A sandbox holds a slot of its node while the node's daemon counts it:
// a failed or degraded local sandbox does, until closed; a create that
// failed, or a record gone from the node's ledger, does not.
func TestHoldsSlot(t *testing.T) {
	ready := func(reason string) []metav1.Condition {
		return []metav1.Condition{{Type: ConditionReady, Status: metav1.ConditionFalse, Reason: reason}}
	}
	for _, tc := range []struct {
		name string
		st   SandboxStatus
		want bool
	}{
		{"running", SandboxStatus{Phase: PhaseRunning, LocalID: "sb-1"}, true},
		{"creating", SandboxStatus{Phase: PhaseCreating}, true},
		{"hibernated", SandboxStatus{Phase: PhaseHibernated, LocalID: "sb-1"}, true},
		{"closed", SandboxStatus{Phase: PhaseClosed, LocalID: "sb-1"}, false},
		{"local sandbox failed or degraded", SandboxStatus{Phase: PhaseFailed, LocalID: "sb-1", Conditions: ready(string(PhaseFailed))}, true},
		{"create failed", SandboxStatus{Phase: PhaseFailed, Conditions: ready("CreateFailedNotFound")}, false},
		{"gone from the ledger", SandboxStatus{Phase: PhaseFailed, LocalID: "sb-1", Conditions: ready("LocalSandboxGone")}, false},
		{"failed, no condition", SandboxStatus{Phase: PhaseFailed, LocalID: "sb-1"}, false},
	} {
		sb := &Sandbox{Status: tc.st}
		if got := sb.HoldsSlot(); got != tc.want {
			t.Errorf("%s: HoldsSlot %v, want %v", tc.name, got, tc.want)
		}
	}
}
