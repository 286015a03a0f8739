"""Client: a connection to a forkbox daemon over its unix socket (or TCP with a
bearer token), and the client-side concurrency slots."""

from __future__ import annotations

import base64
import os
import threading
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Union

from ._models import (
    Checkpoint,
    EnvironmentInfo,
    Event,
    Image,
    ImageProgress,
    Overrides,
    ReplayedExec,
    Resources,
    Resumed,
    SandboxInfo,
    SandboxMetrics,
    SandboxPage,
    Step,
)
from ._pages import FULL_PAGE, pages
from ._transport import Transport
from .environment import Environment
from .errors import ResourceExhaustedError, UnavailableError
from .sandbox import Sandbox

#: Where the daemon listens by default.
DEFAULT_SOCKET = "/run/forkbox/forkbox.sock"

class Client:
    """A connection to a forkbox daemon. ``Client()`` talks to the local one.

    ``socket``: the daemon's unix socket (default: ``FORKBOX_HOST`` if it is
    ``unix:///path``, else /run/forkbox/forkbox.sock). ``url``:
    ``http://host:port`` of a TCP listener (default: ``FORKBOX_HOST`` if it is
    a URL); wins over socket. ``token``: its bearer token (default
    ``FORKBOX_TOKEN``). ``max_concurrency``: a bound on the live sandboxes
    this client holds (created, forked, restored, resumed or handed over by
    an environment, until closed); 0 means none. Over the bound is
    ResourceExhaustedError, before the daemon is called.

    The client is safe to share between threads. Use it as a context manager,
    or call close(), to drop its idle connections.
    """

    def __init__(
        self,
        *,
        socket: Optional[str] = None,
        url: Optional[str] = None,
        token: Optional[str] = None,
        max_concurrency: int = 0,
    ) -> None:
        if not socket and not url:
            host = os.environ.get("FORKBOX_HOST", "")
            if host.startswith("unix://"):
                socket = host[len("unix://") :]
            elif host:
                url = host
            else:
                socket = DEFAULT_SOCKET
        if token is None:
            token = os.environ.get("FORKBOX_TOKEN", "")
        self._transport = Transport(socket_path=None if url else socket, url=url, token=token)
        self.max_concurrency = max_concurrency
        self._in_use = 0
        self._slots = threading.Lock()

    # ------------------------------------------------------------ sandboxes

    def _call(self, method: str, message: Dict[str, Any]) -> Dict[str, Any]:
        return self._transport.unary("SandboxService", method, message)

    def _handle(self, info: Dict[str, Any]) -> Sandbox:
        return Sandbox(self, SandboxInfo.from_json(info or {}), self._limited)

    def sandbox(
        self,
        *,
        image: str,
        resources: Union[Resources, Mapping[str, Any], None] = None,
        name: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        egress: Optional[str] = None,
        runtime: Optional[str] = None,
        timeout: Optional[float] = None,
        on_timeout: Optional[str] = None,
        egress_allow: Optional[Sequence[str]] = None,
        egress_deny: Optional[Sequence[str]] = None,
    ) -> Sandbox:
        """Creates a sandbox and returns once it is ready for exec. Holds a
        slot until close(). ``resources`` is a Resources or a dict
        ``{"cpu": "1", "memory": "512Mi"}``; ``egress`` "none" (default),
        "all" or "allow"; ``egress_allow`` / ``egress_deny`` list names
        (``api.example.com``, ``*.example.com``) and CIDRs, deny winning
        (an allow list alone means egress "allow"); ``runtime`` "gvisor"
        (default) or "crun". ``timeout`` (seconds) ends the sandbox's life
        that long after creation, by ``on_timeout`` "close" (default) or
        "hibernate"; ``set_timeout()`` moves the deadline."""
        if timeout is not None and timeout < 0:
            raise ValueError("timeout must be >= 0 seconds")
        self._acquire(1)
        try:
            msg: Dict[str, Any] = {
                "image": image,
                "name": name or "",
                "env": dict(env or {}),
                "cwd": cwd or "",
                "egress": egress or "",
                "runtime": runtime or "",
                "timeoutMs": int((timeout or 0) * 1000),
                "onTimeout": on_timeout or "",
                "egressAllow": list(egress_allow or []),
                "egressDeny": list(egress_deny or []),
            }
            res = Resources.of(resources)
            if res is not None:
                msg["resources"] = res.to_json()
            r = self._call("CreateSandbox", msg)
        except BaseException:
            self._release(1)
            raise
        return self._handle(r.get("sandbox") or {})

    def get_sandbox(self, id_or_name: str) -> Sandbox:
        """A handle on an existing sandbox. It holds no slot of this client."""
        r = self._call("GetSandbox", {"sandbox": id_or_name})
        return Sandbox(self, SandboxInfo.from_json(r.get("sandbox") or {}), False)

    def metrics(self) -> List[SandboxMetrics]:
        """One reading of every live sandbox's counters (see Sandbox.metrics)."""
        r = self._call("GetSandboxMetrics", {})
        return [SandboxMetrics.from_json(m) for m in r.get("metrics") or []]

    def list_sandboxes(self, all: bool = False) -> List[SandboxInfo]:
        """Live sandboxes (``all``: closed ones too), oldest first: every page."""
        return list(self.iter_sandboxes(all=all, page_size=FULL_PAGE))

    def list_sandboxes_page(
        self, *, all: bool = False, page_size: int = 0, page_token: str = ""
    ) -> SandboxPage:
        """One page of sandboxes, oldest first: at most ``page_size`` (0 = the
        daemon's default, 100; at most 1,000) after ``page_token`` (the
        previous page's ``next_page_token``; "" = the first page). A token
        from another request, or made up, is InvalidArgumentError."""
        r = self._call("ListSandboxes", {"all": all, "pageSize": page_size, "pageToken": page_token})
        return SandboxPage(
            sandboxes=[SandboxInfo.from_json(s) for s in r.get("sandboxes") or []],
            next_page_token=r.get("nextPageToken") or "",
        )

    def iter_sandboxes(
        self, *, all: bool = False, page_size: int = 0, page_token: str = ""
    ) -> Iterator[SandboxInfo]:
        """Every sandbox, fetching a page at a time as the loop goes."""
        msg = {"all": all, "pageSize": page_size, "pageToken": page_token}
        for s in pages(self._call, "ListSandboxes", msg, "sandboxes"):
            yield SandboxInfo.from_json(s)

    def restore_snapshot(
        self,
        checkpoint_id: str,
        *,
        overrides: Union[Overrides, Mapping[str, Any], None] = None,
        credentials: Optional[Mapping[str, str]] = None,
    ) -> Sandbox:
        """Starts a new sandbox from a checkpoint, with a clean exec history."""
        self._acquire(1)
        try:
            msg: Dict[str, Any] = {
                "checkpoint": checkpoint_id,
                "credentials": dict(credentials or {}),
            }
            ov = Overrides.of(overrides)
            if ov is not None:
                msg["overrides"] = ov.to_json()
            r = self._call("RestoreSnapshot", msg)
        except BaseException:
            self._release(1)
            raise
        return self._handle(r.get("sandbox") or {})

    def resume(self, session: str) -> Sandbox:
        """Brings back a closed or crashed session (a sandbox ID or name):
        its last checkpoint is restored and the execs recorded after it are
        replayed. ``sb.resumed`` says which. No checkpoint is
        FailedPreconditionError."""
        self._acquire(1)
        try:
            r = self._call("Resume", {"session": session})
        except BaseException:
            self._release(1)
            raise
        sb = self._handle(r.get("sandbox") or {})
        ck = r.get("checkpoint")
        sb.resumed = Resumed(
            checkpoint=Checkpoint.from_json(ck) if ck else None,
            replayed=[ReplayedExec.from_json(x) for x in r.get("replayed") or []],
        )
        return sb

    def delete_checkpoint(self, checkpoint_id: str) -> None:
        self._call("DeleteCheckpoint", {"checkpoint": checkpoint_id})

    def events(self, id_or_name: str) -> List[Event]:
        """A sandbox's ledger (closed sandboxes too), oldest first."""
        msg = {"sandbox": id_or_name, "pageSize": FULL_PAGE}
        return [Event.from_json(e) for e in pages(self._call, "Events", msg, "events")]

    # ------------------------------------------------------------ environments

    def environment(
        self,
        name: str,
        *,
        image: str,
        setup: Union[
            Sequence[Union[Step, Mapping[str, Any]]], Callable[[Sandbox], Any], None
        ] = None,
        resources: Union[Resources, Mapping[str, Any], None] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        runtime: Optional[str] = None,
        egress: Optional[str] = None,
        max_age: Union[int, float, str, None] = None,
        pool_size: int = 0,
        start: Union[str, Mapping[str, Any], None] = None,
    ) -> Environment:
        """An environment: image + resources + setup, built once into a warm
        snapshot; ``env.sandbox()`` hands over a fork of it. ``setup`` is a
        list of steps (shell strings, ``WriteFile``) run by the daemon, or a
        callable ``setup(sb)`` run by this client against a builder sandbox;
        its source text is part of the environment's hash. ``max_age``:
        seconds or "30m", "12h", "7d". Nothing is called until sandbox() or
        build()."""
        return Environment(
            self,
            name,
            image=image,
            setup=setup,
            resources=resources,
            env=env,
            cwd=cwd,
            runtime=runtime,
            egress=egress,
            max_age=max_age,
            pool_size=pool_size,
            start=start,
        )

    def list_environments(self) -> List[EnvironmentInfo]:
        r = self._transport.unary("EnvironmentService", "ListEnvironments", {})
        return [EnvironmentInfo.from_json(e) for e in r.get("environments") or []]

    # ------------------------------------------------------------ images

    def import_image(
        self,
        path: Union[str, bytes],
        *,
        name: Optional[str] = None,
        on_progress: Optional[Callable[[ImageProgress], None]] = None,
    ) -> Image:
        """Imports an oci-archive or docker-archive: at a path on the daemon's
        host (local socket only), or the archive's bytes, sent in the request
        (any connection, a gateway too; at most 32 MiB: larger images go
        through a registry)."""
        msg: Dict[str, Any] = {"name": name or ""}
        if isinstance(path, (bytes, bytearray)):
            msg["archive"] = base64.b64encode(bytes(path)).decode("ascii")
        else:
            msg["path"] = path
        return self._drain("ImportImage", msg, on_progress)

    def pull_image(
        self,
        ref: str,
        *,
        insecure: bool = False,
        on_progress: Optional[Callable[[ImageProgress], None]] = None,
    ) -> Image:
        """Pulls an image from a registry."""
        return self._drain("PullImage", {"ref": ref, "insecure": insecure}, on_progress)

    def list_images(self) -> List[Image]:
        r = self._transport.unary("ImageService", "ListImages", {})
        return [Image.from_json(i) for i in r.get("images") or []]

    def remove_image(self, name: str) -> None:
        self._transport.unary("ImageService", "RemoveImage", {"name": name})

    def _drain(
        self,
        method: str,
        msg: Dict[str, Any],
        on_progress: Optional[Callable[[ImageProgress], None]],
    ) -> Image:
        img: Optional[Image] = None
        for m in self._transport.stream("ImageService", method, msg):
            p = ImageProgress.from_json(m)
            if p.image is not None:
                img = p.image
            if on_progress is not None:
                on_progress(p)
        if img is None:
            raise UnavailableError("image stream ended without an image")
        return img

    # ------------------------------------------------------------ slots

    @property
    def slots_in_use(self) -> int:
        """The number of this client's slots in use."""
        return self._in_use

    @property
    def _limited(self) -> bool:
        return self.max_concurrency > 0

    def _acquire(self, n: int, best_effort: bool = False) -> int:
        """Takes n slots, or raises ResourceExhaustedError. With best_effort,
        takes as many as are free (at least one) and returns how many."""
        if not self._limited:
            return n
        with self._slots:
            free = self.max_concurrency - self._in_use
            if best_effort and free > 0:
                n = min(n, free)
            if n > free:
                raise ResourceExhaustedError(
                    f"{n} sandbox slots needed, {free} of this client's "
                    f"{self.max_concurrency} free (max_concurrency)"
                )
            self._in_use += n
            return n

    def _release(self, n: int) -> None:
        if self._limited and n > 0:
            with self._slots:
                self._in_use -= n

    # ------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Drops the idle connections. Sandboxes are not closed."""
        self._transport.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<forkbox.Client {self._transport.where}>"
