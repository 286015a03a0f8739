package main

import (
	"bufio"
	"io"
	"os"
	"strconv"
	"strings"
)

// daemonExecPhases and daemonCreatePhases are the messages of the
// daemon's per-exec and per-create debug lines: their attributes ending in
// _ms are the call's phases.
const (
	daemonExecPhases   = "exec phases"
	daemonCreatePhases = "create phases"
)

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

// daemonPhases summarizes the phases of the msg lines the daemon logged
// after offset from, for sandbox id ("": any).
func (b *bench) daemonPhases(from int64, msg, id string) map[string]Summary {
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
	return parsePhases(f, msg, id)
}

// parsePhases reads slog text lines and collects, per attribute ending in
// _ms, the values of the msg lines of sandbox id ("": any).
func parsePhases(r io.Reader, msg, id string) map[string]Summary {
	vals := map[string][]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, `msg="`+msg+`"`) || (id != "" && !strings.Contains(line, "sandbox="+id+" ")) {
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
