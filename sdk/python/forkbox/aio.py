"""The asyncio client: the same API with ``await``.

It runs the synchronous transport in a thread pool of its own (``workers``
threads, 32 by default), so a blocking call never stalls the event loop. An
exec's output and result are handed to the loop by the execution's reader
thread, without holding a pool thread, so any number of execs can be awaited
at once::

    async with forkbox.AsyncClient() as client:
        async with await client.sandbox(image="...") as sb:
            fork = await sb.fork("after-install")
            await asyncio.gather(sb.exec("make test").pipe(sys.stdout),
                                 fork.exec("make build").pipe(sys.stdout))
            await fork.close()
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
from concurrent.futures import ThreadPoolExecutor
from typing import (
    IO,
    Any,
    AsyncIterator,
    Callable,
    Generator,
    List,
    Mapping,
    Optional,
    Sequence,
    TypeVar,
    Union,
    cast,
    overload,
)

from ._models import (
    BuildProgress,
    BuildResult,
    Checkpoint,
    Credential,
    EnvironmentInfo,
    Event,
    ExecChunk,
    ExecResult,
    FileInfo,
    ForkChild,
    ForkResult,
    Image,
    ImageProgress,
    Overrides,
    PortURL,
    Resources,
    SandboxInfo,
    SandboxMetrics,
    SandboxPage,
    Step,
)
from .client import Client
from .environment import Environment, _begin
from .execution import DEFAULT_MAX_OUTPUT_BYTES, Execution
from .sandbox import Sandbox

T = TypeVar("T")


class _Runner:
    """Runs blocking calls of the sync client in the pool."""

    def __init__(self, workers: int) -> None:
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="forkbox-aio")

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.pool, functools.partial(fn, *args, **kwargs))


class AsyncExecution:
    """A running command. ``await`` it for the result (raises ExecError when
    it fails; ``await execution.wait(check=False)`` returns it instead),
    ``.pipe(writer)`` to copy its output, ``async for chunk in .stream()``."""

    def __init__(self, sync: Execution, runner: _Runner) -> None:
        self.sync = sync
        self._runner = runner

    @property
    def command(self) -> str:
        return self.sync.command

    def pipe(self, stdout: IO[Any], stderr: Optional[IO[Any]] = None) -> "AsyncExecution":
        """As Execution.pipe(); returns this execution (awaitable)."""
        self.sync.pipe(stdout, stderr)
        return self

    async def wait(self, check: bool = True) -> ExecResult:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()

        def resolve() -> None:
            if not fut.done():
                fut.set_result(None)

        def done(_: Execution) -> None:
            try:
                loop.call_soon_threadsafe(resolve)
            except RuntimeError:  # the loop is closed: nobody awaits any more
                pass

        self.sync.add_done_callback(done)
        await fut
        return self.sync.wait(0, check=check)

    def __await__(self) -> Generator[Any, None, ExecResult]:
        return self.wait().__await__()

    async def stream(self) -> AsyncIterator[ExecChunk]:
        """As Execution.stream(), asynchronously. Each chunk is fetched in a
        pool thread; a consumer that stops (or is cancelled) while a fetch
        is pending closes the iterator once that fetch returns."""
        it = self.sync.stream()
        end = object()
        pending: Optional["concurrent.futures.Future[Any]"] = None

        def fetch() -> Any:
            return next(it, end)

        try:
            while True:
                pending = self._runner.pool.submit(fetch)
                chunk = await asyncio.wrap_future(pending)
                pending = None
                if chunk is end:
                    return
                yield chunk
        finally:
            if pending is not None and not pending.done():
                pending.add_done_callback(lambda _: it.close())
            else:
                it.close()

    def cancel(self) -> None:
        self.sync.cancel()

    def done(self) -> bool:
        return self.sync.done()


class AsyncCredentials:
    def __init__(self, sb: "AsyncSandbox") -> None:
        self._c = sb.sync.credentials
        self._runner = sb._runner

    async def set(
        self,
        name: str,
        value: str,
        *,
        env: Optional[str] = None,
        file: Optional[str] = None,
        per_fork: bool = False,
    ) -> Credential:
        return await self._runner.run(
            self._c.set, name, value, env=env, file=file, per_fork=per_fork
        )

    async def list(self) -> List[Credential]:
        return await self._runner.run(self._c.list)

    async def delete(self, name: str) -> None:
        await self._runner.run(self._c.delete, name)


class AsyncSandbox:
    """A handle on one sandbox, for asyncio (see Sandbox for each method)."""

    def __init__(self, sync: Sandbox, runner: _Runner) -> None:
        self.sync = sync
        self._runner = runner
        self.credentials = AsyncCredentials(self)

    id = property(lambda self: self.sync.id)
    name = property(lambda self: self.sync.name)
    info = property(lambda self: self.sync.info)
    resumed = property(lambda self: self.sync.resumed)
    handover = property(lambda self: self.sync.handover)
    closed = property(lambda self: self.sync.closed)

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
    ) -> AsyncExecution:
        """Starts a command (without blocking the loop); await the result."""
        return AsyncExecution(
            self.sync.exec(
                cmd,
                env=env,
                cwd=cwd,
                stdin=stdin,
                timeout=timeout,
                non_replayable=non_replayable,
                max_output_bytes=max_output_bytes,
            ),
            self._runner,
        )

    @overload
    async def fork(
        self,
        tag: Optional[str] = None,
        *,
        count: None = None,
        overrides: Union[Overrides, Mapping[str, Any], None] = None,
        credentials: Optional[Mapping[str, str]] = None,
        from_checkpoint: Optional[str] = None,
        best_effort: bool = False,
        memory: bool = False,
    ) -> "AsyncSandbox":
        ...

    @overload
    async def fork(
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

    async def fork(
        self,
        tag: Optional[str] = None,
        *,
        count: Optional[int] = None,
        overrides: Union[Overrides, Mapping[str, Any], None] = None,
        credentials: Optional[Mapping[str, str]] = None,
        from_checkpoint: Optional[str] = None,
        best_effort: bool = False,
        memory: bool = False,
    ) -> Union["AsyncSandbox", ForkResult]:
        """As Sandbox.fork(): one child as an AsyncSandbox, or with ``count``
        a ForkResult whose children's ``sandbox`` are AsyncSandbox."""
        r = await self._runner.run(
            self.sync.fork,
            tag,
            count=count,
            overrides=overrides,
            credentials=credentials,
            from_checkpoint=from_checkpoint,
            best_effort=best_effort,
            memory=memory,
        )
        if isinstance(r, Sandbox):
            return AsyncSandbox(r, self._runner)
        r.children = [
            ForkChild(
                sandbox=(AsyncSandbox(c.sandbox, self._runner) if c.sandbox else None),
                error=c.error,
                start_ms=c.start_ms,
            )
            for c in r.children
        ]
        return r

    async def checkpoint(self, tag: Optional[str] = None, *, memory: bool = False) -> Checkpoint:
        return await self._runner.run(self.sync.checkpoint, tag, memory=memory)

    async def list_checkpoints(self) -> List[Checkpoint]:
        return await self._runner.run(self.sync.list_checkpoints)

    async def pause(self) -> None:
        await self._runner.run(self.sync.pause)

    async def unpause(self) -> None:
        await self._runner.run(self.sync.unpause)

    async def port_url(self, port: int) -> PortURL:
        return await self._runner.run(self.sync.port_url, port)

    async def url(self, port: int) -> str:
        return await self._runner.run(self.sync.url, port)

    async def get_host(self, port: int) -> str:
        return await self._runner.run(self.sync.get_host, port)

    async def set_timeout(self, timeout: float) -> SandboxInfo:
        return await self._runner.run(self.sync.set_timeout, timeout)

    async def set_egress(
        self,
        egress: Optional[str] = None,
        *,
        allow: Optional[Sequence[str]] = None,
        deny: Optional[Sequence[str]] = None,
    ) -> SandboxInfo:
        return await self._runner.run(self.sync.set_egress, egress, allow=allow, deny=deny)

    async def metrics(self) -> SandboxMetrics:
        return await self._runner.run(self.sync.metrics)

    async def hibernate(self) -> None:
        await self._runner.run(self.sync.hibernate)

    async def wake(self) -> None:
        await self._runner.run(self.sync.wake)

    async def read_file(self, path: str) -> bytes:
        return await self._runner.run(self.sync.read_file, path)

    async def read_text(self, path: str, encoding: str = "utf-8") -> str:
        return await self._runner.run(self.sync.read_text, path, encoding)

    async def write_file(self, path: str, data: Union[str, bytes], *, mode: int = 0) -> None:
        await self._runner.run(self.sync.write_file, path, data, mode=mode)

    async def list_files(self, path: str) -> List[FileInfo]:
        return await self._runner.run(self.sync.list_files, path)

    async def events(self) -> List[Event]:
        return await self._runner.run(self.sync.events)

    async def refresh(self) -> SandboxInfo:
        return await self._runner.run(self.sync.refresh)

    async def close(self) -> None:
        await self._runner.run(self.sync.close)

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<AsyncSandbox {self.id} {self.name!r} {self.info.state}>"


