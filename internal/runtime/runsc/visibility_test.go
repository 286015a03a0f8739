// Tests that sandbox writes are in the host rootfs as soon as the write
// returns inside the sandbox (what a fork's snapshot relies on), with both
// --file-access modes, and logs the file-I/O cost of each.

package runsc

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/internal/runtime/spec"
)

// The script signals each step on stdout, which is a host file (not through
// gVisor's file system), so the host can check the rootfs right after.
const visibilityScript = `
cat /old >/dev/null; echo new > /old; echo step1
echo hi > /x; echo step2
echo tmp > /tmp/t; echo step3
dd if=/dev/zero of=/big bs=1M count=100 2>&1 | tail -n1; echo step4
dd if=/big of=/dev/null bs=1M 2>&1 | tail -n1; [ -e /fromhost ]; cat /x >/dev/null; echo step5
i=0; while [ ! -e /fromhost ] && [ $i -lt TRIES ]; do sleep 0.1; i=$((i+1)); done
echo "saw=$(cat /fromhost 2>/dev/null) x=$(cat /x)"; echo step6
sleep 1000`

func TestWriteVisibility(t *testing.T) {
	for _, access := range []string{"exclusive", "shared"} {
		t.Run(access, func(t *testing.T) {
			// How long the sandbox looks for /fromhost, in 0.1 s tries:
			// shared must see it (30 s only bounds a hang); exclusive may
			// never, and is only logged.
			tries := "20"
			if access == "shared" {
				tries = "300"
			}
			f := newFixture(t, Options{FileAccess: access}, spec.SpecOptions{
				Args: []string{"/bin/sh", "-c", strings.Replace(visibilityScript, "TRIES", tries, 1)},
			})
			// A file the sandbox reads (so gVisor caches it) then overwrites.
			if err := os.WriteFile(filepath.Join(f.Rootfs, "old"), []byte("old\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := f.rt.Run(context.Background(), f.ID, f.Bundle); err != nil {
				t.Fatalf("run: %v", err)
			}
			checks := []struct{ step, file, want string }{
				{"step1", "old", "new"},
				{"step2", "x", "hi"},
				{"step3", "tmp/t", "tmp"},
			}
			for _, c := range checks {
				f.WaitLog(t, c.step, 30*time.Second)
				b, err := os.ReadFile(filepath.Join(f.Rootfs, c.file))
				if got := string(b); err != nil || got != c.want+"\n" {
					t.Errorf("after %s: host %s = %q, %v; want %q", c.step, c.file, got, err, c.want)
				}
			}
			t3 := time.Now()
			f.WaitLog(t, "step4", 60*time.Second)
			t4 := time.Now()
			fi, err := os.Stat(filepath.Join(f.Rootfs, "big"))
			if err != nil || fi.Size() != 100<<20 {
				t.Errorf("after dd: host big: %v, %v; want 100 MiB", fi, err)
			}
			f.WaitLog(t, "step5", 60*time.Second)
			// Busybox dd prints no timing; the host-side gaps between steps
			// are close enough (5 ms polling).
			t.Logf("file-access=%s: dd 100 MiB write %v, read %v", access, t4.Sub(t3), time.Since(t4))

			// The other way: host changes while the sandbox runs (after it
			// looked both files up).
			os.WriteFile(filepath.Join(f.Rootfs, "x"), []byte("host\n"), 0o644)
			os.WriteFile(filepath.Join(f.Rootfs, "fromhost"), []byte("yes\n"), 0o644)
			log := f.WaitLog(t, "step6", 60*time.Second)
			seen := regexp.MustCompile(`saw=.*`).FindString(log)
			t.Logf("file-access=%s: host writes seen by the sandbox: %q (want saw=yes x=host)", access, seen)
			if access == "shared" && seen != "saw=yes x=host" {
				t.Errorf("shared: sandbox sees %q, want %q", seen, "saw=yes x=host")
			}
		})
	}
}
