package agent

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The hostname service of a pre-booted gVisor sandbox's placeholder. A
// sandbox's containers share one UTS namespace, whose hostname only the
// placeholder may set (it alone holds CAP_SYS_ADMIN), and one network
// stack; so the placeholder's hold listens on an abstract unix socket, and
// a tenant's agent that cannot set the hostname itself (at a fork notice)
// asks it to. One request per connection: the name and a newline; the
// answer is "ok" or "error: ..." and a newline.
//
// Any process of the tenant can reach the socket too, and can then only
// rename its own sandbox (within the kernel's 64 bytes): its hostname is
// no boundary. The service answers a few connections at once, each bounded
// in size and time, so a tenant that holds them open delays only its own
// renames (the daemon then renames it with runsc exec).

// HoldSocket is the placeholder's socket (abstract: "@" prefix).
const HoldSocket = "@forkbox-hold"

// MaxHostname is the kernel's limit (HOST_NAME_MAX).
const MaxHostname = 64

// holdTimeout bounds one request to the placeholder, both sides.
const holdTimeout = 2 * time.Second

// ValidHostname checks a hostname to set.
func ValidHostname(name string) error {
	if name == "" || len(name) > MaxHostname || strings.ContainsAny(name, "\n\x00") {
		return fmt.Errorf("sethostname: want one name of 1 to %d bytes", MaxHostname)
	}
	return nil
}

// holdConns bounds the requests the service answers at once.
const holdConns = 4

// SetHostname sets the hostname of this UTS namespace to a valid name.
func SetHostname(name string) error {
	if err := ValidHostname(name); err != nil {
		return err
	}
	return unix.Sethostname([]byte(name))
}

// ServeHostnames answers hostname requests on l until it fails.
func ServeHostnames(l net.Listener) error {
	sem := make(chan struct{}, holdConns)
	for {
		sem <- struct{}{}
		c, err := l.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer func() { <-sem }()
			answerHostname(c)
		}()
	}
}

func answerHostname(c net.Conn) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(holdTimeout))
	line, err := bufio.NewReader(io.LimitReader(c, MaxHostname+1)).ReadString('\n')
	if err == io.EOF && len(line) > MaxHostname {
		err = fmt.Errorf("request longer than %d bytes", MaxHostname+1)
	}
	if err == nil {
		err = SetHostname(strings.TrimSuffix(line, "\n"))
	}
	if err != nil {
		fmt.Fprintf(c, "error: %v\n", err)
		return
	}
	io.WriteString(c, "ok\n")
}

// setHostnameViaHold asks the placeholder to set the hostname.
func setHostnameViaHold(name string) error { return askHostname(HoldSocket, name) }

// askHostname asks the hostname service at addr to set the hostname.
func askHostname(addr, name string) error {
	if err := ValidHostname(name); err != nil {
		return err
	}
	c, err := net.DialTimeout("unix", addr, holdTimeout)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(holdTimeout))
	if _, err := io.WriteString(c, name+"\n"); err != nil {
		return err
	}
	line, err := bufio.NewReader(io.LimitReader(c, 512)).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "ok\n" {
		return errors.New("placeholder: " + strings.TrimSpace(line))
	}
	return nil
}