class AsyncEnvironment:
    """An environment of an AsyncClient. ``setup`` may be an ``async def``
    taking an AsyncSandbox (or a plain function taking one)."""

    def __init__(self, sync: Environment, runner: _Runner) -> None:
        self.sync = sync
        self._runner = runner
        self.name = sync.name

    async def build(
        self, on_progress: Optional[Callable[[BuildProgress], None]] = None
    ) -> BuildResult:
        if self.sync._def.setup_fn is not None:
            return await self._run_setup()
        return await self._runner.run(self.sync.build, on_progress)

    async def sandbox(
        self, overrides: Union[Overrides, Mapping[str, Any], None] = None
    ) -> AsyncSandbox:
        """As Environment.sandbox(); a client-run setup runs on the event loop."""
        built_here = (
            (await self._run_setup()).built if self.sync._def.setup_fn is not None else False
        )
        return AsyncSandbox(
            await self._runner.run(self.sync._hand_over, overrides, built_here), self._runner
        )

    async def info(self) -> EnvironmentInfo:
        return await self._runner.run(self.sync.info)

    async def delete(self) -> None:
        await self._runner.run(self.sync.delete)

    async def _run_setup(self) -> BuildResult:
        call = self.sync._call
        env, builder, lease = _begin(
            await self._runner.run(call, "BeginBuild", {"definition": self.sync._def.json})
        )
        if env is not None:
            return BuildResult(environment=env, built=False)
        assert builder is not None and self.sync._def.setup_fn is not None
        try:
            r = self.sync._def.setup_fn(
                AsyncSandbox(Sandbox(self.sync.client, builder, False), self._runner)
            )
            if inspect.isawaitable(r):
                await r
        except BaseException as e:
            try:
                await self._runner.run(
                    call,
                    "CompleteBuild",
                    {"lease": lease, "ok": False, "error": str(e) or type(e).__name__},
                )
            except Exception:
                pass
            raise
        done = await self._runner.run(call, "CompleteBuild", {"lease": lease, "ok": True})
        return BuildResult(
            environment=EnvironmentInfo.from_json(done.get("environment") or {}), built=True
        )


