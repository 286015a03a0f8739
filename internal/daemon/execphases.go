package daemon

import (
	"context"
	"log/slog"
	"time"
)

// phases times the steps of one exec or create for the debug log (the
// bench's profile section reads the exec's): each mark ends the step named
// there.
type phases struct {
	on    bool
	msg   string
	start time.Time
	last  time.Time
	attrs []slog.Attr
}

func (d *Daemon) newExecPhases(ctx context.Context) *phases { return d.newPhases(ctx, "exec phases") }

// newPhases starts timing; log writes msg.
func (d *Daemon) newPhases(ctx context.Context, msg string) *phases {
	p := &phases{on: d.log.Enabled(ctx, slog.LevelDebug), msg: msg}
	if p.on {
		p.start = time.Now()
		p.last = p.start
	}
	return p
}

// mark ends the step name, which began at the previous mark.
func (p *phases) mark(name string) {
	if !p.on {
		return
	}
	now := time.Now()
	p.attrs = append(p.attrs, slog.Float64(name+"_ms", msBetween(p.last, now)))
	p.last = now
}

// log writes the line (its msg) with the total.
func (p *phases) log(ctx context.Context, log *slog.Logger, sandboxID string) {
	if !p.on {
		return
	}
	attrs := append([]slog.Attr{slog.String("sandbox", sandboxID), slog.Float64("total_ms", msBetween(p.start, time.Now()))}, p.attrs...)
	log.LogAttrs(ctx, slog.LevelDebug, p.msg, attrs...)
}

func msBetween(t, now time.Time) float64 { return float64(now.Sub(t).Microseconds()) / 1000 }
