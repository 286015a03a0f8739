package runsc

import (
	"bytes"
	"testing"
)

func TestCheckpointOf(t *testing.T) {
	argv := func(s string) [][]byte { return bytes.Split([]byte(s), []byte(" ")) }
	for cmd, want := range map[string]string{
		"/run/fb/runsc-bin/runsc --root /run/fb/runsc/sb-1 --platform systrap checkpoint --image-path /x --leave-running --hold-fd 3 sb-1": "sb-1",
		"runsc --root=/run/fb/runsc checkpoint --image-path /x sb-1":                                                                       "sb-1",
		"runsc --root /run/fb/runsc/sb-1 checkpoint --image-path /x sb-10":                                                                 "", // another id's root
		"runsc --root /run/other/runsc/sb-1 checkpoint --image-path /x sb-1":                                                               "", // another daemon's
		"runsc --root /run/fb/runsc/sb-1 restore --image-path /x sb-1":                                                                     "",
		"runsc-sandbox --root /run/fb/runsc/sb-1 boot --checkpoint sb-1":                                                                   "",
		"runsc checkpoint sb-1": "", // no root: not ours to tell
		"sb-1":                  "",
	} {
		id, ok := checkpointOf(argv(cmd), "/run/fb/runsc")
		if ok != (want != "") || (ok && id != want) {
			t.Errorf("checkpointOf(%q) = %q, %v; want %q", cmd, id, ok, want)
		}
	}
}
