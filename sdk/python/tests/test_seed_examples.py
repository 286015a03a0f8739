"""The two example programs of the SDK reference (seeds/sdk-fork-reference.txt),
written in Python and run for real: once with the sync Client (as the
package README shows them) and once with the AsyncClient (line by line the
seed's async code). Only the image names and the package-install commands are
swapped for offline ones (busybox), and ``.pipe(sys.stdout)`` pipes into
``stdout``, a writer the test captures."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any

import forkbox
from conftest import Capture, Daemon


# "Basic usage". npm ci → a setup that writes and archives files; npm test and
# npm run build → commands that print something checkable.
def basic_usage(client: forkbox.Client, stdout: IO[Any], name: str = "my-job") -> None:
    with client.sandbox(
        image="forkbox.local/busybox:latest",
        resources={"cpu": "1", "memory": "512Mi"},
        name=name,
    ) as sb:
        sb.exec("mkdir -p /app && echo 'console' > /app/a && tar czf /app/deps.tgz /app/a").wait()

        with sb.fork("after-install") as fork:
            # Run different workloads in parallel on the same base state
            runs = [
                sb.exec("tar tzf /app/deps.tgz && echo 'tests: 1 passed'").pipe(stdout),
                fork.exec(
                    "mkdir -p /app/dist && cp /app/a /app/dist/bundle.js"
                    " && echo built $(cat /app/dist/bundle.js)"
                ).pipe(stdout),
            ]
            for run in runs:
                run.wait()


# "Branching experiments". pip install → commands that write version files;
# python3 -c 'import X; print(X.__version__)' → cat of that file.
def branching_experiments(
    client: forkbox.Client, stdout: IO[Any], name: str = "python-base"
) -> None:
    def setup(sb: forkbox.Sandbox) -> None:
        sb.exec("mkdir -p /site && echo 1.26.4 > /site/numpy.version").wait()

    env = client.environment(
        name,
        image="forkbox.local/busybox:latest",
        resources={"cpu": "1", "memory": "1Gi"},
        setup=setup,
    )

    with env.sandbox() as sb:
        # Fork into two independent experiment tracks
        def track(tag: str, install: str, probe: str) -> None:
            with sb.fork(tag) as fork:
                fork.exec(install).wait()
                fork.exec(probe).pipe(stdout).wait()

        with ThreadPoolExecutor() as pool:
            a = pool.submit(
                track,
                "track-a",
                "test -f /site/numpy.version && echo 2.2.3 > /site/pandas.version",
                "cat /site/pandas.version",
            )
            b = pool.submit(
                track,
                "track-b",
                "test -f /site/numpy.version && echo 2.5.1+cpu > /site/torch.version",
                "cat /site/torch.version",
            )
            a.result()
            b.result()


# The same two programs with the asyncio client: the seed's code, in Python.
async def basic_usage_async(client: forkbox.AsyncClient, stdout: IO[Any]) -> None:
    sb = await client.sandbox(
        image="forkbox.local/busybox:latest",
        resources={"cpu": "1", "memory": "512Mi"},
        name="my-job-async",
    )

    try:
        await sb.exec("mkdir -p /app && echo 'console' > /app/a && tar czf /app/deps.tgz /app/a")

        fork = await sb.fork("after-install")
        try:
            # Run different workloads in parallel on the same base state
            await asyncio.gather(
                sb.exec("tar tzf /app/deps.tgz && echo 'tests: 1 passed'").pipe(stdout),
                fork.exec(
                    "mkdir -p /app/dist && cp /app/a /app/dist/bundle.js"
                    " && echo built $(cat /app/dist/bundle.js)"
                ).pipe(stdout),
            )
        finally:
            await fork.close()
    finally:
        await sb.close()


async def branching_experiments_async(client: forkbox.AsyncClient, stdout: IO[Any]) -> None:
    async def setup(sb: forkbox.AsyncSandbox) -> None:
        await sb.exec("mkdir -p /site && echo 1.26.4 > /site/numpy.version")

    env = client.environment(
        "python-base-async",
        image="forkbox.local/busybox:latest",
        resources={"cpu": "1", "memory": "1Gi"},
        setup=setup,
    )

    sb = await env.sandbox()
    try:
        # Fork into two independent experiment tracks
        fork_a, fork_b = await asyncio.gather(sb.fork("track-a"), sb.fork("track-b"))

        async def track(fork: forkbox.AsyncSandbox, install: str, probe: str) -> None:
            try:
                await fork.exec(install)
                await fork.exec(probe).pipe(stdout)
            finally:
                await fork.close()

        await asyncio.gather(
            track(
                fork_a,
                "test -f /site/numpy.version && echo 2.2.3 > /site/pandas.version",
                "cat /site/pandas.version",
            ),
            track(
                fork_b,
                "test -f /site/numpy.version && echo 2.5.1+cpu > /site/torch.version",
                "cat /site/torch.version",
            ),
        )
    finally:
        await sb.close()


def lines(c: Capture) -> list:
    return sorted(line for line in c.text().split("\n") if line)


def test_basic_usage(daemon: Daemon, image: str) -> None:
    assert image == "forkbox.local/busybox:latest"
    client = daemon.client(max_concurrency=10)
    stdout = Capture()
    basic_usage(client, stdout)
    assert lines(stdout) == ["app/a", "built console", "tests: 1 passed"]
    events = client.events("my-job")
    assert any(
        e.type == "sandbox.checkpoint_created" and e.data.get("tag") == "after-install"
        for e in events
    )
    assert client.list_sandboxes() == [], "the example leaves no sandbox"
    assert client.slots_in_use == 0


def test_branching_experiments(daemon: Daemon) -> None:
    client = daemon.client(max_concurrency=10)
    stdout = Capture()
    branching_experiments(client, stdout)
    assert lines(stdout) == ["2.2.3", "2.5.1+cpu"]
    assert client.list_sandboxes() == [], "the example leaves no sandbox"
    # Run again: the environment is built; the setup is not run twice.
    again = Capture()
    branching_experiments(client, again)
    assert lines(again) == ["2.2.3", "2.5.1+cpu"]
    env = [e for e in client.list_environments() if e.name == "python-base"]
    assert env and env[-1].state == "ready"
    builders = [
        s
        for s in client.list_sandboxes(all=True)
        if s.name.startswith("build-python-base-")
        and not s.name.startswith("build-python-base-async")
    ]
    assert (
        len(builders) == 1
    ), f"want the setup run once, got builders {[s.name for s in builders]}"
    assert client.slots_in_use == 0


def test_seed_examples_async(daemon: Daemon) -> None:
    async def main() -> None:
        async with forkbox.AsyncClient(**daemon.where(), max_concurrency=10) as client:
            out = Capture()
            await basic_usage_async(client, out)
            assert lines(out) == ["app/a", "built console", "tests: 1 passed"]
            out = Capture()
            await branching_experiments_async(client, out)
            assert lines(out) == ["2.2.3", "2.5.1+cpu"]
            assert await client.list_sandboxes() == []
            assert client.slots_in_use == 0

    asyncio.run(main())
