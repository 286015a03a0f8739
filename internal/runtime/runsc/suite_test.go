// The shared runtime conformance suite (internal/runtime/testsuite).

package runsc

import (
	"path/filepath"
	"testing"

	"github.com/forkbox/forkbox/internal/runtime"
	"github.com/forkbox/forkbox/internal/runtime/testsuite"
)

func TestSuite(t *testing.T) { runSuite(t, false) }

// The conformance suite again, with every runsc in a view of its own
// (view.go): containers' netns files, bound after the driver's start,
// reach runsc by attach (their rootfs are plain directories here; the
// daemon's tests start every sandbox from an attached overlay).
func TestSuiteInView(t *testing.T) { runSuite(t, true) }

func runSuite(t *testing.T, inView bool) {
	testsuite.Run(t, func(t *testing.T) runtime.Runtime {
		t.Helper()
		requireRunsc(t)
		dir := t.TempDir()
		o := Options{Root: filepath.Join(dir, "state"), LogDir: filepath.Join(dir, "logs")}
		if inView {
			o.HideMountsUnder = []string{filepath.Join(dir, "hidden")}
		}
		rt, err := New(o)
		if err != nil {
			t.Fatal(err)
		}
		// Before the temp dir's removal: Close unmounts the view's
		// boundary on the hidden directory.
		t.Cleanup(func() { rt.Close() })
		if inView && rt.view == nil {
			t.Fatal("no view made")
		}
		return rt
	})
}
