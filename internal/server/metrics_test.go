package server

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/metrics"
)

func TestWebListenRules(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	m := metrics.New(metrics.Options{})
	for _, c := range []struct {
		name  string
		web   Web
		token string
		ok    bool
	}{
		{"ui without a token", Web{Metrics: m, UIAddr: "127.0.0.1:0"}, "", false},
		{"ui with a token", Web{Metrics: m, UIAddr: "127.0.0.1:0"}, "t", true},
		{"metrics on loopback without a token", Web{Metrics: m, MetricsAddr: "127.0.0.1:0"}, "", true},
		{"metrics on every address without a token", Web{Metrics: m, MetricsAddr: ":0"}, "", false},
		{"metrics on every address with a token", Web{Metrics: m, MetricsAddr: ":0"}, "t", true},
		{"metrics without a registry", Web{MetricsAddr: "127.0.0.1:0"}, "t", false},
	} {
		srvs, err := c.web.listen(c.token, http.NotFoundHandler(), log)
		for _, s := range srvs {
			s.Shutdown(context.Background())
		}
		if c.ok && err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
		if !c.ok && !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: got %v, want InvalidArgument", c.name, err)
		}
	}
}

// TestMetricsListenerToken: with a token, the --metrics listener wants it.
func TestMetricsListenerToken(t *testing.T) {
	web := Web{Metrics: metrics.New(metrics.Options{}), MetricsAddr: "127.0.0.1:0"}
	h := web.metricsHandler("t")
	for _, c := range []struct {
		auth string
		want int
	}{{"", 401}, {"Bearer nope", 401}, {"Bearer t", 200}} {
		req, _ := http.NewRequest("GET", "/metrics", nil)
		if c.auth != "" {
			req.Header.Set("Authorization", c.auth)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != c.want {
			t.Errorf("Authorization %q: got %d, want %d", c.auth, rec.Code, c.want)
		}
		if c.want == 200 && !strings.Contains(rec.Body.String(), "forkbox_operation_duration_seconds") {
			t.Errorf("metrics body lacks forkbox_operation_duration_seconds")
		}
	}
}
