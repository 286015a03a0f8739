"""exec: one command in a sandbox, streamed.

``sb.exec(cmd)`` starts the command at once, like ``subprocess.Popen``, and
returns an :class:`Execution`. One background thread per execution reads the
daemon's stream: it keeps the last ``max_output_bytes`` of each output stream
for the result, and hands every chunk to the writers given to ``pipe()`` and
to the iterators of ``stream()``, as it is produced.
"""

from __future__ import annotations

import codecs
import io
import queue
import threading
from collections import deque
from typing import (
    IO,
    Any,
    Callable,
    Deque,
    Dict,
    Generator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Union,
)

from ._models import ExecChunk, ExecResult, b64decode, b64encode
from ._transport import ServerStream, Transport
from .errors import CanceledError, ExecError, ForkboxError, InvalidArgumentError, UnavailableError

#: Default of max_output_bytes: 16 MiB of stdout and 16 MiB of stderr kept for the result.
DEFAULT_MAX_OUTPUT_BYTES = 16 << 20

_STREAM_QUEUE = 64  # chunks a stream() iterator may fall behind before the reader waits for it
_END = object()


class TailBuffer:
    """The last ``max`` bytes of one output stream, as numbered chunks."""

    def __init__(self, max_bytes: Optional[int]) -> None:
        self.max = max_bytes  # None: keep everything
        self.chunks: Deque[Tuple[int, bytes]] = deque()
        self.size = 0
        self.truncated = False

    def push(self, seq: int, data: bytes) -> None:
        if not data:
            return
        if self.max is not None and len(data) >= self.max:
            # This chunk alone fills the buffer: keep its tail.
            self.truncated = self.truncated or len(data) > self.max or self.size > 0
            self.chunks = deque([(seq, data[len(data) - self.max :])] if self.max > 0 else [])
            self.size = self.max
            return
        self.chunks.append((seq, data))
        self.size += len(data)
        while self.max is not None and self.size > self.max:
            self.truncated = True
            s, first = self.chunks[0]
            excess = self.size - self.max
            if len(first) <= excess:
                self.chunks.popleft()
                self.size -= len(first)
            else:
                self.chunks[0] = (s, first[excess:])
                self.size -= excess

    def text(self) -> str:
        """The kept bytes as UTF-8. When the front was dropped, continuation
        bytes at the start (a character cut in two) are skipped."""
        b = b"".join(c for _, c in self.chunks)
        if self.truncated:
            i = 0
            while i < 3 and i < len(b) and (b[i] & 0xC0) == 0x80:
                i += 1
            b = b[i:]
        return b.decode("utf-8", "replace")


def merged(out: TailBuffer, err: TailBuffer) -> List[ExecChunk]:
    """Both streams' kept chunks, back in arrival order."""
    tagged = [(s, "stdout", d) for s, d in out.chunks] + [(s, "stderr", d) for s, d in err.chunks]
    tagged.sort(key=lambda t: t[0])
    return [ExecChunk(stream=name, data=d) for _, name, d in tagged]


class _Writer:
    """One writer given to pipe(): bytes go to a binary writer as they are,
    and to a text writer (sys.stdout, io.StringIO, a text file) decoded as
    UTF-8 incrementally, so a character split between chunks stays whole."""

    def __init__(self, w: IO[Any]) -> None:
        self.w = w
        self.decoder: Optional[codecs.IncrementalDecoder] = None
        if isinstance(w, io.TextIOBase):
            self.decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def write(self, data: bytes) -> None:
        if self.decoder is None:
            try:
                self.w.write(data)
            except TypeError:  # a text writer that is not an io.TextIOBase
                self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        if self.decoder is not None:
            text = self.decoder.decode(data)
            if text:
                self.w.write(text)
        flush = getattr(self.w, "flush", None)
        if flush is not None:
            flush()

    def finish(self) -> None:
        """Writes what the decoder still holds at the end of the output (a
        character cut off by the end: U+FFFD)."""
        if self.decoder is not None:
            text = self.decoder.decode(b"", final=True)
            if text:
                self.w.write(text)
                flush = getattr(self.w, "flush", None)
                if flush is not None:
                    flush()


