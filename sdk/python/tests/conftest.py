"""A throwaway forkbox daemon for the SDK tests, started the way
e2e/main_test.go and the TypeScript tests start one: its own state, run dir
and socket in a temp dir, and its own bridge, nftables table, veth prefix,
subnet and cgroup parent, named after this process so that the suite runs
beside other test runs. It also listens on TCP (127.0.0.1, a free port) with
a token. At the end every sandbox is closed, the daemon gets SIGTERM and
``forkbox uninstall --purge`` removes its host state.

Needs root, runsc, mkfs.btrfs, go and make; without them the daemon tests are
skipped, unless CI=true, where that is a failure. FORKBOX_PY_LOG=1 prints the
daemon log at the end.
"""

from __future__ import annotations

import io
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, List, Optional

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(HERE.parent))

import forkbox  # noqa: E402

BIN = REPO / "bin" / "forkbox"
RUN_ID = f"{os.getpid() & 0xffff:04x}"
NET_FLAGS = [
    "--bridge",
    f"fbxpy{RUN_ID}",
    "--net-table",
    f"forkbox_py_{RUN_ID}",
    "--veth-prefix",
    f"p{RUN_ID}",
    "--subnet",
    f"10.218.{1 + os.getpid() % 250}.0/24",
    "--cgroup-parent",
    f"forkbox-py-{RUN_ID}",
    "--btrfs-size",
    "8Gi",
]
READY_SECONDS = 60.0
#: The daemon's own bound on live sandboxes: small, so that a test can make
#: a fork's children fail one by one (ResourceExhausted) while the others start.
MAX_SANDBOXES = 10


def prerequisite() -> str:
    """What this machine lacks for the daemon tests, or ""."""
    if os.geteuid() != 0:
        return "needs root"
    for b in ("runsc", "mkfs.btrfs", "go", "make"):
        if shutil.which(b) is None:
            return f"{b} is not installed (run ./scripts/setup.sh)"
    return ""


@dataclass
class Daemon:
    dir: Path
    socket: str
    log: Path
    flags: List[str]
    tcp_url: str
    token: str
    proc: Optional[subprocess.Popen] = None
    image: str = ""
    clients: List[forkbox.Client] = field(default_factory=list)

    def where(self) -> dict:
        """The client arguments that reach this daemon: its socket, or for a
        gateway (TCP only) its URL and token."""
        if self.socket:
            return {"socket": self.socket}
        return {"url": self.tcp_url, "token": self.token}

    def client(self, **kw) -> forkbox.Client:
        """A new client of this daemon (closed at the end)."""
        if "url" not in kw:
            kw = {**self.where(), **kw}
        c = forkbox.Client(**kw)
        self.clients.append(c)
        return c

    def tail(self, n: int = 4096) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(d: Daemon) -> None:
    """Waits, bounded, until the daemon answers on its socket."""
    c = forkbox.Client(socket=d.socket)
    deadline = time.monotonic() + READY_SECONDS
    try:
        while time.monotonic() < deadline:
            if d.proc is not None and d.proc.poll() is not None:
                break
            try:
                c.list_sandboxes()
                return
            except forkbox.ForkboxError:
                # Not listening yet: poll the socket again shortly (a bounded
                # wait for readiness, not a synchronisation by sleeping).
                time.sleep(0.05)
    finally:
        c.close()
    raise RuntimeError(f"daemon did not answer on {d.socket}:\n{d.tail()}")


