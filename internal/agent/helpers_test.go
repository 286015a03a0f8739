package agent

import (
	"bufio"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
)

func itoa(i int) string { return strconv.Itoa(i) }

func readFileString(path string) (string, error) {
	b, err := os.ReadFile(path)
	return strings.TrimSpace(string(b)), err
}

// fakeAgent listens on loopback and, for every connection, reads the
// request's header frame and hands the connection and its reader to serve
// (in a goroutine of its own), closing the connection after. It returns
// the address; the listener closes with the test.
func fakeAgent(t *testing.T, serve func(conn net.Conn, br *bufio.Reader)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				br := bufio.NewReader(conn)
				if _, err := readFrame(br); err != nil {
					return
				}
				serve(conn, br)
			}()
		}
	}()
	return ln.Addr().String()
}
