package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
)

func TestEnvFileStart(t *testing.T) {
	dir := t.TempDir()
	load := func(js string) (*startResult, error) {
		p := filepath.Join(dir, "env.json")
		if err := os.WriteFile(p, []byte(js), 0o600); err != nil {
			t.Fatal(err)
		}
		_, o, err := loadEnvFile(p)
		if err != nil || o.Start == nil {
			return nil, err
		}
		return &startResult{o.Start.Run, o.Start.ReadyPort, o.Start.ReadyCommand, o.Start.ReadyTimeoutMs}, nil
	}
	for _, tc := range []struct {
		js   string
		want *startResult
		bad  bool
	}{
		{js: `{"name": "e", "image": "i"}`},
		{js: `{"name": "e", "image": "i", "start": "httpd -f"}`, want: &startResult{"httpd -f", 0, "", 0}},
		{js: `{"name": "e", "image": "i", "start": {"run": "srv", "ready_port": 80, "ready_command": "true", "ready_timeout": "2s"}}`,
			want: &startResult{"srv", 80, "true", 2000}},
		{js: `{"name": "e", "image": "i", "start": {"ready_port": 80}}`, bad: true},
		{js: `{"name": "e", "image": "i", "start": {"run": "srv", "ready_timeout": "soon"}}`, bad: true},
		{js: `{"name": "e", "image": "i", "start": 7}`, bad: true},
	} {
		got, err := load(tc.js)
		if tc.bad {
			if !errdefs.IsInvalidArgument(err) {
				t.Errorf("%s: got %v, want InvalidArgument", tc.js, err)
			}
			continue
		}
		if err != nil || (got == nil) != (tc.want == nil) || (got != nil && *got != *tc.want) {
			t.Errorf("%s: got %+v, %v; want %+v", tc.js, got, err, tc.want)
		}
	}
}

type startResult struct {
	run     string
	port    int32
	command string
	timeout int64
}
