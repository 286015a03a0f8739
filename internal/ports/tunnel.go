package ports

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// tunnel answers a CONNECT: it dials the sandbox's port, says 200, and
// copies bytes both ways until one side closes, the tunnel idles for
// TunnelIdle, or ctx ends (the handler's Close).
func (h *Handler) tunnel(ctx context.Context, w http.ResponseWriter, r *http.Request, addr string, route Route) {
	d := net.Dialer{Timeout: h.o.DialTimeout}
	back, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		fail(w, http.StatusBadGateway, fmt.Sprintf("nothing answers on port %d of sandbox %s", route.Port, route.Sandbox))
		return
	}
	defer back.Close()
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
