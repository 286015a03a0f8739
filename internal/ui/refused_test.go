package ui

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A refused request's answer closes its connection, for the API's JSON and
// for a browser's page alike: a caller without the token does not keep a
// descriptor of the daemon's for the listener's idle timeout.
func TestUnauthorizedClosesConnection(t *testing.T) {
	srv, _ := server(t)
	addr := strings.TrimPrefix(srv.URL, "http://")
	for _, accept := range []string{"application/json", "text/html"} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(time.Minute)) // against a hang
		fmt.Fprintf(c, "GET /ui/ HTTP/1.1\r\nHost: x\r\nAccept: %s\r\n\r\n", accept)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != http.StatusUnauthorized || !resp.Close {
			t.Errorf("%s: %d (close %v), want 401 closing the connection", accept, resp.StatusCode, resp.Close)
		}
		if _, err := br.ReadByte(); err != io.EOF {
			t.Errorf("%s: after the refusal the connection stays open (%v)", accept, err)
		}
		c.Close()
	}
}
