package daemon_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/forkbox/forkbox/api/e2b/process"
	"github.com/forkbox/forkbox/api/e2b/process/processconnect"
	"github.com/forkbox/forkbox/internal/daemon"
	"github.com/forkbox/forkbox/internal/e2b"
)

// An E2B process start whose sandbox's agent never reports the start ends
// with its request: the caller that gives up releases the exec (its
// connection to the agent closes), instead of leaving it, and the
// sandbox's process slot, waiting until the endpoint stops. A hostile
// agent otherwise held one for every start its tenant gave up on.
func TestE2BStartEndsWithItsRequest(t *testing.T) {
	for _, tc := range []struct {
		op  string
		pty *process.PTY
	}{
		{"exec", nil},
		{"pty", &process.PTY{Size: &process.PTY_Size{Rows: 24, Cols: 80}}},
	} {
		f := daemon.NewSilentAgentFixture(t, tc.op)
		s, err := e2b.New(f.D, e2b.Config{APIKey: "k3y"})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(s)
		t.Cleanup(srv.Close)
		t.Cleanup(func() { s.Close() }) // first: it ends the handlers srv.Close waits for
		tok := envdToken(t, srv.URL, f.ID)

		ctx, cancel := context.WithCancel(context.Background())
		req := connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", "true"}}, Pty: tc.pty})
		req.Header().Set("E2b-Sandbox-Id", f.ID)
		req.Header().Set("X-Access-Token", tok)
		done := make(chan struct{})
		go func() {
			defer close(done)
			if st, err := processconnect.NewProcessClient(srv.Client(), srv.URL).Start(ctx, req); err == nil {
				st.Receive()
				st.Close()
			}
		}()
		await(t, f.Took, tc.op, "the agent never got the "+tc.op)
		cancel()
		await(t, f.Ended, tc.op, "the "+tc.op+" still waits on the agent after its request ended")
		<-done
	}
}

// envdToken is sandbox id's envd access token, as E2B's SDKs get it.
func envdToken(t *testing.T, base, id string) string {
	t.Helper()
	r, _ := http.NewRequest(http.MethodGet, base+"/sandboxes/"+id, nil)
	r.Header.Set("X-API-Key", "k3y")
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var d struct {
		Token string `json:"envdAccessToken"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&d); err != nil || d.Token == "" {
		t.Fatalf("GET /sandboxes/%s: %s, token %q, %v", id, resp.Status, d.Token, err)
	}
	return d.Token
}

// await waits for op on c, and fails t with hang after a minute.
func await(t *testing.T, c <-chan string, op, hang string) {
	t.Helper()
	deadline := time.After(time.Minute)
	for {
		select {
		case got := <-c:
			if got == op {
				return
			}
		case <-deadline:
			t.Fatal(hang)
		}
	}
}
