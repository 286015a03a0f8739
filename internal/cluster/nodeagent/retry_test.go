package nodeagent

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// A create that keeps failing is tried again quickly at first and then
// at most maxRetryDelay apart, however many times it failed (the default
// limiter's waits grow to 1,000 s).
func TestRetryDelayIsCapped(t *testing.T) {
	l := retryLimiter()
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "sb"}}
	var waits []time.Duration
	for range 40 {
		waits = append(waits, l.When(req))
	}
	if waits[0] > time.Second {
		t.Errorf("first retry after %v, want it soon", waits[0])
	}
	for i, w := range waits {
		if w > maxRetryDelay {
			t.Fatalf("retry %d after %v, want at most %v", i+1, w, maxRetryDelay)
		}
	}
	if last := waits[len(waits)-1]; last != maxRetryDelay {
		t.Errorf("retry 40 after %v, want %v", last, maxRetryDelay)
	}
	l.Forget(req)
	if w := l.When(req); w > time.Second {
		t.Errorf("after a success, the next failure's retry after %v, want it soon", w)
	}
}
