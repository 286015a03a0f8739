package spec

import (
	"slices"
	"testing"
)

// TestEtcFilesReadOnly: the identity files live outside the sandbox's
// writable layer and disk limit, so their bind mounts must be read-only.
func TestEtcFilesReadOnly(t *testing.T) {
	mounts, err := WriteEtcFiles(t.TempDir(), EtcFiles{Hostname: "sb-1"})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mounts {
		for _, want := range []string{"ro", "nosuid", "nodev", "noexec"} {
			if !slices.Contains(m.Options, want) {
				t.Errorf("mount %s options %v: want %s", m.Destination, m.Options, want)
			}
		}
		if slices.Contains(m.Options, "rw") {
			t.Errorf("mount %s options %v: want no rw", m.Destination, m.Options)
		}
	}
	mounts[0].Options[0] = "changed"
	if mounts[1].Options[0] == "changed" || EtcMountOptions[0] == "changed" {
		t.Errorf("mounts share their options slice")
	}
}
