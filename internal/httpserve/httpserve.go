// Package httpserve makes the http.Servers of forkbox's listeners with the
// bounds a listener that callers can reach needs: a caller has 10 s to send
// a request's headers, and a connection with no request in flight (an
// HTTP/2 one with no stream open) is closed after 2 minutes. Without the
// second, a caller that sent one request (a refused one will do) and kept
// the connection held a descriptor of the daemon for as long as it liked.
package httpserve

import (
	"net/http"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/h2c"
)

const (
	// ReadHeaderTimeout bounds the time to read a request's headers.
	ReadHeaderTimeout = 10 * time.Second
	// IdleTimeout bounds a connection's time with no request in flight.
	IdleTimeout = 2 * time.Minute
)

// New returns a server of h over HTTP/1.1 and, with h2c, HTTP/2 without
// TLS (prior knowledge or upgrade), as the Connect API and the E2B
// endpoint serve.
func New(h http.Handler, withH2C bool) *http.Server {
	return newServer(h, withH2C, IdleTimeout)
}

func newServer(h http.Handler, withH2C bool, idle time.Duration) *http.Server {
	if withH2C {
		// h2c serves HTTP/2 connections itself: the http.Server's idle
		// timeout does not reach them.
		h = h2c.NewHandler(h, &http2.Server{IdleTimeout: idle})
	}
	return &http.Server{Handler: h, ReadHeaderTimeout: ReadHeaderTimeout, IdleTimeout: idle}
}
