package network

import (
	"bufio"
	"context"
	"io"
	"net"
	"testing"
	"time"
)

// echoIn serves TCP and UDP echo on addr inside the netns at path.
func echoIn(t *testing.T, path, addr string) {
	t.Helper()
	var l net.Listener
	var pc net.PacketConn
	err := inNetns(path, func() (err error) {
		if l, err = net.Listen("tcp4", addr); err != nil {
			return err
		}
		pc, err = net.ListenPacket("udp4", addr)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close(); pc.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	go func() {
		buf := make([]byte, 64)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(buf[:n], from)
		}
	}()
}

// echoes reports whether c echoes a line back within the deadline.
func echoes(c net.Conn, r *bufio.Reader, within time.Duration) error {
	c.SetDeadline(time.Now().Add(within))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return err
	}
	if udp, ok := c.(*net.UDPConn); ok {
		buf := make([]byte, 64)
		_, err := udp.Read(buf)
		return err
	}
	_, err := r.ReadString('\n')
	return err
}

// TestPolicyChangeCutsFlows: connections a sandbox opened while its policy
// allowed them stop passing data once a change forbids them (their
// conntrack entries are deleted), and those it still allows go on.
func TestPolicyChangeCutsFlows(t *testing.T) {
	m := newTestManager(t, 20)
	outside, outIP := fakeUplink(t, 21)
	target := net.JoinHostPort(outIP.String(), "7")
	echoIn(t, outside, target)
	ctx := context.Background()
	pol, err := ParsePolicy("", []string{outIP.String()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sb := setupPolicy(t, m, "flows", pol)

	var tcp, udp net.Conn
	err = inNetns(sb.NSPath, func() (err error) {
		if tcp, err = net.DialTimeout("tcp4", target, 5*time.Second); err != nil {
			return err
		}
		udp, err = net.Dial("udp4", target)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	defer udp.Close()
	r := bufio.NewReader(tcp)
	for name, c := range map[string]net.Conn{"tcp": tcp, "udp": udp} {
		if err := echoes(c, r, 5*time.Second); err != nil {
			t.Fatalf("%s before any change: %v", name, err)
		}
	}

	// A change that still allows them: they go on.
	wider, err := ParsePolicy("", []string{outIP.String(), "192.0.2.0/24"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.SetPolicy(ctx, sb.ID, sb.IP, wider); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]net.Conn{"tcp": tcp, "udp": udp} {
		if err := echoes(c, r, 5*time.Second); err != nil {
			t.Errorf("%s after a change that still allows it: %v", name, err)
		}
	}

	// Egress none: no more data either way.
	if err := m.SetPolicy(ctx, sb.ID, sb.IP, Policy{Mode: EgressNone}); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]net.Conn{"tcp": tcp, "udp": udp} {
		if err := echoes(c, r, 3*time.Second); err == nil {
			t.Errorf("%s after SetPolicy none: still echoed", name)
		}
	}
}
