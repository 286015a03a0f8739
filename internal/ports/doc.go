// Package ports serves preview URLs: a sandbox's TCP port reached from
// outside through the daemon's preview listener (`forkbox serve --ports`).
//
// A request names its sandbox and port in the Host header,
// "<port>-<sandbox id>.<anything>" (so http://8080-sb-abc.localhost:8089/
// works: *.localhost resolves to loopback), or in the path,
// "/sandboxes/<id>/ports/<port>/..." (the prefix is stripped), for
// non-browser clients that cannot set Host: every sandbox shares that
// origin, so the path form takes no cookie (each request carries the token)
// and no response may register a service worker above its own path. HTTP and WebSocket go through a reverse proxy; raw
// TCP goes through an HTTP CONNECT tunnel to the same routes.
//
// A third form, the header X-Forkbox-Port-Route: <port>-<id>, routes ahead
// of both and leaves Host and path to the app as they came: the gateway's
// listener sends it when it relays a request to the preview listener of
// the sandbox's node (Target.RelayToken), with the node's port token of
// the sandbox in place of the caller's credentials.
//
// Every request carries the sandbox's port token: an HMAC-SHA256 of the
// sandbox ID under a daemon secret kept in the state dir, so a link can be
// shared for one sandbox (and one sandbox only: each fork child has its own)
// without handing out API access, and it survives daemon restarts. The API
// token, when the daemon has one, is accepted too. The package proxies only
// to the address its Backend returns for a sandbox (its own address on the
// bridge), never to a host named by the request.
package ports
