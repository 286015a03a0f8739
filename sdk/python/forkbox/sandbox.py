"""Sandbox: a handle on one live sandbox. A handle the client made (created,
forked, restored, resumed, handed over by an environment) holds one of the
client's concurrency slots until close()."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Mapping, Optional, Sequence, Union, overload

from ._models import (
    Checkpoint,
    Credential,
    Event,
    FileInfo,
    ForkChild,
    ForkEvent,
    ForkResult,
    Handover,
    Overrides,
    PortURL,
    Resumed,
    SandboxInfo,
    SandboxMetrics,
    b64decode,
    b64encode,
)
from ._pages import FULL_PAGE, pages
from .errors import InternalError, NotFoundError, ResourceExhaustedError, UnavailableError, from_class_name
from .execution import DEFAULT_MAX_OUTPUT_BYTES, Execution

if TYPE_CHECKING:
    from .client import Client


class Credentials:
    """A sandbox's credentials: values are stored sealed and never returned."""

    def __init__(self, sb: "Sandbox") -> None:
        self._sb = sb

    def set(
        self,
        name: str,
        value: str,
        *,
        env: Optional[str] = None,
        file: Optional[str] = None,
        per_fork: bool = False,
    ) -> Credential:
        """Sets a credential. It reaches every exec as the environment
        variable ``env``, and/or the file ``/run/secrets/<file>`` (a tmpfs:
        never in a snapshot); with neither, as the variable ``name``. Forks
        inherit it unless ``per_fork``: then every fork call must supply a
        value (``sb.fork(tag, credentials={name: value})``)."""
        if not env and not file:
            env = name
        cred = {"name": name, "env": env or "", "file": file or "", "perFork": per_fork}
        r = self._sb._call(
            "SetCredential", {"sandbox": self._sb.id, "value": value, "credential": cred}
        )
        return Credential.from_json(r.get("credential") or {})

    def list(self) -> List[Credential]:
        r = self._sb._call("ListCredentials", {"sandbox": self._sb.id})
        return [Credential.from_json(c) for c in r.get("credentials") or []]

    def delete(self, name: str) -> None:
        self._sb._call("DeleteCredential", {"sandbox": self._sb.id, "name": name})


