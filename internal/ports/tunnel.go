package ports

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// tunnel answers a CONNECT: it dials the sandbox's port (or opens a
// tunnel through the relay), says 200, and copies bytes both ways until
// one side closes, the tunnel idles for TunnelIdle, or ctx ends (the
// handler's Close).
func (h *Handler) tunnel(ctx context.Context, w http.ResponseWriter, r *http.Request, t target) {
	d := net.Dialer{Timeout: h.o.DialTimeout}
	back, err := d.DialContext(ctx, "tcp", t.Addr)
	if err != nil {
		fail(w, http.StatusBadGateway, t.unreachable())
		return
	}
	defer back.Close()
	if t.RelayToken != "" {
		if code, msg := h.relayConnect(ctx, back, t); code != http.StatusOK {
			fail(w, code, msg)
			return
		}
	}
	front, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		fail(w, http.StatusHTTPVersionNotSupported, "CONNECT tunnels need HTTP/1.1")
		return
	}
	defer front.Close()
	front.SetDeadline(time.Time{}) // the server's header deadline no longer applies
	if _, err := io.WriteString(front, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	// Bytes the client sent after its request, already read by the server.
	if n := brw.Reader.Buffered(); n > 0 {
		b, _ := brw.Reader.Peek(n)
		if _, err := back.Write(b); err != nil {
			return
		}
	}
	closeBoth := func() { front.Close(); back.Close() }
	stop := context.AfterFunc(ctx, closeBoth)
	defer stop()
	var wg sync.WaitGroup
	wg.Add(2)
	half := func(dst, src net.Conn) {
		defer wg.Done()
		if h.pipe(dst, src) {
			if cw, ok := dst.(interface{ CloseWrite() error }); ok {
				cw.CloseWrite() // pass the end on; the other way may still carry bytes
				return
			}
		}
		closeBoth()
	}
	go half(back, front)
	go half(front, back)
	wg.Wait()
}

// pipe copies src to dst; a read that waits longer than TunnelIdle ends it.
// It reports whether src ended cleanly (EOF).
func (h *Handler) pipe(dst, src net.Conn) (eof bool) {
	buf := make([]byte, 32<<10)
	for {
		src.SetReadDeadline(time.Now().Add(h.o.TunnelIdle))
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return false
			}
		}
		if err != nil {
			return err == io.EOF
		}
	}
}

// Bounds on the relay's answer to a CONNECT.
const (
	relayAnswerTimeout = 30 * time.Second
	relayAnswerBytes   = 64 << 10
)

// relayConnect asks the relay on back for a tunnel to t's route with the
// relay's token; it returns 200, or the status and message to answer the
// caller with. The relay's answer is bounded in time and size.
func (h *Handler) relayConnect(ctx context.Context, back net.Conn, t target) (int, string) {
	back.SetDeadline(time.Now().Add(relayAnswerTimeout))
	defer back.SetDeadline(time.Time{})
	stop := context.AfterFunc(ctx, func() { back.SetDeadline(time.Now()) })
	defer stop()
	if _, err := fmt.Fprintf(back, "CONNECT %s/ HTTP/1.1\r\nHost: %s\r\n%s: %s\r\n%s: %s\r\n\r\n",
		t.route.pathPrefix(), t.Addr, RouteHeader, t.route.HeaderValue(), Header, t.RelayToken); err != nil {
		return http.StatusBadGateway, t.unreachable()
	}
	// Read byte by byte (at most relayAnswerBytes): what follows the
	// answer is the tunnel's, and must not be buffered away here.
	resp, err := http.ReadResponse(bufio.NewReaderSize(&byteReader{r: io.LimitReader(back, relayAnswerBytes)}, 16), &http.Request{Method: http.MethodConnect})
	if err != nil {
		return http.StatusBadGateway, fmt.Sprintf("the preview listener in front of sandbox %s (%s) gave no answer: %v", t.route.Sandbox, t.Addr, err)
	}
	if resp.StatusCode == http.StatusOK {
		return http.StatusOK, ""
	}
	msg := resp.Status
	if n := resp.ContentLength; n > 0 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, min(n, 1024)))
		msg = strings.TrimPrefix(strings.TrimSpace(string(b)), "forkbox: ")
	}
	return resp.StatusCode, msg
}

// byteReader reads one byte at a time, so that a bufio.Reader over it
// never reads ahead more than the byte it is asked for.
type byteReader struct{ r io.Reader }

func (b *byteReader) Read(p []byte) (int, error) {
	if len(p) > 1 {
		p = p[:1]
	}
	return b.r.Read(p)
}
