"""The SDK without a daemon: the output tail, the data conversions, error
classes, and the Connect transport against a small fake server on a unix
socket (unary errors, stream envelopes, an end-of-stream error, a cut stream,
a bearer token), plus an unreachable and a forbidden socket."""

from __future__ import annotations

import base64
import io
import json
import os
import socketserver
import struct
import subprocess
import sys
import tempfile
import threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest

import forkbox
from forkbox._models import Event, FileInfo, SandboxInfo, step_to_json
from forkbox.environment import _Definition, max_age_seconds
from forkbox.errors import from_class_name, from_connect_code
from forkbox.execution import TailBuffer, merged


# ---------------------------------------------------------------- TailBuffer


def test_tail_keeps_everything_under_the_bound() -> None:
    t = TailBuffer(10)
    t.push(0, b"abc")
    t.push(1, b"def")
    assert t.text() == "abcdef"
    assert not t.truncated


def test_tail_keeps_the_last_bytes() -> None:
    t = TailBuffer(5)
    for i, s in enumerate([b"abc", b"def", b"ghi"]):
        t.push(i, s)
    assert t.text() == "efghi"
    assert t.truncated
    big = TailBuffer(4)
    big.push(0, b"ab")
    big.push(1, b"0123456789")
    assert (big.text(), big.truncated) == ("6789", True)
    exact = TailBuffer(4)
    exact.push(0, b"1234")
    assert (exact.text(), exact.truncated) == ("1234", False)


def test_tail_zero_keeps_nothing_and_none_keeps_all() -> None:
    none = TailBuffer(0)
    none.push(0, b"abc")
    assert (none.text(), none.truncated) == ("", True)
    everything = TailBuffer(None)
    for i in range(1000):
        everything.push(i, b"0123456789")
    assert len(everything.text()) == 10000
    assert not everything.truncated


def test_tail_does_not_start_with_half_a_character() -> None:
    t = TailBuffer(5)
    t.push(0, "aé€b".encode())  # 1 + 2 + 3 + 1 bytes: the tail starts inside "é"
    assert t.text() == "€b"


def test_tail_stays_bounded_over_many_small_chunks() -> None:
    t = TailBuffer(100)
    for i in range(100_000):
        t.push(i, b"x")
    assert len(t.chunks) == 100
    assert t.text() == "x" * 100


def test_merged_restores_arrival_order() -> None:
    out, err = TailBuffer(100), TailBuffer(100)
    out.push(0, b"a")
    err.push(1, b"b")
    out.push(2, b"c")
    assert [(c.stream, c.data) for c in merged(out, err)] == [
        ("stdout", b"a"),
        ("stderr", b"b"),
        ("stdout", b"c"),
    ]


# ---------------------------------------------------------------- models and errors


def test_models_convert_proto_json() -> None:
    info = SandboxInfo.from_json(
        {
            "id": "sb-1",
            "name": "n",
            "state": "running",
            "createdAtUnixMs": "1700000000123",
            "resources": {"cpu": "1", "memory": "512Mi", "pids": "1024"},
            "credentials": ["A"],
            "env": {"K": "V"},
        }
    )
    assert info.created_at == datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=timezone.utc)
    assert info.resources == forkbox.Resources(cpu="1", memory="512Mi", pids=1024)
    assert (info.credentials, info.env, info.parent_id) == (["A"], {"K": "V"}, "")
    ev = Event.from_json(
        {
            "seq": "3",
            "type": "sandbox.checkpoint_created",
            "timeUnixMs": "1000",
            "dataJson": '{"tag": "t"}',
        }
    )
    assert (ev.seq, ev.data, ev.time) == (
        3,
        {"tag": "t"},
        datetime(1970, 1, 1, 0, 0, 1, tzinfo=timezone.utc),
    )
    f = FileInfo.from_json({"name": "d", "dir": True, "size": "0"})
    assert f.is_dir and f.modified_at is None
    assert step_to_json("make") == {"run": "make"}
    assert step_to_json(forkbox.WriteFile("/a", "hi", 0o600)) == {
        "writePath": "/a",
        "writeContent": "aGk=",
        "writeMode": 0o600,
    }
    assert forkbox.Resources.of({"cpu": "2"}) == forkbox.Resources(cpu="2")
    with pytest.raises(forkbox.InvalidArgumentError):
        forkbox.Resources.of({"memroy": "1Gi"})