class Sandbox:
    """A handle on one sandbox. Use it as a context manager to close it::

    with client.sandbox(image="...") as sb:
        sb.exec("make").wait()
    """

    def __init__(self, client: "Client", info: SandboxInfo, holds_slot: bool) -> None:
        self.client = client
        self.id = info.id
        #: What the daemon knows of the sandbox (as of the last call that returned it).
        self.info = info
        self.credentials = Credentials(self)
        #: Set by client.resume(): the checkpoint restored and the execs replayed.
        self.resumed: Optional[Resumed] = None
        #: Set by env.sandbox(): how this sandbox was handed over.
        self.handover: Optional[Handover] = None
        self._slot = holds_slot
        self._closed = False

    @property
    def name(self) -> str:
        return self.info.name

    def _call(self, method: str, message: Dict[str, Any]) -> Dict[str, Any]:
        return self.client._transport.unary("SandboxService", method, message)

    def _update(self, r: Dict[str, Any]) -> None:
        if r.get("sandbox"):
            self.info = SandboxInfo.from_json(r["sandbox"])

    # ------------------------------------------------------------ exec

    def exec(
        self,
        cmd: Union[str, Sequence[str]],
        *,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        stdin: Union[str, bytes, None] = None,
        timeout: Optional[float] = None,
        non_replayable: bool = False,
        max_output_bytes: Optional[int] = DEFAULT_MAX_OUTPUT_BYTES,
    ) -> Execution:
        """Starts a command and returns at once: a string runs with
        ``/bin/sh -c``, a list is argv. ``.wait()`` for the result (raises
        ExecError when it fails), ``.pipe(sys.stdout)`` to stream its output,
        ``for chunk in .stream()`` to read it.

        ``timeout`` (seconds) kills the command; ``non_replayable`` keeps it
        out of client.resume()'s replay; the result keeps the last
        ``max_output_bytes`` of each stream (None: all)."""
        return Execution(
            self.client._transport,
            self.id,
            cmd,
            env=env,
            cwd=cwd,
            stdin=stdin,
            timeout=timeout,
            non_replayable=non_replayable,
            max_output_bytes=max_output_bytes,
        )

    # ------------------------------------------------------------ fork

    @overload
    def fork(
        self,
        tag: Optional[str] = None,
        *,
        count: None = None,
        overrides: Union[Overrides, Mapping[str, Any], None] = None,
        credentials: Optional[Mapping[str, str]] = None,
        from_checkpoint: Optional[str] = None,
        best_effort: bool = False,
        memory: bool = False,
    ) -> "Sandbox":
        ...

    @overload
    def fork(
        self,
        tag: Optional[str] = None,
        *,
        count: int,
        overrides: Union[Overrides, Mapping[str, Any], None] = None,
        credentials: Optional[Mapping[str, str]] = None,
        from_checkpoint: Optional[str] = None,
        best_effort: bool = False,
        memory: bool = False,
    ) -> ForkResult:
        ...

    def fork(
        self,
        tag: Optional[str] = None,
        *,
        count: Optional[int] = None,
        overrides: Union[Overrides, Mapping[str, Any], None] = None,
        credentials: Optional[Mapping[str, str]] = None,
        from_checkpoint: Optional[str] = None,
        best_effort: bool = False,
        memory: bool = False,
    ) -> Union["Sandbox", ForkResult]:
        """Checkpoints the sandbox (``tag`` is stored in its ledger) and starts
        children from it; the source keeps running.

        Without ``count``: one child, returned as a Sandbox (its error is
        raised). With ``count=N`` (1 to 100): a :class:`ForkResult` whose
        ``children[i]`` holds a ``sandbox`` or the ``error`` that child got;
        one child failing does not fail the others. N children need N free
        slots; with ``best_effort``, as many as there are slots for start and
        the rest report ResourceExhaustedError.

        ``overrides`` replace what children inherit, ``credentials`` give the
        values of per-fork credentials, ``from_checkpoint`` forks an existing
        checkpoint instead of taking a new one, ``memory`` forks processes
        and memory too (gVisor)."""
        want = max(count if count is not None else 1, 1)
        n = self.client._acquire(want, best_effort)
        msg: Dict[str, Any] = {
            "sandbox": self.id,
            "count": n,
            "bestEffort": best_effort,
            "memory": memory,
        }
        if tag:
            msg["tag"] = tag
        ov = Overrides.of(overrides)
        if ov is not None:
            msg["overrides"] = ov.to_json()
        if credentials:
            msg["credentials"] = dict(credentials)
        if from_checkpoint:
            msg["fromCheckpoint"] = from_checkpoint
        try:
            r = self._call("Fork", msg)
        except BaseException:
            self.client._release(n)
            raise
        children: List[ForkChild] = []
        started = 0
        for c in r.get("children") or []:
            child = ForkChild(start_ms=float(c.get("startMs", 0)))
            if c.get("sandbox"):
                child.sandbox = Sandbox(
                    self.client, SandboxInfo.from_json(c["sandbox"]), self.client._limited
                )
                started += 1
            if c.get("error"):
                child.error = from_class_name(c.get("errorClass", ""), c["error"])
            children.append(child)
        for _ in range(n, want):
            children.append(
                ForkChild(
                    error=ResourceExhaustedError("no free slot of this client (max_concurrency)")
                )
            )
        self.client._release(n - started)
        ck = r.get("checkpoint")
        result = ForkResult(
            checkpoint=Checkpoint.from_json(ck) if ck else None,
            captured=r.get("captured", ""),
            capture_ms=float(r.get("captureMs", 0)),
            flush_ms=float(r.get("flushMs", 0)),
            total_ms=float(r.get("totalMs", 0)),
            children=children,
        )
        if count is not None:
            return result
        first = children[0] if children else None
        if first is None or first.sandbox is None:
            raise (
                first.error if first and first.error else InternalError("fork returned no child")
            )
        return first.sandbox

    # ------------------------------------------------------------ checkpoints

    def fork_stream(
        self,
        tag: Optional[str] = None,
        *,
        count: int = 1,
        overrides: Union[Overrides, Mapping[str, Any], None] = None,
        credentials: Optional[Mapping[str, str]] = None,
        from_checkpoint: Optional[str] = None,
        best_effort: bool = False,
        memory: bool = False,
    ) -> Iterator[ForkEvent]:
        """Like ``fork(tag, count=N)``, but a generator of the fork as it goes:
        a "captured" event, then a "child" event per child as soon as that
        child is ready (or has failed), so the first can be used before the
        last has started, then a "done" event. Leaving the loop early stops
        listening only: every child asked for still starts (close the ones
        received)::

            for ev in sb.fork_stream("t", count=20):
                if ev.type == "child" and ev.child.ok:
                    use(ev.child.sandbox)
        """
        want = max(count, 1)
        n = self.client._acquire(want, best_effort)
        held = n
        msg: Dict[str, Any] = {"sandbox": self.id, "count": n, "bestEffort": best_effort, "memory": memory}
        if tag:
            msg["tag"] = tag
        ov = Overrides.of(overrides)
        if ov is not None:
            msg["overrides"] = ov.to_json()
        if credentials:
            msg["credentials"] = dict(credentials)
        if from_checkpoint:
            msg["fromCheckpoint"] = from_checkpoint
        try:
            stream = self.client._transport.stream("SandboxService", "ForkStream", msg)
            done: Optional[ForkEvent] = None
            try:
                for m in stream:
                    if "captured" in m:
                        c = m["captured"]
                        ck = c.get("checkpoint")
                        yield ForkEvent(
                            type="captured",
                            checkpoint=Checkpoint.from_json(ck) if ck else None,
                            captured=c.get("captured", ""),
                            capture_ms=float(c.get("captureMs", 0)),
                            flush_ms=float(c.get("flushMs", 0)),
                            count=want,
                        )
                    elif "child" in m:
                        c = m["child"].get("child") or {}
                        child = ForkChild(start_ms=float(c.get("startMs", 0)))
                        held -= 1
                        if c.get("sandbox"):
                            child.sandbox = Sandbox(
                                self.client, SandboxInfo.from_json(c["sandbox"]), self.client._limited
                            )
                        else:
                            self.client._release(1)
                        if c.get("error"):
                            child.error = from_class_name(c.get("errorClass", ""), c["error"])
                        yield ForkEvent(type="child", index=int(m["child"].get("index", 0)), child=child)
                    elif "done" in m:
                        dn = m["done"]
                        done = ForkEvent(
                            type="done",
                            total_ms=float(dn.get("totalMs", 0)),
                            started=int(dn.get("started", 0)),
                            failed=int(dn.get("failed", 0)) + (want - n),
                        )
            finally:
                stream.close()
            for i in range(n, want):
                yield ForkEvent(
                    type="child",
                    index=i,
                    child=ForkChild(error=ResourceExhaustedError("no free slot of this client (max_concurrency)")),
                )
            if done is None:
                raise UnavailableError("fork stream ended without its totals")
            yield done
        finally:
            if held > 0:
                self.client._release(held)

    def checkpoint(self, tag: Optional[str] = None, *, memory: bool = False) -> Checkpoint:
        """Captures the sandbox's state under ``tag`` and records
        sandbox.checkpoint_created; ``memory`` captures processes too (gVisor)."""
        r = self._call("Checkpoint", {"sandbox": self.id, "tag": tag or "", "memory": memory})
        return Checkpoint.from_json(r.get("checkpoint") or {})

    def list_checkpoints(self) -> List[Checkpoint]:
        """The sandbox's checkpoints (forks' too), oldest first."""
        msg = {"sandbox": self.id, "pageSize": FULL_PAGE}
        return [Checkpoint.from_json(c) for c in pages(self._call, "ListCheckpoints", msg, "checkpoints")]

    # ------------------------------------------------------------ live state

    def pause(self) -> None:
        """Freezes the sandbox in place (processes stop, memory kept)."""
        self._update(self._call("PauseSandbox", {"sandbox": self.id}))

    def unpause(self) -> None:
        """Thaws a paused sandbox."""
        self._update(self._call("UnpauseSandbox", {"sandbox": self.id}))

    def port_url(self, port: int) -> PortURL:
        """The preview URLs of a port of the sandbox (see PortURL)."""
        return PortURL.from_json(self._call("GetPortURL", {"sandbox": self.id, "port": port}))

    def url(self, port: int) -> str:
        """The preview URL of a port, with the sandbox's token (the link to share)."""
        return self.port_url(port).url

    def get_host(self, port: int) -> str:
        """The preview host of a port, ``8080-sb-….localhost:8089``;
        requests to it need the token too."""
        return self.port_url(port).host

    def set_timeout(self, timeout: float) -> SandboxInfo:
        """Moves the sandbox's deadline to ``timeout`` seconds from now (0
        removes its own timeout; the daemon's --max-lifetime still holds).
        Returns the sandbox with its effective deadline (``expires_at``)."""
        if timeout < 0:
            raise ValueError("timeout must be >= 0 seconds")
        self._update(self._call("SetTimeout", {"sandbox": self.id, "timeoutMs": int(timeout * 1000)}))
        return self.info

    def set_egress(
        self,
        egress: Optional[str] = None,
        *,
        allow: Optional[Sequence[str]] = None,
        deny: Optional[Sequence[str]] = None,
    ) -> SandboxInfo:
        """Replaces the sandbox's egress policy while it runs: ``egress``
        "none", "all" or "allow" (default: "allow" if ``allow`` is given,
        else "none"); ``allow`` / ``deny`` list names and CIDRs, deny
        winning. Open connections the new policy forbids are cut."""
        msg: Dict[str, Any] = {
            "sandbox": self.id,
            "egress": egress or "",
            "egressAllow": list(allow or []),
            "egressDeny": list(deny or []),
        }
        self._update(self._call("SetEgress", msg))
        return self.info

    def metrics(self) -> SandboxMetrics:
        """One reading of the sandbox's counters: CPU, memory, disk,
        network and pids, with their limits."""
        r = self._call("GetSandboxMetrics", {"sandbox": self.id})
        ms = r.get("metrics") or []
        if not ms:
            raise InternalError(f"the daemon returned no metrics for {self.id}")
        return SandboxMetrics.from_json(ms[0])

    def hibernate(self) -> None:
        """Saves memory and processes to disk and releases them (gVisor); the
        next exec, or wake(), restores the sandbox with its state intact."""
        self._update(self._call("HibernateSandbox", {"sandbox": self.id}))

    def wake(self) -> None:
        """Restores a hibernated sandbox now."""
        self._update(self._call("WakeSandbox", {"sandbox": self.id}))

    # ------------------------------------------------------------ files

    def read_file(self, path: str) -> bytes:
        r = self._call("ReadFile", {"sandbox": self.id, "path": path})
        return b64decode(r.get("data"))

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        return self.read_file(path).decode(encoding)

    def write_file(self, path: str, data: Union[str, bytes], *, mode: int = 0) -> None:
        """Writes a file (a str as UTF-8; mode 0 means 0644)."""
        b = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        self._call(
            "WriteFile", {"sandbox": self.id, "path": path, "data": b64encode(b), "mode": mode}
        )

    def list_files(self, path: str) -> List[FileInfo]:
        r = self._call("ListFiles", {"sandbox": self.id, "path": path})
        return [FileInfo.from_json(f) for f in r.get("files") or []]

    # ------------------------------------------------------------ the rest

    def events(self) -> List[Event]:
        """The sandbox's ledger, oldest first."""
        return self.client.events(self.id)

    def refresh(self) -> SandboxInfo:
        """Reloads ``info``."""
        self._update(self._call("GetSandbox", {"sandbox": self.id}))
        return self.info

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Closes the sandbox (nothing of it is left on the host) and frees
        its slot. Closing again, or a sandbox already gone, is a no-op."""
        if self._closed:
            return
        try:
            self._call("DeleteSandbox", {"sandbox": self.id})
        except NotFoundError:
            pass
        self._closed = True
        if self._slot:
            self._slot = False
            self.client._release(1)

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Sandbox {self.id} {self.name!r} {self.info.state}>"