def _finish(sink: Tuple[_Writer, Optional[_Writer]]) -> Optional[BaseException]:
    """Ends both writers of one pipe() call; returns the first error."""
    first: Optional[BaseException] = None
    for w in sink:
        if w is None:
            continue
        try:
            w.finish()
        except BaseException as e:  # a writer given to pipe() failed
            first = first or e
    return first


class Execution:
    """A running (or finished) command. ``wait()`` for the result,
    ``pipe(writer)`` to copy its output as it comes, ``for chunk in
    stream()`` to read it."""

    def __init__(
        self,
        transport: Transport,
        sandbox_id: str,
        cmd: Union[str, Sequence[str]],
        *,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        stdin: Union[str, bytes, None] = None,
        timeout: Optional[float] = None,
        non_replayable: bool = False,
        max_output_bytes: Optional[int] = DEFAULT_MAX_OUTPUT_BYTES,
    ) -> None:
        if max_output_bytes is not None and (
            not isinstance(max_output_bytes, int) or max_output_bytes < 0
        ):
            raise InvalidArgumentError(
                f"max_output_bytes must be a non-negative int or None, got {max_output_bytes!r}"
            )
        if isinstance(cmd, str):
            self.command = cmd
            req: Dict[str, Any] = {"sandbox": sandbox_id, "shell": cmd}
        else:
            argv = list(cmd)
            self.command = " ".join(argv)
            req = {"sandbox": sandbox_id, "argv": argv}
        if env:
            req["env"] = dict(env)
        if cwd:
            req["cwd"] = cwd
        if stdin is not None:
            req["stdin"] = b64encode(
                stdin.encode("utf-8") if isinstance(stdin, str) else bytes(stdin)
            )
        if timeout:
            req["timeoutMs"] = str(int(timeout * 1000))
        if non_replayable:
            req["nonReplayable"] = True
        self._out = TailBuffer(max_output_bytes)
        self._err = TailBuffer(max_output_bytes)
        self._seq = 0
        self._lock = threading.Lock()
        self._sinks: List[Tuple[_Writer, Optional[_Writer]]] = []
        self._queues: List[queue.Queue[Any]] = []
        self._callbacks: List[Callable[["Execution"], None]] = []
        self._done = threading.Event()
        self._ending = False  # set (under the lock) once no more output comes
        self._result: Optional[ExecResult] = None
        self._error: Optional[BaseException] = None
        self._stream: Optional[ServerStream] = None
        self._canceled = False
        self._thread = threading.Thread(
            target=self._run, args=(transport, req), name=f"forkbox-exec-{sandbox_id}", daemon=True
        )
        self._thread.start()

    # ------------------------------------------------------------ reader

    def _run(self, transport: Transport, req: Dict[str, Any]) -> None:
        exit_msg: Optional[Dict[str, Any]] = None
        try:
            stream = transport.stream("SandboxService", "Exec", req)
            with self._lock:
                self._stream = stream
                canceled = self._canceled
            if canceled:
                stream.close()
            for msg in stream:
                if "stdout" in msg:
                    self._deliver("stdout", b64decode(msg["stdout"]))
                elif "stderr" in msg:
                    self._deliver("stderr", b64decode(msg["stderr"]))
                elif "exit" in msg:
                    exit_msg = msg["exit"] or {}
            if exit_msg is None:
                raise UnavailableError("exec stream ended without an exit status")
            self._result = ExecResult(
                exit_code=int(exit_msg.get("exitCode", 0)),
                signal=exit_msg.get("signal", ""),
                duration_ms=float(exit_msg.get("durationMs", 0)),
                timed_out=bool(exit_msg.get("timedOut", False)),
                oom_killed=bool(exit_msg.get("oomKilled", False)),
                stdout=self._out.text(),
                stderr=self._err.text(),
                stdout_truncated=self._out.truncated,
                stderr_truncated=self._err.truncated,
            )
        except ForkboxError as e:
            self._error = CanceledError("exec canceled") if self._canceled else e
        except BaseException as e:  # a writer given to pipe() failed, ...
            self._error = e
        finally:
            # The writers are ended outside the lock, as _deliver writes
            # (one may call cancel()); a pipe() from now on ends its own.
            with self._lock:
                self._ending = True
                sinks = list(self._sinks)
            for sink in sinks:
                err = _finish(sink)
                if err is not None and self._error is None:
                    self._error = err
            with self._lock:
                queues = list(self._queues)
                callbacks = list(self._callbacks)
                self._done.set()
            for q in queues:
                q.put(_END)
            for cb in callbacks:
                cb(self)

    def _deliver(self, name: str, data: bytes) -> None:
        if not data:
            return
        chunk = ExecChunk(stream=name, data=data)
        with self._lock:
            self._seq += 1
            (self._out if name == "stdout" else self._err).push(self._seq, data)
            sinks = list(self._sinks)
            queues = list(self._queues)
        for out, err in sinks:
            w = out if name == "stdout" else err
            if w is not None:
                w.write(data)
        for q in queues:
            q.put(chunk)  # waits while that iterator is _STREAM_QUEUE chunks behind

    # ------------------------------------------------------------ API

    def pipe(self, stdout: IO[Any], stderr: Optional[IO[Any]] = None) -> "Execution":
        """Copies the command's stdout into ``stdout`` (binary or text) as it
        is produced, and its stderr into ``stderr`` — by default sys.stderr
        when ``stdout`` is sys.stdout, else nowhere. Returns this execution,
        so ``sb.exec(cmd).pipe(sys.stdout).wait()`` reads like the seed.
        Output that came before the call is replayed from what the result
        keeps of it (the last max_output_bytes). Writers are not closed."""
        import sys

        if stderr is None and stdout is sys.stdout:
            stderr = sys.stderr
        out = _Writer(stdout)
        err = _Writer(stderr) if stderr is not None else None
        with self._lock:
            for c in merged(self._out, self._err):
                w = out if c.stream == "stdout" else err
                if w is not None:
                    w.write(c.data)
            ended = self._ending
            if not ended:
                self._sinks.append((out, err))
        if ended:
            failed = _finish((out, err))
            if failed is not None:
                raise failed
        return self

    def stream(self) -> Generator[ExecChunk, None, None]:
        """Yields the output as :class:`ExecChunk` (``stream``, ``data``,
        ``text``) until the command ends, starting with what the result keeps
        of earlier output; then raises the call's error, if any (not
        ExecError: call wait() for the exit status). Leaving the loop early
        is fine."""
        q: queue.Queue[Any] = queue.Queue(_STREAM_QUEUE)
        with self._lock:
            backlog = merged(self._out, self._err)
            finished = self._done.is_set()
            if not finished:
                self._queues.append(q)
        try:
            yield from backlog
            if not finished:
                while True:
                    item = q.get()
                    if item is _END:
                        break
                    yield item
            if self._error is not None and isinstance(self._error, ForkboxError):
                raise self._error
        finally:
            with self._lock:
                if q in self._queues:
                    self._queues.remove(q)
            # Unblock the reader if it waits on this (now abandoned) queue.
            while True:
                try:
                    q.get_nowait()
                except queue.Empty:
                    break

    def wait(self, timeout: Optional[float] = None, check: bool = True) -> ExecResult:
        """Waits for the command to end and returns its result. Raises
        ExecError when it did not succeed (non-zero exit, signal, timeout,
        OOM) unless ``check=False``, and a ForkboxError when the call
        failed. ``timeout`` bounds the wait only (TimeoutError), not the
        command: give ``timeout=`` to exec() for that."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"command {self.command!r} still running after {timeout} s")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        if check and not self._result.ok:
            raise ExecError(self.command, self._result)
        return self._result

    def done(self) -> bool:
        """Whether the command has ended (or the call failed)."""
        return self._done.is_set()

    def cancel(self) -> None:
        """Ends the call: the daemon kills the command. wait() then raises CanceledError."""
        with self._lock:
            self._canceled = True
            stream = self._stream
        if stream is not None:
            stream.close()

    def add_done_callback(self, fn: Callable[["Execution"], None]) -> None:
        """Calls fn(execution) from the reader thread once it ends (at once if it has)."""
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(fn)
                return
        fn(self)

    def __repr__(self) -> str:
        state = "done" if self.done() else "running"
        return f"<Execution {self.command!r} {state}>"
