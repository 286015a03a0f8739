package ports

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
)

// URLs are the ways to reach one sandbox port. Every URL carries the
// token; URL is the host form (the one to share, and the one for browsers),
// PathURL the path form, for non-browser clients: it takes no cookie, so
// each request carries the token (query or header).
type URLs struct {
	URL     string `json:"url"`
	Token   string `json:"token"`
	Host    string `json:"host"`
	HostURL string `json:"host_url"`
	PathURL string `json:"path_url"`
}

// DefaultDomain names preview hosts when no domain is configured: every
// *.localhost name resolves to loopback.
const DefaultDomain = "localhost"

// BuildURLs returns the URLs of port of sandbox id on a listener bound to
// listenAddr, with preview host names below domain.
func BuildURLs(listenAddr, domain, id string, port int, token string) URLs {
	if domain == "" {
		domain = DefaultDomain
	}
	lhost, lport, err := net.SplitHostPort(listenAddr)
	if err != nil {
		lhost, lport = listenAddr, "80"
	}
	pathHost := domain
	if domain == DefaultDomain {
		pathHost = lhost
		if a, err := netip.ParseAddr(lhost); err == nil && a.IsUnspecified() {
			pathHost = "127.0.0.1"
		}
	}
	q := "?" + QueryParam + "=" + url.QueryEscape(token)
	host := net.JoinHostPort(fmt.Sprintf("%d-%s.%s", port, id, domain), lport)
	u := URLs{Token: token, Host: host}
	u.HostURL = "http://" + host + "/" + q
	u.PathURL = "http://" + net.JoinHostPort(pathHost, lport) + fmt.Sprintf("%s%s/ports/%d/", PathPrefix, id, port) + q
	u.URL = u.HostURL
	return u
}
