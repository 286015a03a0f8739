package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"github.com/forkbox/forkbox/client"
)

// runPty runs o on a terminal in sb (exec -t): the local terminal in raw
// mode (Ctrl-C is a byte for the remote terminal, not a signal here), its
// size sent at start and on SIGWINCH, stdin forwarded when input is set.
// It returns the remote exit code; the local terminal is restored first.
func runPty(ctx context.Context, sb *client.Sandbox, o client.ExecOptions, input bool) (*client.ExecResult, error) {
	inFd, outFd := int(os.Stdin.Fd()), int(os.Stdout.Fd())
	size := func() (int, int) {
		if w, h, err := term.GetSize(outFd); err == nil && w > 0 && h > 0 {
			return h, w
		}
		return 0, 0
	}
	env := map[string]string{}
	if t := os.Getenv("TERM"); t != "" {
		env["TERM"] = t
	}
	for k, v := range o.Env {
		env[k] = v
	}
	rows, cols := size()
	var outMu sync.Mutex
	p, err := sb.Pty(ctx, client.PtyOptions{Command: o.Argv, Env: env, Cwd: o.Cwd, Timeout: o.Timeout, Rows: rows, Cols: cols,
		OnData: func(b []byte) {
			outMu.Lock()
			os.Stdout.Write(b)
			outMu.Unlock()
		}})
	if err != nil {
		return nil, err
	}
	defer p.Close()
	if input && term.IsTerminal(inFd) {
		state, err := term.MakeRaw(inFd)
		if err != nil {
			p.Kill()
			return nil, fmt.Errorf("terminal raw mode: %w", err)
		}
		defer term.Restore(inFd, state)
	}

	// Every return stops and joins the goroutines below.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var wake, wakeR *os.File
	defer func() {
		close(stop)
		if wake != nil {
			wake.Close() // forwardInput returns
		}
		wg.Wait()
		if wakeR != nil {
			wakeR.Close()
		}
	}()
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	defer signal.Stop(winch)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-winch:
				if r, c := size(); r > 0 {
					p.Resize(r, c)
				}
			}
		}
	}()
	if input {
		r, w, err := os.Pipe()
		if err != nil {
			p.Kill()
			return nil, err
		}
		wake, wakeR = w, r
		wg.Add(1)
		go func() {
			defer wg.Done()
			forwardInput(inFd, int(r.Fd()), !term.IsTerminal(inFd), p.SendInput)
		}()
	}
	return p.Wait()
}

// forwardInput reads fd and sends what it reads until wakeFd becomes
// readable (or closed), fd ends or send fails. At the end of a stdin that is
// not a terminal it sends ^D, the end of input for the remote terminal.
func forwardInput(fd, wakeFd int, eot bool, send func([]byte) error) {
	buf := make([]byte, 32<<10)
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}, {Fd: int32(wakeFd), Events: unix.POLLIN}}
	for {
		fds[0].Revents, fds[1].Revents = 0, 0
		if _, err := unix.Poll(fds, -1); err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return
		}
		if fds[1].Revents != 0 {
			return
		}
		if fds[0].Revents == 0 {
			continue
		}
		n, err := unix.Read(fd, buf)
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
			continue
		}
		if n <= 0 {
			if eot {
				send([]byte{4})
			}
			return
		}
		if send(buf[:n]) != nil {
			return
		}
	}
}
