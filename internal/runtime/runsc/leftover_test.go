package runsc

import (
	"bytes"
	"testing"
)

func TestIsCheckpointOf(t *testing.T) {
	roots := []string{"/run/fb/runsc/sb-1", "/run/fb/runsc"}
	argv := func(s string) [][]byte { return bytes.Split([]byte(s), []byte(" ")) }
	for cmd, want := range map[string]bool{
		"/run/fb/runsc-bin/runsc --root /run/fb/runsc/sb-1 --platform systrap checkpoint --image-path /x --leave-running --hold-fd 3 sb-1": true,
		"runsc --root=/run/fb/runsc checkpoint --image-path /x sb-1":                                                                       true,
		"runsc --root /run/fb/runsc/sb-1 checkpoint --image-path /x sb-10":                                                                 false, // another id
		"runsc --root /run/other/runsc/sb-1 checkpoint --image-path /x sb-1":                                                               false, // another daemon's
		"runsc --root /run/fb/runsc/sb-1 restore --image-path /x sb-1":                                                                     false,
		"runsc-sandbox --root /run/fb/runsc/sb-1 boot --checkpoint sb-1":                                                                   false,
		"runsc checkpoint sb-1": false, // no root: not ours to tell
		"sb-1":                  false,
	} {
		if got := isCheckpointOf(argv(cmd), "sb-1", roots); got != want {
			t.Errorf("isCheckpointOf(%q) = %v, want %v", cmd, got, want)
		}
	}
}
