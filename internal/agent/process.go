package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

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
		if !ok || strings.HasPrefix(k, EnvPrefix) {
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
	if strings.Contains(file, "/") && !filepath.IsAbs(file) {
		return file, nil // relative to the exec's cwd: execve tells
	}
	if strings.Contains(file, "/") {
		// Checked here, not left to execve: with a pids limit the exec
		// goes through the agent's helper, whose execve failure would be an
		// exit status rather than the error the caller should get.
		fi, err := os.Stat(file)
		if err != nil {
			return "", osErr("exec", file, err)
		}
		if !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
			return "", fmt.Errorf("exec %q: not an executable file: %w", file, errdefs.ErrPermissionDenied)
		}
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
// registered with the reaper and, as an exec, with the server: both before
// the watchdog can see the pid, so a kill is always attributed to it. The
// caller removes the returned exec (removeExec) once it is done with it.
// With tty, files[0] is a terminal that becomes the controlling terminal of
// the process, which leads a new session (and its process group).
func (s *Server) startProcess(req *ExecRequest, files [3]*os.File, tty bool) (*execState, <-chan syscall.WaitStatus, error) {
	argv, err := req.argv()
	if err != nil {
		return nil, nil, err
	}
	env, envMap, err := mergeEnv(s.baseEnv, req.Env)
	if err != nil {
		return nil, nil, err
	}
	bin, err := lookPath(argv[0], envMap["PATH"])
	if err != nil {
		return nil, nil, err
	}
	cwd := req.Cwd
	if cwd == "" {
		cwd = "/"
	}
	if !filepath.IsAbs(cwd) {
		return nil, nil, fmt.Errorf("cwd %q: must be absolute: %w", cwd, errdefs.ErrInvalidArgument)
	}
	if fi, err := os.Stat(cwd); err != nil {
		return nil, nil, osErr("cwd", cwd, err)
	} else if !fi.IsDir() {
		return nil, nil, fmt.Errorf("cwd %q: not a directory: %w", cwd, errdefs.ErrInvalidArgument)
	}
	if s.limiter != nil {
		// The helper sets RLIMIT_NPROC, then execs bin in place: the
		// process (pid, group, stdio) stays the one started here.
		bin, argv = s.limiter.argv(bin, argv)
	} else if s.cfg.PidsLimit > 0 {
		// Same, with the agent's own (Go) binary in helper mode.
		argv = append([]string{s.cfg.Helper, HelperExecLimited, strconv.FormatInt(s.cfg.PidsLimit, 10), bin}, argv...)
		bin = s.cfg.Helper
	}
	sys := &syscall.SysProcAttr{Setpgid: true}
	if tty {
		// setsid makes the process a session and group leader; TIOCSCTTY
		// on its fd 0 makes the terminal the session's controlling one.
		sys = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	}
	attr := &syscall.ProcAttr{
		Dir:   cwd,
		Env:   env,
		Files: []uintptr{files[0].Fd(), files[1].Fd(), files[2].Fd()},
		Sys:   sys,
	}
	// The watchdog kills under forkMu (see watchdog.check): it cannot
	// kill the child between the fork and its registration as an exec.
	var st *execState
	pid, ch, err := s.reaper.spawn(func() (int, error) {
		pid, err := syscall.ForkExec(bin, argv, attr)
		if err == nil {
			st = &execState{pid: pid, session: tty}
			s.addExec(st)
		}
		return pid, err
	})
	if err != nil {
		return nil, nil, osErr("exec", bin, err)
	}
	s.watch.started(pid)
	if s.oomAdjusted {
		// The agent runs at -1000, which children inherit; user processes get 0.
		_ = os.WriteFile("/proc/"+strconv.Itoa(pid)+"/oom_score_adj", []byte("0"), 0)
	}
	return st, ch, nil
}

// HelperExecLimited is the agent's helper mode that applies limits between
// fork and exec where the native helper is missing (see limithelper.go).
const HelperExecLimited = "exec-limited"

// ExecLimited is the helper: args are [nproc, bin, argv...]. It sets
// RLIMIT_NPROC to nproc (soft and hard) and execs bin with argv and the
// current environment. It returns only on error.
func ExecLimited(args []string) error {
	if len(args) < 3 {
		return fmt.Errorf("%s: want NPROC BIN ARGV...: %w", HelperExecLimited, errdefs.ErrInvalidArgument)
	}
	n, err := strconv.ParseUint(args[0], 10, 64)
	if err != nil || n == 0 {
		return fmt.Errorf("%s: bad limit %q: %w", HelperExecLimited, args[0], errdefs.ErrInvalidArgument)
	}
	if err := unix.Setrlimit(unix.RLIMIT_NPROC, &unix.Rlimit{Cur: n, Max: n}); err != nil {
		return fmt.Errorf("%s: setrlimit(RLIMIT_NPROC, %d): %v", HelperExecLimited, n, err)
	}
	// The agent runs at oom_score_adj -1000, which the child inherits: set
	// 0 here, before the command runs, so that no allocation of the command
	// escapes a sentry enforcing the memory limit (sentryoom.go); the agent
	// writes it too, after the fork.
	_ = os.WriteFile("/proc/self/oom_score_adj", []byte("0"), 0)
	err = syscall.Exec(args[1], args[2:], os.Environ())
	return osErr("exec", args[1], err)
}