@pytest.mark.parametrize(
    "code,cls",
    [
        ("not_found", forkbox.NotFoundError),
        ("already_exists", forkbox.AlreadyExistsError),
        ("invalid_argument", forkbox.InvalidArgumentError),
        ("failed_precondition", forkbox.FailedPreconditionError),
        ("resource_exhausted", forkbox.ResourceExhaustedError),
        ("unavailable", forkbox.UnavailableError),
        ("permission_denied", forkbox.PermissionDeniedError),
        ("unauthenticated", forkbox.UnauthenticatedError),
        ("deadline_exceeded", forkbox.DeadlineExceededError),
        ("canceled", forkbox.CanceledError),
        ("unimplemented", forkbox.UnimplementedError),
        ("internal", forkbox.InternalError),
        ("something_new", forkbox.UnknownError),
    ],
)
def test_connect_codes_map_to_error_classes(code: str, cls: type) -> None:
    e = from_connect_code(code, "msg")
    assert type(e) is cls, f"got {type(e).__name__}, want {cls.__name__}"
    assert isinstance(e, forkbox.ForkboxError)
    assert str(e) == "msg"
    # The class name, as a fork child's error_class carries it, gives the same class.
    assert type(from_class_name(e.code, "m")) is cls


def test_max_age_and_setup_hash() -> None:
    assert [max_age_seconds(v) for v in (None, 90, "90", "30m", "12h", "7d")] == [
        0,
        90,
        90,
        1800,
        43200,
        604800,
    ]
    with pytest.raises(forkbox.InvalidArgumentError):
        max_age_seconds("soon")

    def one(sb: forkbox.Sandbox) -> None:
        sb.exec("echo one").wait()

    def two(sb: forkbox.Sandbox) -> None:
        sb.exec("echo two").wait()

    kw = dict(
        resources=None, env=None, cwd=None, runtime=None, egress=None, max_age=None, pool_size=0
    )
    h1 = _Definition("e", "img", setup=one, **kw).json["setupHash"]
    assert h1 == _Definition("e", "img", setup=one, **kw).json["setupHash"]
    assert h1 != _Definition("e", "img", setup=two, **kw).json["setupHash"]
    assert h1 != _Definition("e", "img2", setup=one, **kw).json["setupHash"]
    assert "setupHash" not in _Definition("e", "img", setup=["make"], **kw).json


def test_start_command_json() -> None:
    kw = dict(resources=None, env=None, cwd=None, runtime="gvisor", egress=None, max_age=None, pool_size=0)
    d = _Definition("web", "img", setup=["make"], start="httpd -f -p 8080", **kw).json
    assert d["start"] == {"run": "httpd -f -p 8080", "readyPort": 0, "readyCommand": "", "readyTimeoutMs": "0"}
    d = _Definition("web", "img", setup=None, start={"run": "srv", "ready_port": 8080, "ready_timeout_ms": 5000}, **kw).json
    assert d["start"]["readyPort"] == 8080 and d["start"]["readyTimeoutMs"] == "5000"
    assert "start" not in _Definition("web", "img", setup=None, **kw).json
    for bad in ({"ready_port": 8080}, {"run": "x", "port": 1}, ""):
        with pytest.raises(forkbox.InvalidArgumentError):
            _Definition("web", "img", setup=None, start=bad, **kw)


# ---------------------------------------------------------------- transport against a fake server


def envelope(flags: int, doc: Dict) -> bytes:
    payload = json.dumps(doc).encode()
    return struct.pack(">BI", flags, len(payload)) + payload


