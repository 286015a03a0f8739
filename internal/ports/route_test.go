package ports

import (
	"strings"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
)

func TestParseHost(t *testing.T) {
	for _, tc := range []struct {
		host     string
		domain   string // "x" unless set
		ok       bool
		bad      bool
		id       string
		port     int
		badClass func(error) bool
	}{
		{host: "8080-sb-abc123.localhost:8089", domain: "localhost", ok: true, id: "sb-abc123", port: 8080},
		{host: "8080-sb-abc123.localhost:8089", domain: "-", ok: true, id: "sb-abc123", port: 8080}, // "" is localhost
		{host: "8080-SB-ABC123.Example.COM", domain: "preview.example.com"},                         // another domain
		{host: "8080-SB-ABC123.Preview.Example.COM", domain: "preview.example.COM", ok: true, id: "sb-abc123", port: 8080},
		{host: "8080-sb-a.evil.preview.example.com", domain: "preview.example.com"}, // deeper
		{host: "8080-sb-a.example.com", domain: "preview.example.com"},              // shallower
		{host: "8080-sb-a.xpreview.example.com", domain: "preview.example.com"},     // a suffix, not a label
		{host: "8080-sb-a.x.localhost", domain: "localhost"},
		{host: "1-sb-a.x", ok: true, id: "sb-a", port: 1},
		{host: "65535-sb-a.x", ok: true, id: "sb-a", port: 65535},
		{host: "127.0.0.1:8089"},
		{host: "localhost:8089"},
		{host: "8080-sb-a"},   // no domain
		{host: "8080-sb-a."},  // empty domain
		{host: "sb-a-8080.x"}, // port last
		{host: "-sb-a.x"},     // no port
		{host: "80a-sb-a.x"},  // not digits: not this form
		{host: "8080-sb_a.x"}, // not a DNS label
		{host: "[::1]:8089"},  // an IP literal
		{host: "0-sb-a.x", bad: true, badClass: errdefs.IsInvalidArgument},
		{host: "08080-sb-a.x", bad: true, badClass: errdefs.IsInvalidArgument},
		{host: "65536-sb-a.x", bad: true, badClass: errdefs.IsInvalidArgument},
		{host: "999999-sb-a.x", bad: true, badClass: errdefs.IsInvalidArgument},
		{host: "7077-sb-a.x", bad: true, badClass: errdefs.IsPermissionDenied},
	} {
		domain := tc.domain
		switch domain {
		case "":
			domain = "x"
		case "-":
			domain = ""
		}
		r, ok, err := ParseHost(tc.host, domain)
		if tc.bad {
			if !ok || err == nil || !tc.badClass(err) {
				t.Errorf("ParseHost(%q): got ok=%v err=%v, want a rejected port of the right class", tc.host, ok, err)
			}
			continue
		}
		if err != nil || ok != tc.ok || (ok && (r.Sandbox != tc.id || r.Port != tc.port || !r.ByHost)) {
			t.Errorf("ParseHost(%q): got %+v ok=%v err=%v, want ok=%v %s:%d", tc.host, r, ok, err, tc.ok, tc.id, tc.port)
		}
	}
}

func TestParsePath(t *testing.T) {
	for _, tc := range []struct {
		path   string
		ok     bool
		bad    bool
		id     string
		port   int
		rest   string
		prefix string
	}{
		{path: "/sandboxes/sb-a/ports/8080/", ok: true, id: "sb-a", port: 8080, rest: "/", prefix: "/sandboxes/sb-a/ports/8080"},
		{path: "/sandboxes/sb-a/ports/8080/x/y?z", ok: true, id: "sb-a", port: 8080, rest: "/x/y?z", prefix: "/sandboxes/sb-a/ports/8080"},
		{path: "/sandboxes/sb-a/ports/8080", ok: true, id: "sb-a", port: 8080, rest: ""},
		{path: "/"},
		{path: "/sandboxes/"},
		{path: "/sandboxes/sb-a"},
		{path: "/sandboxes/sb-a/files/8080/"},
		{path: "/sandboxes/../ports/80/"},
		{path: "/sandboxes/SB-A/ports/80/"},
		{path: "/sandboxes/sb-a/ports/7077/", bad: true},
		{path: "/sandboxes/sb-a/ports/0/", bad: true},
		{path: "/sandboxes/sb-a/ports/80@evil.com/", bad: true},
		{path: "/sandboxes/sb-a/ports/-1/", bad: true},
		{path: "/sandboxes/sb-a/ports/+80/", bad: true},
		{path: "/sandboxes/sb-a/ports//", bad: true},
	} {
		r, ok, err := ParsePath(tc.path)
		if tc.bad {
			if !ok || err == nil {
				t.Errorf("ParsePath(%q): got ok=%v err=%v, want a rejected port", tc.path, ok, err)
			}
			continue
		}
		if err != nil || ok != tc.ok || (ok && (r.Sandbox != tc.id || r.Port != tc.port || r.Path != tc.rest || r.ByHost)) {
			t.Errorf("ParsePath(%q): got %+v ok=%v err=%v, want ok=%v %s:%d %q", tc.path, r, ok, err, tc.ok, tc.id, tc.port, tc.rest)
		}
		if ok && tc.prefix != "" && r.Prefix() != tc.prefix {
			t.Errorf("ParsePath(%q).Prefix() = %q, want %q", tc.path, r.Prefix(), tc.prefix)
		}
	}
}

func TestParsePrefersHost(t *testing.T) {
	r, err := Parse("80-sb-h.localhost", "localhost", "/sandboxes/sb-p/ports/81/x")
	if err != nil || r.Sandbox != "sb-h" || r.Port != 80 || r.Path != "/sandboxes/sb-p/ports/81/x" {
		t.Errorf("got %+v %v, want the host's route with the path unchanged", r, err)
	}
	if _, err := Parse("127.0.0.1:8089", "localhost", "/index.html"); !errdefs.IsNotFound(err) {
		t.Errorf("neither form: got %v, want NotFound", err)
	}
}

func TestCheckPort(t *testing.T) {
	for _, p := range []int{-1, 0, 65536, 1 << 20, AgentPort} {
		if CheckPort(p) == nil {
			t.Errorf("CheckPort(%d) = nil, want an error", p)
		}
	}
	for _, p := range []int{1, 22, 80, 8080, 7076, 7078, 65535} {
		if err := CheckPort(p); err != nil {
			t.Errorf("CheckPort(%d) = %v, want nil", p, err)
		}
	}
}

// FuzzParse: no Host or path makes Parse panic, and every route it accepts
// names a sandbox ID that is one DNS label and a port that may be proxied.
func FuzzParse(f *testing.F) {
	for _, s := range [][2]string{
		{"8080-sb-a.localhost:8089", "/"}, {"127.0.0.1", "/sandboxes/sb-a/ports/80/x"},
		{"7077-sb-a.x", "/"}, {"x", "/sandboxes/sb-a/ports/65536"}, {"[::1]:1", "/sandboxes//ports/1/"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, host, path string) {
		r, err := Parse(host, "localhost", path)
		if err != nil {
			return
		}
		if !idRE.MatchString(r.Sandbox) || CheckPort(r.Port) != nil {
			t.Fatalf("Parse(%q, %q) = %+v: a bad sandbox or port accepted", host, path, r)
		}
		if !r.ByHost && r.Path != "" && !strings.HasPrefix(r.Path, "/") {
			t.Fatalf("Parse(%q, %q): path %q does not start with /", host, path, r.Path)
		}
	})
}
