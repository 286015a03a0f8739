package gateway

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// The gateway's API takes only its bearer token, and its refusal closes
// the connection: a caller without the token keeps no descriptor of the
// gateway's for the listener's idle timeout.
func TestRequireToken(t *testing.T) {
	g := &Gateway{o: Options{Token: "t0k"}}
	h := g.requireToken(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) }))
	for _, tc := range []struct {
		auth string
		want int
	}{
		{"", http.StatusUnauthorized},
		{"Bearer t0", http.StatusUnauthorized},
		{"Bearer t0k", http.StatusOK},
	} {
		r := httptest.NewRequest(http.MethodPost, "/forkbox.v1.SandboxService/ListSandboxes", nil)
		if tc.auth != "" {
			r.Header.Set("Authorization", tc.auth)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		closes := w.Header().Get("Connection") == "close"
		if w.Code != tc.want || closes != (tc.want != http.StatusOK) {
			t.Errorf("Authorization %q: %d (closes %v), want %d closing only when refused", tc.auth, w.Code, closes, tc.want)
		}
	}
}