class AsyncClient:
    """The asyncio client; the same options as Client, plus ``workers``: the
    size of the thread pool blocking calls run in."""

    def __init__(
        self,
        *,
        socket: Optional[str] = None,
        url: Optional[str] = None,
        token: Optional[str] = None,
        max_concurrency: int = 0,
        workers: int = 32,
    ) -> None:
        self.sync = Client(socket=socket, url=url, token=token, max_concurrency=max_concurrency)
        self._runner = _Runner(workers)

    @property
    def max_concurrency(self) -> int:
        return self.sync.max_concurrency

    @property
    def slots_in_use(self) -> int:
        return self.sync.slots_in_use

    def _wrap(self, sb: Sandbox) -> AsyncSandbox:
        return AsyncSandbox(sb, self._runner)

    async def sandbox(
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
    ) -> AsyncSandbox:
        return self._wrap(
            await self._runner.run(
                self.sync.sandbox,
                image=image,
                resources=resources,
                name=name,
                env=env,
                cwd=cwd,
                egress=egress,
                runtime=runtime,
                timeout=timeout,
                on_timeout=on_timeout,
                egress_allow=egress_allow,
                egress_deny=egress_deny,
            )
        )

    async def metrics(self) -> List[SandboxMetrics]:
        return await self._runner.run(self.sync.metrics)

    async def get_sandbox(self, id_or_name: str) -> AsyncSandbox:
        return self._wrap(await self._runner.run(self.sync.get_sandbox, id_or_name))

    async def list_sandboxes(self, all: bool = False) -> List[SandboxInfo]:
        return await self._runner.run(self.sync.list_sandboxes, all)

    async def list_sandboxes_page(
        self, *, all: bool = False, page_size: int = 0, page_token: str = ""
    ) -> SandboxPage:
        return await self._runner.run(
            self.sync.list_sandboxes_page, all=all, page_size=page_size, page_token=page_token
        )

    async def iter_sandboxes(
        self, *, all: bool = False, page_size: int = 0, page_token: str = ""
    ) -> AsyncIterator[SandboxInfo]:
        """Every sandbox, fetching a page at a time: ``async for sb in client.iter_sandboxes()``."""
        while True:
            page = await self.list_sandboxes_page(all=all, page_size=page_size, page_token=page_token)
            for sb in page.sandboxes:
                yield sb
            if not page.next_page_token:
                return
            page_token = page.next_page_token

    async def restore_snapshot(
        self,
        checkpoint_id: str,
        *,
        overrides: Union[Overrides, Mapping[str, Any], None] = None,
        credentials: Optional[Mapping[str, str]] = None,
    ) -> AsyncSandbox:
        return self._wrap(
            await self._runner.run(
                self.sync.restore_snapshot,
                checkpoint_id,
                overrides=overrides,
                credentials=credentials,
            )
        )

    async def resume(self, session: str) -> AsyncSandbox:
        return self._wrap(await self._runner.run(self.sync.resume, session))

    async def delete_checkpoint(self, checkpoint_id: str) -> None:
        await self._runner.run(self.sync.delete_checkpoint, checkpoint_id)

    async def events(self, id_or_name: str) -> List[Event]:
        return await self._runner.run(self.sync.events, id_or_name)

    def environment(
        self,
        name: str,
        *,
        image: str,
        setup: Union[
            Sequence[Union[Step, Mapping[str, Any]]], Callable[[AsyncSandbox], Any], None
        ] = None,
        resources: Union[Resources, Mapping[str, Any], None] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        runtime: Optional[str] = None,
        egress: Optional[str] = None,
        max_age: Union[int, float, str, None] = None,
        pool_size: int = 0,
        start: Union[str, Mapping[str, Any], None] = None,
    ) -> AsyncEnvironment:
        return AsyncEnvironment(
            self.sync.environment(
                name,
                image=image,
                setup=cast(Any, setup),  # called with an AsyncSandbox: see AsyncEnvironment
                resources=resources,
                env=env,
                cwd=cwd,
                runtime=runtime,
                egress=egress,
                max_age=max_age,
                pool_size=pool_size,
                start=start,
            ),
            self._runner,
        )

    async def list_environments(self) -> List[EnvironmentInfo]:
        return await self._runner.run(self.sync.list_environments)

    async def import_image(
        self,
        path: Union[str, bytes],
        *,
        name: Optional[str] = None,
        on_progress: Optional[Callable[[ImageProgress], None]] = None,
    ) -> Image:
        return await self._runner.run(
            self.sync.import_image, path, name=name, on_progress=on_progress
        )

    async def pull_image(
        self,
        ref: str,
        *,
        insecure: bool = False,
        on_progress: Optional[Callable[[ImageProgress], None]] = None,
    ) -> Image:
        return await self._runner.run(
            self.sync.pull_image, ref, insecure=insecure, on_progress=on_progress
        )

    async def list_images(self) -> List[Image]:
        return await self._runner.run(self.sync.list_images)

    async def close(self) -> None:
        """Drops idle connections and stops the thread pool. Sandboxes are not closed."""
        self.sync.close()
        self._runner.pool.shutdown(wait=False)

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
