package daemon

import (
	"context"
	"log/slog"
	"time"
)

// execPhases times the steps of one exec for the debug log (the bench's
// profile section reads them): each mark ends the step named there.
type execPhases struct {
	on    bool
	start time.Time
	last  time.Time
	attrs []slog.Attr
}

func (d *Daemon) newExecPhases(ctx context.Context) *execPhases {
	p := &execPhases{on: d.log.Enabled(ctx, slog.LevelDebug)}
	if p.on {
		p.start = time.Now()
		p.last = p.start
	}
	return p
}

// mark ends the step name, which began at the previous mark.
func (p *execPhases) mark(name string) {
	if !p.on {
		return
	}
	now := time.Now()
	p.attrs = append(p.attrs, slog.Float64(name+"_ms", msBetween(p.last, now)))
	p.last = now
}

// log writes the "exec phases" line with the total.
func (p *execPhases) log(ctx context.Context, log *slog.Logger, sandboxID string) {
	if !p.on {
		return
	}
	attrs := append([]slog.Attr{slog.String("sandbox", sandboxID), slog.Float64("total_ms", msBetween(p.start, time.Now()))}, p.attrs...)
	log.LogAttrs(ctx, slog.LevelDebug, "exec phases", attrs...)
}

func msBetween(t, now time.Time) float64 { return float64(now.Sub(t).Microseconds()) / 1000 }
