package server

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
	"github.com/forkbox/forkbox/internal/daemon"
)

// The fuzz targets send a hostile caller's raw request bodies through the
// real API handler (Connect decoding, size limit, error mapping, panic
// recovery) into the daemon's real request validation. The daemon is a zero
// Daemon: it has no runtime, store or image, so a request that passes every
// check stops at the first piece of state the daemon needs (a create at "no
// such runtime", an exec at the store, where the nil store's panic comes back
// as a recovered Internal error). So every request gets an answer, and an
// answer other than an input error means the request passed validation; an
// oracle independent of the daemon's code then says whether it should have.

var envKey = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// fuzzHandler is the API handler in front of a zero daemon.
func fuzzHandler() http.Handler {
	return Handler(&daemon.Daemon{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
}

// connectError is the code and message of a Connect error body.
type connectError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// unary POSTs body as JSON to procedure and returns the HTTP status and the
// Connect error (zero on success).
func unary(t *testing.T, h http.Handler, procedure string, body []byte) (int, connectError) {
	req := httptest.NewRequest(http.MethodPost, "/forkbox.v1.SandboxService/"+procedure, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	var ce connectError
	if rec.Code != http.StatusOK {
		if err := json.Unmarshal(rec.Body.Bytes(), &ce); err != nil {
			t.Fatalf("%s: status %d with a body that is not a Connect error: %q", procedure, rec.Code, rec.Body.Bytes())
		}
	}
	return rec.Code, ce
}

// streaming sends body as the one message of a server-streaming call and
// returns the Connect error of its end-of-stream message (zero on success).
func streaming(t *testing.T, h http.Handler, procedure string, body []byte) connectError {
	var env bytes.Buffer
	env.WriteByte(0)
	binary.Write(&env, binary.BigEndian, uint32(len(body)))
	env.Write(body)
	req := httptest.NewRequest(http.MethodPost, "/forkbox.v1.SandboxService/"+procedure, &env)
	req.Header.Set("Content-Type", "application/connect+json")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		var ce connectError
		json.Unmarshal(rec.Body.Bytes(), &ce)
		return ce
	}
	out := rec.Body.Bytes()
	for len(out) >= 5 {
		flags, n := out[0], binary.BigEndian.Uint32(out[1:5])
		if uint32(len(out)-5) < n {
			t.Fatalf("%s: truncated envelope in the response", procedure)
		}
		msg := out[5 : 5+n]
		out = out[5+n:]
		if flags&0x02 != 0 { // end of stream
			var end struct {
				Error *connectError `json:"error"`
			}
			if err := json.Unmarshal(msg, &end); err != nil {
				t.Fatalf("%s: bad end-of-stream message %q", procedure, msg)
			}
			if end.Error != nil {
				return *end.Error
			}
			return connectError{}
		}
	}
	t.Fatalf("%s: the response has no end-of-stream message", procedure)
	return connectError{}
}

// createShouldPass is the oracle for a create: the documented rules of the
// API, written from the outside.
func createShouldPass(m *v1.CreateSandboxRequest) (bool, string) {
	switch {
	case m.Image == "":
		return false, "no image"
	case m.Name != "" && !regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$`).MatchString(m.Name):
		return false, "bad name"
	case m.Cwd != "" && !strings.HasPrefix(m.Cwd, "/"):
		return false, "relative cwd"
	case m.Egress != "" && m.Egress != "none" && m.Egress != "all":
		return false, "bad egress"
	case m.TimeoutMs < 0 || m.TimeoutMs > (366*24*time.Hour).Milliseconds():
		return false, "timeout out of range"
	case m.OnTimeout != "" && m.OnTimeout != "close" && m.OnTimeout != "hibernate":
		return false, "bad on_timeout"
	}
	if r := m.Resources; r != nil {
		if _, err := daemon.ParseCPU(r.Cpu); err != nil {
			return false, "bad cpu"
		}
		if _, err := daemon.ParseMemory(r.Memory); err != nil {
			return false, "bad memory"
		}
		if r.Pids != 0 && (r.Pids < 8 || r.Pids > 1<<22) {
			return false, "bad pids"
		}
	}
	size := 0
	for k, v := range m.Env {
		if !envKey.MatchString(k) {
			return false, "bad env name"
		}
		size += len(k) + len(v)
	}
	if size > 256<<10 {
		return false, "env too large"
	}
	return true, ""
}

// unsafeStrings lists the values of a request that reach a runtime's spec, a
// path or an exec and must not carry a NUL byte (it would fail later, after
// the sandbox was recorded, or be cut short by the kernel).
func unsafeStrings(cwd string, env map[string]string) []string {
	var bad []string
	if strings.ContainsRune(cwd, 0) {
		bad = append(bad, "cwd")
	}
	for k, v := range env {
		if strings.ContainsRune(k+v, 0) {
			bad = append(bad, "env "+k)
		}
	}
	return bad
}

func FuzzCreateRequest(f *testing.F) {
	for _, s := range []string{
		`{"image":"busybox","resources":{"cpu":"500m","memory":"1Gi","pids":100}}`,
		`{"image":"busybox","name":"dev","env":{"A":"1"},"cwd":"/root","egress":"all","runtime":"crun"}`,
		`{"image":"busybox","resources":{"cpu":"NaN","memory":"1e400Mi","pids":-1}}`,
		`{"image":"x","name":"../../etc","cwd":"relative","env":{"1BAD":"x","A=B":"y"}}`,
		`{"image":"x","resources":{"memory":"9223372036854775807Ti"}}`,
		`{"image":"x","egress":"everything","runtime":"runc"}`,
		`{"image":"x","timeout_ms":"30000","on_timeout":"hibernate"}`,
		`{"image":"x","timeout_ms":"-1"}`,
		`{"image":"x","timeout_ms":"9223372036854775807","on_timeout":"explode"}`,
		`{"image":"x","timeout_ms":"31622400001"}`,
		`{"image":`, `[]`, `{"image":1}`, ``,
	} {
		f.Add([]byte(s))
	}
	h := fuzzHandler()
	f.Fuzz(func(t *testing.T, body []byte) {
		status, ce := unary(t, h, "CreateSandbox", body)
		var m v1.CreateSandboxRequest
		if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(body, &m); err != nil {
			if ce.Code != "invalid_argument" {
				t.Fatalf("undecodable body %q: got %d %+v, want invalid_argument", body, status, ce)
			}
			return
		}
		// With no runtime on the daemon, passing validation ends at the
		// runtime check.
		passed := ce.Code == "invalid_argument" && strings.Contains(ce.Message, "is not available on this daemon")
		switch ce.Code {
		case "invalid_argument", "resource_exhausted":
		default:
			t.Fatalf("create %q: got %d %+v, want an input error (the daemon has no runtime)", body, status, ce)
		}
		want, why := createShouldPass(&m)
		if passed && !want {
			t.Errorf("create %q passed validation, but it should not (%s)", body, why)
		}
		if !passed && want {
			t.Errorf("create %q was refused (%s), but it is valid", body, ce.Message)
		}
		if bad := unsafeStrings(m.Cwd, m.Env); passed && len(bad) > 0 {
			t.Errorf("create %q passed validation with a NUL byte in %v", body, bad)
		}
	})
}

func FuzzExecRequest(f *testing.F) {
	for _, s := range []string{
		`{"sandbox":"sb-1","shell":"echo hi"}`,
		`{"sandbox":"sb-1","argv":["sh","-c","true"],"env":{"A":"1"},"cwd":"/tmp","stdin":"aGk=","timeout_ms":"1000"}`,
		`{"sandbox":"sb-1","argv":["true"],"shell":"true"}`,
		`{"sandbox":"sb-1"}`,
		`{"sandbox":"sb-1","shell":"x","env":{"BAD-NAME":"1"}}`,
		`{"sandbox":"sb-1","shell":"x","timeout_ms":"-5"}`,
		`{"sandbox":"sb-1","shell":"x","timeout_ms":"18446744073710"}`,
		`{"sandbox":"sb-1","shell":"x","background":true}`,
		`{"shell":`, ``,
	} {
		f.Add([]byte(s))
	}
	h := fuzzHandler()
	f.Fuzz(func(t *testing.T, body []byte) {
		ce := streaming(t, h, "Exec", body)
		var m v1.ExecRequest
		if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(body, &m); err != nil {
			if ce.Code != "invalid_argument" {
				t.Fatalf("undecodable body %q: got %+v, want invalid_argument", body, ce)
			}
			return
		}
		// A request that passes checkExec reaches the (nil) store: its
		// panic is recovered as Internal.
		passed := ce.Code == "internal"
		switch ce.Code {
		case "invalid_argument", "resource_exhausted", "internal":
		default:
			t.Fatalf("exec %q: got %+v", body, ce)
		}
		want, why := true, ""
		n := len(m.Shell)
		for _, a := range m.Argv {
			n += len(a)
		}
		for k, v := range m.Env {
			if !envKey.MatchString(k) {
				want, why = false, "bad env name"
			}
			n += len(k) + len(v)
		}
		switch {
		case len(m.Argv) == 0 && m.Shell == "":
			want, why = false, "no command"
		case len(m.Argv) > 0 && m.Shell != "":
			want, why = false, "argv and shell"
		case n > 1<<20:
			want, why = false, "command too large"
		case len(m.Stdin) > 16<<20:
			want, why = false, "stdin too large"
		case m.TimeoutMs < 0:
			want, why = false, "negative timeout"
		case m.TimeoutMs > int64(time.Duration(1<<63-1)/time.Millisecond):
			want, why = false, "timeout does not fit a time.Duration"
		}
		if passed != want {
			t.Errorf("exec %q: passed validation = %v (%s), want %v (%s)", body, passed, ce.Message, want, why)
		}
	})
}
