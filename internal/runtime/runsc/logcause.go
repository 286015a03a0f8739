package runsc

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// What runsc's own log says went wrong. When the sandbox or its gofer
// fails to start, runsc's CLI reports only that the sandbox went away
// ("cannot read client sync file: waiting for sandbox to start: EOF"); the
// reason (a bind mount's source that is gone, say) is in the container's
// runsc log (--log), which the sandbox and gofer write too.

// maxLogScan bounds how much of a runsc log one failure reads.
const maxLogScan = 1 << 20

// logFile is container id's runsc log ("" when logs are off).
func (r *Runsc) logFile(id string) string {
	if r.opts.LogDir == "" {
		return ""
	}
	return filepath.Join(r.opts.LogDir, id+".log")
}

// logSize is how long the runsc log path is now (0 if there is none yet):
// where a command's own entries will start.
func logSize(path string) int64 {
	if path == "" {
		return 0
	}
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// logCause returns the first error runsc logged to path from offset on
// whose message msg does not already say, its first line cut to 400
// bytes; "" for none. runsc writes its log as JSON objects, one after
// another; anything else ends the scan.
func logCause(path string, from int64, msg string) string {
	if path == "" {
		return ""
	}
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if _, err := f.Seek(from, io.SeekStart); err != nil {
		return ""
	}
	dec := json.NewDecoder(io.LimitReader(f, maxLogScan))
	for {
		var e struct{ Msg, Level string }
		if dec.Decode(&e) != nil {
			return ""
		}
		line, _, _ := strings.Cut(strings.TrimSpace(e.Msg), "\n")
		if e.Level == "error" && line != "" && !strings.Contains(msg, line) {
			return shortLines(line, 400)
		}
	}
}
