package mcpserver

import (
	"strings"
	"unicode/utf8"
)

// tail is an io.Writer that keeps the last max bytes written to it and
// remembers whether it dropped any.
type tail struct {
	max       int
	buf       []byte
	truncated bool
}

func (t *tail) Write(p []byte) (int, error) {
	n := len(p)
	if len(p) >= t.max {
		t.truncated = t.truncated || len(p) > t.max || len(t.buf) > 0
		t.buf = append(t.buf[:0], p[len(p)-t.max:]...)
		return n, nil
	}
	if over := len(t.buf) + len(p) - t.max; over > 0 {
		t.truncated = true
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	t.buf = append(t.buf, p...)
	return n, nil
}

// String is the kept bytes as text. When the front was dropped, the rest of
// a UTF-8 character cut in two is skipped; other invalid bytes become U+FFFD (JSON
// text must be valid UTF-8).
func (t *tail) String() string {
	b := t.buf
	if t.truncated {
		for i := 0; i < utf8.UTFMax-1 && len(b) > 0 && !utf8.RuneStart(b[0]); i++ {
			b = b[1:]
		}
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}
