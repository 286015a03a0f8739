"""Environments against a real daemon: daemon-run steps (built once, then
forked), a failing step, a Python setup callable run through the build lease
(concurrent callers make one build), a raising setup, and the warm pool."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import List

import pytest

import forkbox
from conftest import RES, Daemon


def test_steps_build_once_then_fork(client: forkbox.Client, image: str) -> None:
    env = client.environment(
        "py-steps",
        image=image,
        resources=RES,
        env={"MODE": "steps"},
        setup=[
            "mkdir -p /app && echo hello > /app/hello",
            forkbox.WriteFile("/app/cfg.json", '{"a":1}'),
        ],
    )
    with env.sandbox() as a:
        assert a.handover is not None and a.handover.built
        assert (
            a.exec("cat /app/hello /app/cfg.json; echo $MODE").wait().stdout
            == 'hello\n{"a":1}steps\n'
        )
        a.exec("echo mine > /app/hello").wait()
        with env.sandbox() as b:
            assert b.handover is not None and not b.handover.built
            assert b.id != a.id
            assert b.exec("cat /app/hello").wait().stdout == "hello\n"
    info = env.info()
    assert isinstance(info, forkbox.EnvironmentInfo)
    assert info.state == "ready" and info.checkpoint.startswith("ck-") and info.name == "py-steps"
    assert info.built_at is not None
    assert info.definition.steps[1] == forkbox.WriteFile("/app/cfg.json", b'{"a":1}', 0)
    progress: List[forkbox.BuildProgress] = []
    again = env.build(progress.append)
    assert not again.built and again.environment.hash == info.hash
    assert progress and progress[-1].environment is not None
    assert any(e.name == "py-steps" for e in client.list_environments())


def test_failing_step_is_a_typed_error(client: forkbox.Client, image: str) -> None:
    env = client.environment(
        "py-badstep", image=image, resources=RES, setup=["echo no >&2; exit 7"]
    )
    with pytest.raises(forkbox.FailedPreconditionError, match="exited 7"):
        env.sandbox()


def test_setup_callable_runs_once_for_concurrent_callers(daemon: Daemon, image: str) -> None:
    runs = []
    lock = threading.Lock()

    def setup(sb: forkbox.Sandbox) -> None:
        with lock:
            runs.append(sb.id)
        sb.exec("mkdir -p /site && echo 1.26.4 > /site/numpy.version").wait()
        sb.write_file("/site/by", "setup-fn")

    # Two clients (as two processes would be): the daemon makes the second
    # caller wait for the first one's build.
    def get(c: forkbox.Client) -> forkbox.Sandbox:
        return c.environment("py-fn", image=image, resources=RES, setup=setup).sandbox()

    with ThreadPoolExecutor(2) as pool:
        a, b = pool.map(get, [daemon.client(), daemon.client()])
    try:
        assert len(runs) == 1
        built = [a.handover.built, b.handover.built]  # type: ignore[union-attr]
        assert sorted(built) == [False, True]
        for sb in (a, b):
            assert sb.exec("cat /site/numpy.version /site/by").wait().stdout == "1.26.4\nsetup-fn"
        with get(daemon.client()) as c:
            assert c.handover is not None and not c.handover.built
        assert len(runs) == 1
    finally:
        a.close()
        b.close()
    assert not any(
        s.id == runs[0] for s in daemon.client().list_sandboxes()
    ), "builder sandbox left running"


def test_raising_setup_fails_the_build_and_the_next_call_retries(
    client: forkbox.Client, image: str
) -> None:
    attempts = []

    def flaky(sb: forkbox.Sandbox) -> None:
        attempts.append(sb.id)
        sb.exec("echo try > /root/t").wait()
        if len(attempts) == 1:
            raise RuntimeError("setup broke")

    env = client.environment("py-flaky", image=image, resources=RES, setup=flaky)
    with pytest.raises(RuntimeError, match="setup broke"):
        env.sandbox()
    with env.sandbox() as sb:
        assert len(attempts) == 2
        assert sb.handover is not None and sb.handover.built
        assert sb.exec("cat /root/t").wait().stdout == "try\n"
    live = {s.id for s in client.list_sandboxes()}
    assert not live & set(attempts), "builder sandboxes left running"


def test_warm_pool_handover(client: forkbox.Client, image: str) -> None:
    env = client.environment(
        "py-pool", image=image, resources=RES, pool_size=1, setup=["echo pooled > /root/p"]
    )
    try:
        env.sandbox().close()
        # The pool refills in the background: wait for it, bounded.
        deadline = time.monotonic() + 60
        while env.info().pool_ready < 1:
            assert time.monotonic() < deadline, "the pool did not refill"
            time.sleep(0.2)
        with env.sandbox() as sb:
            assert sb.handover is not None and sb.handover.from_pool
            assert sb.exec("cat /root/p").wait().stdout == "pooled\n"
    finally:
        env.delete()
    with pytest.raises(forkbox.NotFoundError):
        env.info()
