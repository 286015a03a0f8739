package main

import (
	"bufio"
	"io"
	"os"
	"strconv"
	"strings"
)

// daemonExecPhases is the message of the daemon's per-exec debug line:
// its attributes ending in _ms are the exec's phases.
const daemonExecPhases = "exec phases"

// logSize is the daemon log's size now (0 without a log).
func (b *bench) logSize() int64 {
	if b.daemonLog == "" {
		return 0
	}
	st, err := os.Stat(b.daemonLog)
	if err != nil {
		return 0
	}
	return st.Size()
}

// daemonPhases summarizes the phases of the exec lines the daemon logged
// for sandbox id after offset from.
func (b *bench) daemonPhases(from int64, id string) map[string]Summary {
	if b.daemonLog == "" {
		return nil
	}
	f, err := os.Open(b.daemonLog)
	if err != nil {
		return nil
	}
	defer f.Close()
	if _, err := f.Seek(from, io.SeekStart); err != nil {
		return nil
	}
	return parsePhases(f, id)
}

// parsePhases reads slog text lines and collects, per attribute ending in
// _ms, the values of the daemonExecPhases lines of sandbox id.
func parsePhases(r io.Reader, id string) map[string]Summary {
	vals := map[string][]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, `msg="`+daemonExecPhases+`"`) || !strings.Contains(line, "sandbox="+id) {
			continue
		}
		for _, f := range strings.Fields(line) {
			k, v, ok := strings.Cut(f, "=")
			if !ok || !strings.HasSuffix(k, "_ms") {
				continue
			}
			if x, err := strconv.ParseFloat(v, 64); err == nil {
				vals[strings.TrimSuffix(k, "_ms")] = append(vals[strings.TrimSuffix(k, "_ms")], x)
			}
		}
	}
	if len(vals) == 0 {
		return nil
	}
	out := map[string]Summary{}
	for k, xs := range vals {
		out[k] = summarize(xs)
	}
	return out
}
