"""The asyncio client against a real daemon: awaitable execs run in parallel
with gather, async streaming, fork (one child and count), checkpoint and
restore, credentials, pause, typed errors, an environment whose setup is an
async function, and max_concurrency."""

from __future__ import annotations

import asyncio
from typing import Any, Coroutine, List, TypeVar

import pytest

import forkbox
from conftest import RES, Capture, Daemon

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def aclient(d: Daemon, **kw: Any) -> forkbox.AsyncClient:
    return forkbox.AsyncClient(**d.where(), **kw)


def test_async_exec_stream_and_parallel_pipes(daemon: Daemon, image: str) -> None:
    async def main() -> None:
        async with aclient(daemon) as client:
            async with await client.sandbox(image=image, resources=RES, name="py-async") as sb:
                assert isinstance(sb, forkbox.AsyncSandbox)
                r = await sb.exec("echo hi; echo oops >&2")
                assert (r.stdout, r.stderr, r.exit_code) == ("hi\n", "oops\n", 0)
                with pytest.raises(forkbox.ExecError):
                    await sb.exec("exit 3")
                assert (await sb.exec("exit 3").wait(check=False)).exit_code == 3

                chunks: List[forkbox.ExecChunk] = []
                async for c in sb.exec("for i in 1 2 3; do echo $i; sleep 0.1; done").stream():
                    chunks.append(c)
                assert "".join(c.text for c in chunks) == "1\n2\n3\n" and len(chunks) >= 2

                # Leaving the loop early, or cancelling a consumer, leaves the command be.
                ex = sb.exec("for i in $(seq 1 2000); do echo $i; done")
                async for c in ex.stream():
                    break
                assert (await ex).stdout.endswith("\n2000\n")
                ex = sb.exec("sleep 0.5; seq 1 2000")

                async def consume() -> None:
                    async for _ in ex.stream():
                        pass

                task = asyncio.ensure_future(consume())
                await asyncio.sleep(0)  # let it start waiting for output
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                assert (await ex).stdout.endswith("\n2000\n")

                # Both commands run at once: each waits for the other's marker file.
                out = Capture()
                a, b = await asyncio.gather(
                    sb.exec(
                        "touch /tmp/a; until [ -f /tmp/b ]; do sleep 0.05; done; echo A",
                        timeout=60,
                    ).pipe(out),
                    sb.exec(
                        "touch /tmp/b; until [ -f /tmp/a ]; do sleep 0.05; done; echo B",
                        timeout=60,
                    ).pipe(out),
                )
                assert (a.stdout, b.stdout) == ("A\n", "B\n")
                assert sorted(out.text().split()) == ["A", "B"]

                await sb.write_file("/root/f", "async")
                assert await sb.read_text("/root/f") == "async"
                assert any(f.name == "f" for f in await sb.list_files("/root"))
            assert sb.closed
            assert not any(s.id == sb.id for s in await client.list_sandboxes())

    run(main())


def test_async_fork_checkpoint_restore_credentials(daemon: Daemon, image: str) -> None:
    async def main() -> None:
        async with aclient(daemon) as client:
            sb = await client.sandbox(image=image, resources=RES, name="py-async-fork")
            try:
                await sb.credentials.set("API_KEY", "k1")
                assert [c.name for c in await sb.credentials.list()] == ["API_KEY"]
                await sb.exec("echo base > /root/s")
                a, b = await asyncio.gather(sb.fork("track-a"), sb.fork("track-b"))
                assert isinstance(a, forkbox.AsyncSandbox) and a.id != b.id
                async with a, b:
                    ra, rb = await asyncio.gather(
                        a.exec("cat /root/s; echo $API_KEY"), b.exec("cat /root/s")
                    )
                    assert (ra.stdout, rb.stdout) == ("base\nk1\n", "base\n")
                res = await sb.fork("many", count=2)
                assert isinstance(res, forkbox.ForkResult) and len(res.sandboxes) == 2
                for child in res.sandboxes:
                    assert isinstance(child, forkbox.AsyncSandbox)
                    await child.close()
                ck = await sb.checkpoint("async-ck")
                tags = [c.tag for c in await sb.list_checkpoints()]
                assert {"track-a", "track-b", "many", "async-ck"} <= set(tags)
                async with await client.restore_snapshot(ck.id) as restored:
                    assert (await restored.exec("cat /root/s")).stdout == "base\n"
                await sb.pause()
                assert sb.info.state == "paused"
                with pytest.raises(forkbox.FailedPreconditionError):
                    await sb.exec("true")
                await sb.unpause()
                events = await sb.events()
                assert any(e.type == "sandbox.checkpoint_created" for e in events)
            finally:
                await sb.close()
            with pytest.raises(forkbox.NotFoundError):
                await client.get_sandbox("sb-doesnotexist")
            with pytest.raises(forkbox.InvalidArgumentError):
                await client.sandbox(image=image, resources={"memory": "lots"})

    run(main())


def test_async_environment_with_async_setup(daemon: Daemon, image: str) -> None:
    runs: List[str] = []

    async def setup(sb: forkbox.AsyncSandbox) -> None:
        runs.append(sb.id)
        await sb.exec("mkdir -p /site && echo 1.26.4 > /site/numpy.version")
        await sb.write_file("/site/by", "async-setup")

    async def main() -> None:
        async with aclient(daemon) as client:
            env = client.environment("py-async-env", image=image, resources=RES, setup=setup)
            first, second = await asyncio.gather(env.sandbox(), env.sandbox())
            async with first, second:
                built = [first.handover.built, second.handover.built]  # type: ignore[union-attr]
                assert sorted(built) == [False, True]
                for sb in (first, second):
                    assert (
                        await sb.exec("cat /site/numpy.version /site/by")
                    ).stdout == "1.26.4\nasync-setup"
            assert len(runs) == 1
            info = await env.info()
            assert info.state == "ready"

    run(main())


def test_async_max_concurrency(daemon: Daemon, image: str) -> None:
    async def main() -> None:
        async with aclient(daemon, max_concurrency=2) as client:
            sb = await client.sandbox(image=image, resources=RES, name="py-async-slots")
            try:
                assert client.slots_in_use == 1
                with pytest.raises(forkbox.ResourceExhaustedError):
                    await sb.fork(count=2)
                res = await sb.fork(count=2, best_effort=True)
                assert len(res.sandboxes) == 1 and isinstance(
                    res.errors[0], forkbox.ResourceExhaustedError
                )
                assert client.slots_in_use == 2
                await res.sandboxes[0].close()
            finally:
                await sb.close()
            assert client.slots_in_use == 0

    run(main())


def test_async_lifetime_egress_metrics(daemon: Daemon, image: str) -> None:
    async def main() -> None:
        async with aclient(daemon) as c:
            async with await c.sandbox(image=image, resources=RES, timeout=120) as sb:
                assert (await sb.set_timeout(240)).timeout == 240
                assert (await sb.set_egress(allow=["10.8.0.0/16"])).egress == "allow"
                m = await sb.metrics()
                assert m.sandbox_id == sb.id and m.memory_limit_bytes >= 256 << 20
                assert any(x.sandbox_id == sb.id for x in await c.metrics())

    run(main())
