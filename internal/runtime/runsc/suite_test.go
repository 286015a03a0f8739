// The shared runtime conformance suite (internal/runtime/testsuite).

package runsc

import (
	"path/filepath"
	"testing"

	"github.com/forkbox/forkbox/internal/runtime"
	"github.com/forkbox/forkbox/internal/runtime/testsuite"
)

func TestSuite(t *testing.T) {
	testsuite.Run(t, func(t *testing.T) runtime.Runtime {
		t.Helper()
		requireRunsc(t)
		dir := t.TempDir()
		rt, err := New(Options{Root: filepath.Join(dir, "state"), LogDir: filepath.Join(dir, "logs")})
		if err != nil {
			t.Fatal(err)
		}
		return rt
	})
}