def _teardown(d: Daemon) -> None:
    if d.proc is not None and d.proc.poll() is None:
        try:
            c = forkbox.Client(socket=d.socket)
            for s in c.list_sandboxes():
                try:
                    c.get_sandbox(s.id).close()
                except forkbox.ForkboxError:
                    pass
            c.close()
        except forkbox.ForkboxError:
            pass
        d.proc.send_signal(signal.SIGTERM)
        try:
            d.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            d.proc.kill()
            d.proc.wait()
    for c in d.clients:
        c.close()
    if os.environ.get("FORKBOX_PY_LOG"):
        sys.stderr.write(d.tail(1 << 20))
    r = subprocess.run(
        [str(BIN), "uninstall", "--purge", *d.flags],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    if r.returncode != 0:
        sys.stderr.write(f"forkbox uninstall: {r.stderr}\n")
    shutil.rmtree(d.dir, ignore_errors=True)


def _gateway() -> Iterator[Daemon]:
    """The suite against a running ``forkbox serve --gateway`` instead of a
    daemon of its own (e2e/cluster's TestGatewayPythonSDK sets these):
    FORKBOX_TEST_GATEWAY (http://host:port), FORKBOX_TEST_TOKEN and
    FORKBOX_TEST_IMAGE. There is no local socket then; the sandboxes left at
    the end are closed."""
    tmp = Path(tempfile.mkdtemp(prefix="forkbox-py-gw-"))
    d = Daemon(
        dir=tmp,
        socket="",
        log=tmp / "none.log",
        flags=[],
        tcp_url=os.environ["FORKBOX_TEST_GATEWAY"],
        token=os.environ.get("FORKBOX_TEST_TOKEN", ""),
        image=os.environ.get("FORKBOX_TEST_IMAGE", ""),
    )
    try:
        yield d
    finally:
        c = d.client()
        for s in c.list_sandboxes():
            try:
                c.get_sandbox(s.id).close()
            except forkbox.ForkboxError:
                pass
        for c in d.clients:
            c.close()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def daemon() -> Iterator[Daemon]:
    if os.environ.get("FORKBOX_TEST_GATEWAY"):
        yield from _gateway()
        return
    why = prerequisite()
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"prerequisite missing in CI: {why}")
        pytest.skip(why)
    build = subprocess.run(
        ["make", "-s", "build"], cwd=REPO, stdin=subprocess.DEVNULL, capture_output=True, text=True
    )
    if build.returncode != 0:
        pytest.fail(f"make build failed:\n{build.stdout}{build.stderr}", pytrace=False)
    tmp = Path(tempfile.mkdtemp(prefix="forkbox-py-"))
    sock = str(tmp / "forkbox.sock")
    flags = [
        "--state-dir",
        str(tmp / "state"),
        "--run-dir",
        str(tmp / "run"),
        "--socket",
        sock,
        *NET_FLAGS,
    ]
    d = Daemon(
        dir=tmp,
        socket=sock,
        log=tmp / "daemon.log",
        flags=flags,
        tcp_url=f"http://127.0.0.1:{_free_port()}",
        token=secrets.token_hex(16),
    )
    with open(d.log, "ab") as out:
        d.proc = subprocess.Popen(
            [
                str(BIN),
                "serve",
                *flags,
                "--tcp",
                d.tcp_url[len("http://") :],
                "--api-token",
                d.token,
                "--max-sandboxes",
                str(MAX_SANDBOXES),
                "--ports",
                "127.0.0.1:0",
                "--log-level",
                "debug",
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
        )
    try:
        _wait_ready(d)
        archive = tmp / "busybox.tar"
        subprocess.run(
            ["go", "run", "./tools/mkimage", "-o", str(archive)],
            cwd=REPO,
            check=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        d.image = d.client().import_image(str(archive)).name
        yield d
    finally:
        _teardown(d)


@pytest.fixture
def client(daemon: Daemon) -> forkbox.Client:
    return daemon.client()


@pytest.fixture
def image(daemon: Daemon) -> str:
    return daemon.image


RES = {"cpu": "1", "memory": "256Mi"}


class Capture(io.RawIOBase):
    """A binary writer that keeps what is written to it, and counts the writes."""

    def __init__(self) -> None:
        super().__init__()
        self.chunks: List[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:  # type: ignore[override]
        self.chunks.append(bytes(b))
        return len(b)

    def text(self) -> str:
        return b"".join(self.chunks).decode()
