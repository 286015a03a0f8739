package cgroups

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// OOMKills returns how many processes the kernel's OOM killer has killed in
// the cgroup at path: v1 memory.oom_control, v2 memory.events ("oom_kill").
func OOMKills(path string) (int64, error) {
	files := []string{
		filepath.Join(Root, "memory", path, "memory.oom_control"),
		filepath.Join(Root, path, "memory.events"),
	}
	var lastErr error
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			lastErr = err
			continue
		}
		defer fh.Close()
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "oom_kill "); ok {
				return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			}
		}
		return 0, nil
	}
	return 0, lastErr
}
