package main

import "testing"

func TestRemotePath(t *testing.T) {
	cases := []struct {
		arg, sb, path string
		remote        bool
	}{
		{"dev:/app", "dev", "/app", true},
		{"sb-1234:/a:b", "sb-1234", "/a:b", true},
		{"./a:b", "", "", false},
		{"/abs/a:b", "", "", false},
		{"dir/x:y", "", "", false},
		{"plain", "", "", false},
		{":/app", "", "", false},
		{"-", "", "", false},
	}
	for _, c := range cases {
		sb, p, ok := remotePath(c.arg)
		if sb != c.sb || p != c.path || ok != c.remote {
			t.Errorf("remotePath(%q): got %q %q %v, want %q %q %v", c.arg, sb, p, ok, c.sb, c.path, c.remote)
		}
	}
}