class FakeServer:
    """An HTTP/1.1 server on a unix socket answering each path with a canned
    (status, content type, body, cut) and recording the requests."""

    def __init__(self, routes: Dict[str, Tuple[int, str, bytes]]) -> None:
        self.routes = routes
        self.requests: List[Tuple[str, Dict[str, str], bytes]] = []
        self.dir = tempfile.mkdtemp(prefix="forkbox-py-fake-")
        self.path = os.path.join(self.dir, "fake.sock")
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                fake.requests.append((self.path, dict(self.headers), body))
                status, ctype, data = fake.routes[self.path]
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
            daemon_threads = True

            def get_request(self):  # type: ignore[no-untyped-def]
                conn, _ = self.socket.accept()
                return conn, ("local", 0)

        self.server = Server(self.path, Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()
        os.unlink(self.path)
        os.rmdir(self.dir)


@pytest.fixture
def fake() -> Iterator[FakeServer]:
    srv = FakeServer({})
    yield srv
    srv.close()


S = "/forkbox.v1.SandboxService/"


def test_unary_call_and_token(fake: FakeServer) -> None:
    fake.routes[S + "GetSandbox"] = (
        200,
        "application/json",
        b'{"sandbox": {"id": "sb-1", "name": "x"}}',
    )
    c = forkbox.Client(socket=fake.path, token="T0K")
    sb = c.get_sandbox("x")
    assert (sb.id, sb.name) == ("sb-1", "x")
    path, headers, body = fake.requests[-1]
    assert path == S + "GetSandbox"
    assert headers["Authorization"] == "Bearer T0K"
    assert headers["Content-Type"] == "application/json"
    assert json.loads(body) == {"sandbox": "x"}
    sb2 = c.get_sandbox("y")  # a second call reuses the kept-alive connection
    assert sb2.id == "sb-1"
    c.close()


def test_unary_errors(fake: FakeServer) -> None:
    fake.routes[S + "GetSandbox"] = (
        404,
        "application/json",
        b'{"code": "not_found", "message": "sandbox \\"x\\": not found"}',
    )
    fake.routes[S + "ListSandboxes"] = (502, "text/plain", b"bad gateway")
    c = forkbox.Client(socket=fake.path)
    with pytest.raises(forkbox.NotFoundError, match='sandbox "x": not found'):
        c.get_sandbox("x")
    with pytest.raises(forkbox.UnavailableError, match="bad gateway"):
        c.list_sandboxes()


def test_stream_messages_then_end_stream_error(fake: FakeServer) -> None:
    body = envelope(0, {"phase": "unpack", "done": "1", "total": "2"}) + envelope(
        2, {"error": {"code": "resource_exhausted", "message": "disk full"}}
    )
    fake.routes["/forkbox.v1.ImageService/ImportImage"] = (200, "application/connect+json", body)
    seen: List[forkbox.ImageProgress] = []
    with pytest.raises(forkbox.ResourceExhaustedError, match="disk full"):
        forkbox.Client(socket=fake.path).import_image("/x.tar", on_progress=seen.append)
    assert [(p.phase, p.done, p.total) for p in seen] == [("unpack", 1, 2)]
    _, headers, req = fake.requests[-1]
    assert headers["Content-Type"] == "application/connect+json"
    flags, size = struct.unpack(">BI", req[:5])
    assert (flags, json.loads(req[5 : 5 + size])) == (0, {"path": "/x.tar", "name": ""})


def test_exec_stream_and_cut_stream(fake: FakeServer) -> None:
    ok = (
        envelope(0, {"stdout": "aGkK"})
        + envelope(0, {"stderr": "b29wcwo="})
        + envelope(0, {"exit": {"exitCode": 3, "durationMs": 1.5}})
        + envelope(2, {})
    )
    fake.routes[S + "Exec"] = (200, "application/connect+json", ok)
    c = forkbox.Client(socket=fake.path)
    sb = forkbox.Sandbox(c, SandboxInfo(id="sb-1", name="x", state="running"), False)
    r = sb.exec("echo hi; echo oops >&2; exit 3").wait(check=False)
    assert (r.stdout, r.stderr, r.exit_code, r.duration_ms, r.ok) == (
        "hi\n",
        "oops\n",
        3,
        1.5,
        False,
    )
    with pytest.raises(forkbox.ExecError) as ei:
        sb.exec("x").wait()
    assert ei.value.exit_code == 3 and "exited with code 3: oops" in str(ei.value)
    # No end-of-stream envelope: the stream was cut, not finished.
    fake.routes[S + "Exec"] = (200, "application/connect+json", envelope(0, {"stdout": "aGkK"}))
    with pytest.raises(forkbox.UnavailableError, match="end-of-stream"):
        sb.exec("echo hi").wait()


def test_pipe_decodes_utf8_split_between_chunks(fake: FakeServer) -> None:
    b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
    body = (
        envelope(0, {"stdout": b64(b"caf\xc3")})
        + envelope(0, {"stdout": b64(b"\xa9\n")})
        + envelope(0, {"exit": {}})
        + envelope(2, {})
    )
    fake.routes[S + "Exec"] = (200, "application/connect+json", body)
    c = forkbox.Client(socket=fake.path)
    sb = forkbox.Sandbox(c, SandboxInfo(id="sb-1", name="x", state="running"), False)
    text, raw = io.StringIO(), io.BytesIO()
    r = sb.exec("printf café").pipe(text).pipe(raw).wait()
    assert (text.getvalue(), raw.getvalue(), r.stdout) == ("café\n", "café\n".encode(), "café\n")


def test_pipe_ends_a_character_cut_by_the_end(fake: FakeServer) -> None:
    """Output that ends inside a UTF-8 character reaches a text writer as
    U+FFFD, as in the result, whether pipe() came before or after the end."""
    b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
    body = envelope(0, {"stdout": b64(b"ab\xe2\x82")}) + envelope(0, {"exit": {}}) + envelope(2, {})
    fake.routes[S + "Exec"] = (200, "application/connect+json", body)
    c = forkbox.Client(socket=fake.path)
    sb = forkbox.Sandbox(c, SandboxInfo(id="sb-1", name="x", state="running"), False)
    before = io.StringIO()
    ex = sb.exec("printf 'ab\\342\\202'").pipe(before)
    r = ex.wait()
    after = io.StringIO()
    ex.pipe(after)
    assert (before.getvalue(), after.getvalue(), r.stdout) == ("ab\ufffd",) * 3


def test_pipe_writer_may_cancel_at_the_end(fake: FakeServer) -> None:
    """A writer given to pipe() runs without the execution's lock held, also
    when the end of the output is written to it: one that calls cancel()
    there does not deadlock."""
    b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
    body = envelope(0, {"stdout": b64(b"ab\xe2\x82")}) + envelope(0, {"exit": {}}) + envelope(2, {})
    fake.routes[S + "Exec"] = (200, "application/connect+json", body)
    c = forkbox.Client(socket=fake.path)
    sb = forkbox.Sandbox(c, SandboxInfo(id="sb-1", name="x", state="running"), False)
    holder: list = []

    class Canceling(io.StringIO):
        def write(self, s: str) -> int:
            if "\ufffd" in s:
                holder[0].cancel()
            return super().write(s)

    done = threading.Event()

    def run() -> None:
        ex = sb.exec("x")
        holder.append(ex)
        ex.pipe(Canceling())
        try:
            ex.wait()
        except forkbox.ForkboxError:
            pass
        done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(30), "deadlocked: the writer's cancel() waited for the lock held around it"


def test_unreachable_socket_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(forkbox.UnavailableError):
        forkbox.Client(socket=str(tmp_path / "nope.sock")).list_sandboxes()
    with pytest.raises(forkbox.InvalidArgumentError):
        forkbox.Client(url="ftp://host")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (to run a client as nobody)")
def test_forbidden_socket_is_permission_denied(fake: FakeServer) -> None:
    os.chmod(fake.dir, 0o755)
    os.chmod(fake.path, 0o600)  # root's only: nobody gets EACCES on connect
    pkg = str(Path(forkbox.__file__).parent.parent)
    script = (
        "import sys; sys.path.insert(0, %r); import forkbox\n"
        "try:\n    forkbox.Client(socket=%r).list_sandboxes(); print('ok')\n"
        "except forkbox.ForkboxError as e:\n    print(type(e).__name__)\n"
    ) % (pkg, fake.path)
    r = subprocess.run(
        [sys.executable, "-c", script],
        user=65534,
        group=65534,
        capture_output=True,
        text=True,
        cwd="/",
        env={"PATH": os.environ.get("PATH", ""), "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "PermissionDeniedError"
