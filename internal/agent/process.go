package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/forkbox/forkbox/errdefs"
)

const (
	defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	defaultHome = "/root"
)

// baseEnv returns environ without FORKBOX_* variables, with PATH and HOME
// defaulted.
func baseEnv(environ []string) map[string]string {
	env := map[string]string{}
	for _, kv := range environ {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || strings.HasPrefix(k, "FORKBOX_") {
			continue
		}
		env[k] = v
	}
	if env["PATH"] == "" {
		env["PATH"] = defaultPath
	}
	if env["HOME"] == "" {
		env["HOME"] = defaultHome
	}
	return env
}

// mergeEnv lays over on base and returns it as a sorted KEY=VALUE list.
func mergeEnv(base, over map[string]string) ([]string, map[string]string, error) {
	m := make(map[string]string, len(base)+len(over))
	for k, v := range base {
		m[k] = v
	}
	for k, v := range over {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return nil, nil, fmt.Errorf("env %q: bad name or value: %w", k, errdefs.ErrInvalidArgument)
		}
		m[k] = v
	}
	list := make([]string, 0, len(m))
	for k, v := range m {
		list = append(list, k+"="+v)
	}
	sort.Strings(list)
	return list, m, nil
}

// argv returns the command line of req.
func (req *ExecRequest) argv() ([]string, error) {
	if len(req.Argv) > 0 {
		for _, a := range req.Argv {
			if strings.ContainsRune(a, 0) {
				return nil, fmt.Errorf("argv contains NUL: %w", errdefs.ErrInvalidArgument)
			}
		}
		return req.Argv, nil
	}
	if req.Shell != "" {
		return []string{"/bin/sh", "-c", req.Shell}, nil
	}
	return nil, fmt.Errorf("exec: empty argv and shell: %w", errdefs.ErrInvalidArgument)
}

// lookPath finds file in the PATH list path, as execvp does.
func lookPath(file, path string) (string, error) {
	if strings.Contains(file, "/") {
		return file, nil
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, file)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("exec %q: executable file not found in PATH: %w", file, errdefs.ErrNotFound)
}

// startProcess forks req in its own process group with stdio from files,
// registered with the reaper.
func (s *Server) startProcess(req *ExecRequest, files [3]*os.File) (int, <-chan syscall.WaitStatus, error) {
	argv, err := req.argv()
	if err != nil {
		return 0, nil, err
	}
	env, envMap, err := mergeEnv(s.baseEnv, req.Env)
	if err != nil {
		return 0, nil, err
	}
	bin, err := lookPath(argv[0], envMap["PATH"])
	if err != nil {
		return 0, nil, err
	}
	cwd := req.Cwd
	if cwd == "" {
		cwd = "/"
	}
	if !filepath.IsAbs(cwd) {
		return 0, nil, fmt.Errorf("cwd %q: must be absolute: %w", cwd, errdefs.ErrInvalidArgument)
	}
	if fi, err := os.Stat(cwd); err != nil {
		return 0, nil, osErr("cwd", cwd, err)
	} else if !fi.IsDir() {
		return 0, nil, fmt.Errorf("cwd %q: not a directory: %w", cwd, errdefs.ErrInvalidArgument)
	}
	attr := &syscall.ProcAttr{
		Dir:   cwd,
		Env:   env,
		Files: []uintptr{files[0].Fd(), files[1].Fd(), files[2].Fd()},
		Sys:   &syscall.SysProcAttr{Setpgid: true},
	}
	pid, ch, err := s.reaper.spawn(func() (int, error) {
		return syscall.ForkExec(bin, argv, attr)
	})
	if err != nil {
		return 0, nil, osErr("exec", bin, err)
	}
	s.watch.started(pid)
	if s.oomAdjusted {
		// The agent runs at -1000, which children inherit; user processes get 0.
		_ = os.WriteFile("/proc/"+strconv.Itoa(pid)+"/oom_score_adj", []byte("0"), 0)
	}
	return pid, ch, nil
}
