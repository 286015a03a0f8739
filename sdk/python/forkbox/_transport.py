"""The Connect protocol over HTTP/1.1, with the standard library only.

Unary calls are a JSON POST to ``/<package>.<Service>/<Method>`` whose
response body is the JSON message, or, on an error, a non-200 status with
``{"code": "not_found", "message": "..."}``. Server-streaming calls post one
enveloped JSON message (``application/connect+json``) and read enveloped
messages back: one flags byte, a 4-byte big-endian length, the payload. The
last envelope has flag 0x02 (end of stream) and carries
``{"error": {...}, "metadata": {...}}``; a body that ends without it is an
error (the stream was cut).

A transport is safe to use from several threads: every call takes an idle
keep-alive connection from a small pool, or opens one.
"""

from __future__ import annotations

import gzip
import http.client
import json
import socket
import struct
import threading
from typing import Any, Dict, Iterator, List, Optional, Tuple
from urllib.parse import urlsplit

from .errors import ForkboxError, from_connect_code, from_http_status, error_class

PACKAGE = "forkbox.v1"

#: Bound on one response message (a unary body or one stream envelope).
MAX_MESSAGE_BYTES = 128 << 20

#: How long connecting may take, in seconds (calls themselves are unbounded:
#: a fork of 100 children or an environment build can take minutes).
CONNECT_TIMEOUT = 10.0

_FLAG_COMPRESSED = 0x01
_FLAG_END_STREAM = 0x02
_POOL_SIZE = 8


class _UnixConnection(http.client.HTTPConnection):
    """An HTTP/1.1 connection over a unix socket."""

    def __init__(self, path: str) -> None:
        super().__init__("forkbox", timeout=CONNECT_TIMEOUT)
        self._path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(CONNECT_TIMEOUT)
            s.connect(self._path)
            s.settimeout(None)
        except BaseException:
            s.close()
            raise
        self.sock = s


class _TCPConnection(http.client.HTTPConnection):
    """An HTTP/1.1 connection over TCP: bounded connect, unbounded calls."""

    def connect(self) -> None:
        super().connect()
        self.sock.settimeout(None)


class _TLSConnection(http.client.HTTPSConnection):
    def connect(self) -> None:
        super().connect()
        self.sock.settimeout(None)


def _unreachable(where: str, err: BaseException) -> ForkboxError:
    if isinstance(err, PermissionError):
        # The socket exists but this process may not connect to it: not an
        # outage, and retrying will not help.
        return error_class("PermissionDenied")(
            f"permission denied connecting to the forkbox daemon at {where}: {err}"
        )
    return error_class("Unavailable")(f"forkbox daemon unreachable at {where}: {err}")


def _connect_error(body: bytes, status: int) -> ForkboxError:
    """The error of a non-200 Connect response."""
    try:
        doc = json.loads(body.decode("utf-8"))
        code = doc.get("code", "")
        msg = doc.get("message", "")
        if isinstance(code, str) and code:
            return from_connect_code(code, msg if isinstance(msg, str) else str(msg))
    except (ValueError, AttributeError):
        pass
    text = body.decode("utf-8", "replace").strip()[:500]
    return from_http_status(status, text or f"HTTP status {status}")


def _end_stream_error(payload: bytes) -> Optional[ForkboxError]:
    try:
        doc = json.loads(payload.decode("utf-8")) if payload else {}
    except ValueError as e:
        return error_class("Internal")(f"bad end-of-stream message: {e}")
    err = doc.get("error") if isinstance(doc, dict) else None
    if not err:
        return None
    return from_connect_code(str(err.get("code", "unknown")), str(err.get("message", "")))


