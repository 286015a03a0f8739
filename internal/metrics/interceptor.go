package metrics

import (
	"context"
	"strings"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/errdefs/errconnect"
)

// Interceptor returns the Connect interceptor that feeds m. Register it
// inside the interceptor that converts errors to Connect codes, so that it
// sees each error's class.
func (m *Metrics) Interceptor() connect.Interceptor { return interceptor{m} }

type interceptor struct{ m *Metrics }

// procedure shortens "/forkbox.v1.SandboxService/Fork" to
// "SandboxService/Fork"; the set is the API's, so the label is bounded.
func procedure(p string) string {
	return strings.TrimPrefix(p, "/forkbox.v1.")
}

func (i interceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		start := time.Now()
		resp, err := next(ctx, req)
		i.m.done(req.Spec().Procedure, time.Since(start), err)
		if err == nil && resp != nil {
			i.m.unary(req.Any(), resp.Any())
		}
		return resp, err
	}
}

func (i interceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (i interceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		start := time.Now()
		w := &watchConn{StreamingHandlerConn: conn}
		err := next(ctx, w)
		i.m.done(conn.Spec().Procedure, time.Since(start), err)
		if w.building {
			result := "ok"
			if err != nil {
				result = "error"
			}
			i.m.envBuilds.WithLabelValues(result).Inc()
		}
		return err
	}
}

// watchConn notes whether a BuildEnvironment stream ran a build (the
// builder's "create" phase) rather than finding the definition built.
type watchConn struct {
	connect.StreamingHandlerConn
	building bool
}

func (w *watchConn) Send(msg any) error {
	if p, ok := msg.(*v1.BuildProgress); ok && p.GetPhase() == "create" {
		w.building = true
	}
	return w.StreamingHandlerConn.Send(msg)
}

// done counts a call, its error class, and the latency of a successful
// create, fork, exec or checkpoint.
func (m *Metrics) done(proc string, d time.Duration, err error) {
	p := procedure(proc)
	m.requests.WithLabelValues(p).Inc()
	if err != nil {
		m.errors.WithLabelValues(p, className(err)).Inc()
		return
	}
	if op, ok := operations[proc]; ok {
		m.latency.WithLabelValues(op).Observe(d.Seconds())
	}
}

// className is err's class: a class the daemon gave it, else the class of
// a Connect error made by Connect itself (a message it could not decode, a
// panic its recovery answered with Internal).
func className(err error) string {
	if c := errdefs.ClassName(err); c != "Unknown" {
		return c
	}
	return errdefs.ClassName(errconnect.FromConnect(err))
}

// unary reads what a successful response says: fork fan-out and per-child
// results, pool hand-overs, builds.
func (m *Metrics) unary(req, resp any) {
	switch r := resp.(type) {
	case *v1.ForkResponse:
		m.forkSize.Observe(float64(len(r.GetChildren())))
		for _, c := range r.GetChildren() {
			if c.GetSandbox() != nil && c.GetError() == "" {
				m.forkKids.WithLabelValues("ok").Inc()
			} else {
				m.forkKids.WithLabelValues("error").Inc()
			}
		}
	case *v1.EnvironmentSandboxResponse:
		if r.GetFromPool() {
			m.poolHits.Inc()
		} else {
			m.poolMisses.Inc()
		}
		if r.GetBuilt() {
			m.envBuilds.WithLabelValues("ok").Inc()
		}
	case *v1.CompleteBuildResponse:
		if q, ok := req.(*v1.CompleteBuildRequest); ok {
			if q.GetOk() {
				m.envBuilds.WithLabelValues("ok").Inc()
			} else {
				m.envBuilds.WithLabelValues("error").Inc()
			}
		}
	}
}