class Transport:
    """Connect calls to one daemon, over a unix socket or TCP."""

    def __init__(
        self,
        socket_path: Optional[str] = None,
        url: Optional[str] = None,
        token: Optional[str] = None,
    ) -> None:
        if url:
            u = urlsplit(url)
            if u.scheme not in ("http", "https") or not u.hostname:
                raise error_class("InvalidArgument")(
                    f"url {url!r}: want http://host:port or https://host:port"
                )
            self._tls = u.scheme == "https"
            self._host = u.hostname
            self._port = u.port
            self._prefix = u.path.rstrip("/")
            self.where = url
        else:
            self._tls = False
            self._host = ""
            self._port = None
            self._prefix = ""
            self.where = socket_path or ""
        self._socket = None if url else socket_path
        self._token = token or ""
        self._idle: List[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._closed = False

    # ------------------------------------------------------------ connections

    def _new_connection(self) -> http.client.HTTPConnection:
        if self._socket is not None:
            return _UnixConnection(self._socket)
        if self._tls:
            return _TLSConnection(self._host, self._port, timeout=CONNECT_TIMEOUT)
        return _TCPConnection(self._host, self._port, timeout=CONNECT_TIMEOUT)

    def _take(self) -> Tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
        return self._new_connection(), False

    def _give_back(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < _POOL_SIZE:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        """Closes the idle connections. Calls still in flight finish."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for c in idle:
            c.close()

    def _headers(self, content_type: str) -> Dict[str, str]:
        h = {
            "Content-Type": content_type,
            "Connect-Protocol-Version": "1",
            "User-Agent": "forkbox-python",
        }
        if self._token:
            h["Authorization"] = f"Bearer {self._token}"
        return h

    def _send(
        self, path: str, body: bytes, content_type: str
    ) -> Tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """Posts body; retries once on a fresh connection when a pooled one
        turns out closed by the daemon before it answered."""
        headers = self._headers(content_type)
        while True:
            conn, reused = self._take()
            try:
                conn.request("POST", self._prefix + path, body=body, headers=headers)
                return conn, conn.getresponse()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as e:
                conn.close()
                if reused:
                    continue
                raise _unreachable(self.where, e) from e
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                raise _unreachable(self.where, e) from e

    # ------------------------------------------------------------ calls

    def unary(self, service: str, method: str, message: Dict[str, Any]) -> Dict[str, Any]:
        """One unary call: the response message as a dict."""
        path = f"/{PACKAGE}.{service}/{method}"
        conn, resp = self._send(path, json.dumps(message).encode("utf-8"), "application/json")
        try:
            body = _read_bounded(resp)
        except ForkboxError:
            conn.close()
            raise
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise _unreachable(self.where, e) from e
        if resp.will_close:
            conn.close()
        else:
            self._give_back(conn)
        if resp.status != 200:
            raise _connect_error(body, resp.status)
        try:
            doc = json.loads(body.decode("utf-8")) if body else {}
        except ValueError as e:
            raise error_class("Internal")(f"{method}: bad JSON in the response: {e}") from e
        return doc if isinstance(doc, dict) else {}

    def stream(self, service: str, method: str, message: Dict[str, Any]) -> "ServerStream":
        """A server-streaming call: iterate it for the messages, as dicts."""
        path = f"/{PACKAGE}.{service}/{method}"
        payload = json.dumps(message).encode("utf-8")
        body = struct.pack(">BI", 0, len(payload)) + payload
        conn, resp = self._send(path, body, "application/connect+json")
        if resp.status != 200:
            try:
                data = _read_bounded(resp)
            except (OSError, http.client.HTTPException, ForkboxError):
                data = b""
            conn.close()
            raise _connect_error(data, resp.status)
        return ServerStream(conn, resp, self.where)


def _read_bounded(resp: http.client.HTTPResponse) -> bytes:
    length = resp.getheader("Content-Length")
    if length is not None and length.isdigit() and int(length) > MAX_MESSAGE_BYTES:
        raise error_class("ResourceExhausted")(f"response of {length} bytes is over the bound")
    data = resp.read(MAX_MESSAGE_BYTES + 1)
    if len(data) > MAX_MESSAGE_BYTES:
        raise error_class("ResourceExhausted")(f"response over {MAX_MESSAGE_BYTES} bytes")
    # Drain to the end so the connection can be reused.
    resp.read()
    return data


class ServerStream:
    """The messages of one server-streaming call. Iterating yields each
    message as a dict and raises the call's error, if it ended with one.
    close() ends the call early (the daemon sees the client go away)."""

    def __init__(
        self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse, where: str
    ) -> None:
        self._conn = conn
        self._resp = resp
        self._where = where
        self._gzip = (resp.getheader("Connect-Content-Encoding") or "").lower() == "gzip"
        self._closed = False

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        try:
            while True:
                head = self._read(5)
                if not head:
                    raise error_class("Unavailable")(
                        "the stream ended without an end-of-stream message "
                        "(the connection was cut)"
                    )
                if len(head) < 5:
                    raise error_class("Unavailable")("the stream was cut inside a message header")
                flags, size = struct.unpack(">BI", head)
                if size > MAX_MESSAGE_BYTES:
                    raise error_class("ResourceExhausted")(
                        f"stream message of {size} bytes is over the bound"
                    )
                payload = self._read(size) if size else b""
                if len(payload) < size:
                    raise error_class("Unavailable")("the stream was cut inside a message")
                if flags & _FLAG_COMPRESSED:
                    if not self._gzip:
                        raise error_class("Internal")(
                            "compressed stream message without gzip encoding"
                        )
                    payload = gzip.decompress(payload)
                if flags & _FLAG_END_STREAM:
                    err = _end_stream_error(payload)
                    if err is not None:
                        raise err
                    return
                try:
                    doc = json.loads(payload.decode("utf-8"))
                except ValueError as e:
                    raise error_class("Internal")(f"bad JSON in a stream message: {e}") from e
                yield doc if isinstance(doc, dict) else {}
        finally:
            self.close()

    def _read(self, n: int) -> bytes:
        try:
            data = self._resp.read(n)
        except (OSError, ValueError, http.client.HTTPException) as e:
            if self._closed:
                raise error_class("Canceled")("the call was canceled") from e
            raise _unreachable(self._where, e) from e
        if len(data) < n and self._closed:
            raise error_class("Canceled")("the call was canceled")
        return data

    def close(self) -> None:
        """Ends the call; safe from another thread and more than once."""
        if self._closed:
            return
        self._closed = True
        sock = self._conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._conn.close()
