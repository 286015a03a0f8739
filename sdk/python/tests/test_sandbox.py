"""The sync client against a real daemon: create, exec, files, typed errors,
fork (one child, and count with per-child results), checkpoints, restore vs
resume, credentials, pause, hibernate, max_concurrency, TCP with a token."""

from __future__ import annotations

import io
import os
import sys
import time

import pytest

import forkbox
from conftest import MAX_SANDBOXES, RES, Capture, Daemon


def test_create_exec_close(client: forkbox.Client, image: str) -> None:
    with client.sandbox(image=image, resources=RES, name="py-basic", env={"GREETING": "hi"}) as sb:
        assert sb.id.startswith("sb-")
        assert sb.name == "py-basic"
        assert sb.info.state == "running"
        assert sb.info.resources.memory == "256Mi"
        assert sb.info.created_at is not None and sb.info.created_at.tzinfo is not None
        r = sb.exec("echo $GREETING; echo oops >&2").wait()
        assert isinstance(r, forkbox.ExecResult)
        assert (r.exit_code, r.stdout, r.stderr, r.timed_out, r.oom_killed, r.ok) == (
            0,
            "hi\n",
            "oops\n",
            False,
            False,
            True,
        )
        assert r.duration_ms >= 0
        assert sb.exec(["echo", "a b", "c"]).wait().stdout == "a b c\n"
        assert sb.exec("cat", stdin="from stdin").wait().stdout == "from stdin"
        assert sb.exec("pwd; echo $X", cwd="/tmp", env={"X": "y"}).wait().stdout == "/tmp\ny\n"
        assert sb.refresh().id == sb.id
        assert any(s.id == sb.id for s in client.list_sandboxes())
    assert sb.closed
    sb.close()  # a second close is a no-op
    assert not any(s.id == sb.id for s in client.list_sandboxes())
    assert any(s.id == sb.id and s.state == "closed" for s in client.list_sandboxes(all=True))
    types = [e.type for e in client.events(sb.id)]
    assert types[0] == "sandbox.created" and "sandbox.closed" in types


def test_files(client: forkbox.Client, image: str) -> None:
    with client.sandbox(image=image, resources=RES, name="py-files") as sb:
        sb.write_file("/root/f.txt", "content")
        sb.write_file("/root/bin.dat", bytes(range(256)), mode=0o600)
        assert sb.read_text("/root/f.txt") == "content"
        assert sb.read_file("/root/bin.dat") == bytes(range(256))
        assert sb.exec("cat /root/f.txt").wait().stdout == "content"
        files = {f.name: f for f in sb.list_files("/root")}
        assert files["f.txt"].size == 7 and not files["f.txt"].is_dir
        assert files["bin.dat"].mode & 0o777 == 0o600
        assert files["f.txt"].modified_at is not None
        with pytest.raises(forkbox.NotFoundError):
            sb.read_file("/root/missing")


def test_exec_failures_timeouts_and_cancel(client: forkbox.Client, image: str) -> None:
    with client.sandbox(image=image, resources=RES, name="py-fail") as sb:
        with pytest.raises(forkbox.ExecError) as ei:
            sb.exec("echo partial; echo why >&2; exit 3").wait()
        assert ei.value.exit_code == 3
        assert ei.value.result.stdout == "partial\n"
        assert "exited with code 3: why" in str(ei.value)
        assert sb.exec("exit 4").wait(check=False).exit_code == 4
        t = sb.exec("sleep 5", timeout=0.3).wait(check=False)
        assert t.timed_out and not t.ok
        long = sb.exec("sleep 30")
        with pytest.raises(TimeoutError):
            long.wait(timeout=0.2)  # bounds the wait, not the command
        assert not long.done()
        long.cancel()
        with pytest.raises(forkbox.CanceledError):
            long.wait()
        assert sb.exec("echo alive").wait().stdout == "alive\n"


def test_stream_and_pipe(client: forkbox.Client, image: str) -> None:
    with client.sandbox(image=image, resources=RES, name="py-stream") as sb:
        out, err = Capture(), Capture()
        cmd = "for i in 1 2 3; do echo line $i; sleep 0.2; done; echo bad >&2"
        r = sb.exec(cmd).pipe(out, err).wait()
        assert out.text() == "line 1\nline 2\nline 3\n"
        assert len(out.chunks) >= 2, f"want output streamed in several chunks, got {out.chunks}"
        assert err.text() == "bad\n"
        assert r.stdout == out.text()

        chunks = list(sb.exec(cmd).stream())
        assert len(chunks) >= 3
        assert (
            "".join(c.text for c in chunks if c.stream == "stdout") == "line 1\nline 2\nline 3\n"
        )
        assert [c.text for c in chunks if c.stream == "stderr"] == ["bad\n"]

        # A text writer works too; pipe() after the end replays what the result kept.
        text = io.StringIO()
        ex = sb.exec("echo late")
        ex.wait()
        ex.pipe(text)
        assert text.getvalue() == "late\n"

        # Leaving a stream() loop early does not stop the command or block it.
        ex = sb.exec("for i in $(seq 1 200); do echo $i; done")
        for c in ex.stream():
            assert c.data
            break
        assert ex.wait().stdout.endswith("200\n")

        # The result keeps the tail; pipe() gets every byte.
        big = Capture()
        r = (
            sb.exec("head -c 1000000 /dev/zero | tr '\\0' x", max_output_bytes=1000)
            .pipe(big)
            .wait()
        )
        assert len(b"".join(big.chunks)) == 1_000_000
        assert (r.stdout, r.stdout_truncated) == ("x" * 1000, True)
        with pytest.raises(forkbox.InvalidArgumentError):
            sb.exec("true", max_output_bytes=-1)


def test_pipe_to_sys_stdout(
    client: forkbox.Client, image: str, capfd: pytest.CaptureFixture[str]
) -> None:
    with client.sandbox(image=image, resources=RES, name="py-sysout") as sb:
        sb.exec("echo to-stdout; echo to-stderr >&2").pipe(sys.stdout).wait()
    got = capfd.readouterr()
    assert "to-stdout\n" in got.out
    assert "to-stderr\n" in got.err


def test_typed_errors(daemon: Daemon, client: forkbox.Client, image: str) -> None:
    with pytest.raises(forkbox.NotFoundError):
        client.get_sandbox("sb-doesnotexist")
    with pytest.raises(forkbox.InvalidArgumentError):
        client.sandbox(image=image, resources={"cpu": "1", "memory": "lots"})
    with pytest.raises(forkbox.NotFoundError):
        client.sandbox(image="forkbox.local/nope:latest")
    with pytest.raises(forkbox.NotFoundError):
        client.restore_snapshot("ck-nope")
    with client.sandbox(image=image, resources=RES, name="py-taken") as sb:
        with pytest.raises(forkbox.AlreadyExistsError):
            client.sandbox(image=image, resources=RES, name="py-taken")
        with pytest.raises(forkbox.InvalidArgumentError):
            sb.fork(count=2, overrides={"name": "two-with-one-name"})
    ghost = client.sandbox(image=image, resources=RES, name="py-ghost")
    ghost.close()
    with pytest.raises(forkbox.ForkboxError) as ei:
        ghost.exec("true").wait()
    assert not isinstance(ei.value, forkbox.UnknownError)
    with pytest.raises(forkbox.UnavailableError):
        forkbox.Client(socket="/nonexistent/forkbox.sock").list_sandboxes()
    # Over TCP: a wrong token is Unauthenticated; a host path is the local socket's only.
    with pytest.raises(forkbox.UnauthenticatedError):
        daemon.client(url=daemon.tcp_url, token="wrong").list_sandboxes()
    with pytest.raises(forkbox.PermissionDeniedError):
        daemon.client(url=daemon.tcp_url, token=daemon.token).import_image("/etc/passwd")


def test_import_archive_bytes_over_tcp(daemon: Daemon) -> None:
    # A remote caller sends the archive itself (a gateway imports it on
    # every node); the image is the one the suite runs.
    archive = os.environ.get("FORKBOX_TEST_ARCHIVE") or str(daemon.dir / "busybox.tar")
    with open(archive, "rb") as f:
        data = f.read()
    seen: list = []
    c = daemon.client(url=daemon.tcp_url, token=daemon.token)
    img = c.import_image(data, name="forkbox.local/busybox:latest", on_progress=seen.append)
    assert img.name == "forkbox.local/busybox:latest" and seen
    with pytest.raises(forkbox.InvalidArgumentError):
        c.import_image(b"not an archive")


def test_tcp_with_token(daemon: Daemon, image: str) -> None:
    c = daemon.client(url=daemon.tcp_url, token=daemon.token)
    with c.sandbox(image=image, resources=RES, name="py-tcp") as sb:
        assert sb.exec("echo over tcp").wait().stdout == "over tcp\n"
        assert any(s.id == sb.id for s in c.list_sandboxes())


def test_fork_one_child(client: forkbox.Client, image: str) -> None:
    with client.sandbox(image=image, resources=RES, name="py-parent", env={"A": "1"}) as sb:
        sb.exec("echo base > /root/state").wait()
        with sb.fork("after-base") as child:
            assert isinstance(child, forkbox.Sandbox)
            assert child.id != sb.id
            assert child.name.startswith("fork-py-parent-")
            assert child.info.parent_id == sb.id
            assert child.info.env == {"A": "1"}
            assert child.exec("cat /root/state").wait().stdout == "base\n"
            child.exec("echo child > /root/state").wait()
            sb.exec("echo parent > /root/state").wait()
            assert child.exec("cat /root/state").wait().stdout == "child\n"
            assert sb.exec("cat /root/state").wait().stdout == "parent\n"
        ck = [c for c in sb.list_checkpoints() if c.tag == "after-base"]
        assert len(ck) == 1 and ck[0].kind == "filesystem" and ck[0].id.startswith("ck-")
        created = [e for e in sb.events() if e.type == "sandbox.checkpoint_created"]
        assert any(e.data.get("tag") == "after-base" for e in created)


def test_fork_stream(client: forkbox.Client, image: str) -> None:
    with client.sandbox(image=image, resources=RES, name="py-stream") as sb:
        sb.exec("echo streamed > /root/s").wait()
        kids = []
        try:
            types, indices = [], set()
            for ev in sb.fork_stream("streamed", count=3):
                assert isinstance(ev, forkbox.ForkEvent)
                types.append(ev.type)
                if ev.type == "captured":
                    assert ev.captured == "filesystem" and ev.count == 3 and ev.checkpoint is not None
                elif ev.type == "child":
                    assert ev.child is not None and ev.child.ok, ev.child
                    assert ev.index not in indices
                    indices.add(ev.index)
                    kids.append(ev.child.sandbox)
                    # Usable as it arrives, while its siblings may still start.
                    assert ev.child.sandbox.exec("cat /root/s").wait().stdout == "streamed\n"
                else:
                    assert ev.started == 3 and ev.failed == 0 and ev.total_ms > 0
            assert types == ["captured", "child", "child", "child", "done"]
            assert indices == {0, 1, 2}
        finally:
            for k in kids:
                k.close()


def test_fork_count_per_child_results(client: forkbox.Client, image: str) -> None:
    with client.sandbox(image=image, resources=RES, name="py-many") as sb:
        sb.exec("echo shared > /root/state").wait()
        res = sb.fork("three", count=3, overrides=forkbox.Overrides(env={"ROLE": "worker"}))
        try:
            assert isinstance(res, forkbox.ForkResult)
            assert res.captured == "filesystem"
            assert res.checkpoint is not None and res.checkpoint.tag == "three"
            assert res.capture_ms > 0 and res.total_ms > 0
            assert len(res.children) == 3 and len(res.sandboxes) == 3 and res.errors == []
            assert len({c.id for c in res.sandboxes}) == 3
            for c in res.children:
                assert c.ok and c.start_ms > 0
                assert c.sandbox is not None
                assert (
                    c.sandbox.exec("echo $ROLE; cat /root/state").wait().stdout
                    == "worker\nshared\n"
                )
        finally:
            for c in res.sandboxes:
                c.close()
        # count=1 still returns per-child results.
        one = sb.fork(count=1)
        assert isinstance(one, forkbox.ForkResult) and len(one.sandboxes) == 1
        one.sandboxes[0].close()


def test_fork_one_child_failing_does_not_fail_the_others(
    client: forkbox.Client, image: str
) -> None:
    # The daemon's bound on live sandboxes (--max-sandboxes) leaves room for
    # `free` children: with best_effort those start and the rest fail, each
    # with its own ResourceExhausted error.
    with client.sandbox(image=image, resources=RES, name="py-partial") as sb:
        free = MAX_SANDBOXES - len(client.list_sandboxes())
        assert free >= 1
        res = sb.fork("partial", count=free + 2, best_effort=True)
        try:
            assert len(res.children) == free + 2
            started = [c for c in res.children if c.ok]
            failed = [c for c in res.children if not c.ok]
            assert len(started) >= 1 and len(failed) >= 2
            for c in failed:
                assert isinstance(c.error, forkbox.ResourceExhaustedError), repr(c.error)
            for s in res.sandboxes:
                assert s.exec("echo ok").wait().stdout == "ok\n"
        finally:
            for s in res.sandboxes:
                s.close()
        # Without best_effort, too many children is one error, and nothing is made.
        with pytest.raises(forkbox.ResourceExhaustedError):
            sb.fork(count=MAX_SANDBOXES + 1)


def test_checkpoint_restore_and_resume(client: forkbox.Client, image: str) -> None:
    sb = client.sandbox(image=image, resources=RES, name="py-session")
    restored = resumed = None
    try:
        sb.exec("echo one > /root/a").wait()
        ck = sb.checkpoint("ready")
        assert isinstance(ck, forkbox.Checkpoint)
        assert ck.id.startswith("ck-") and ck.tag == "ready" and ck.sandbox_id == sb.id
        assert ck.created_at is not None
        assert any(c.id == ck.id for c in sb.list_checkpoints())
        sb.exec("echo two >> /root/a").wait()
        sb.close()

        restored = client.restore_snapshot(ck.id, overrides={"env": {"R": "1"}})
        assert restored.info.from_checkpoint == ck.id
        assert restored.exec("cat /root/a; echo $R").wait().stdout == "one\n1\n"

        resumed = client.resume("py-session")
        assert resumed.resumed is not None
        assert resumed.resumed.checkpoint is not None and resumed.resumed.checkpoint.id == ck.id
        assert len(resumed.resumed.replayed) == 1
        assert resumed.resumed.replayed[0].shell == "echo two >> /root/a"
        assert resumed.exec("cat /root/a").wait().stdout == "one\ntwo\n"
    finally:
        for s in (sb, restored, resumed):
            if s is not None:
                s.close()
    fresh = client.sandbox(image=image, resources=RES, name="py-nock")
    fresh.close()
    with pytest.raises(forkbox.FailedPreconditionError):
        client.resume("py-nock")
    client.delete_checkpoint(ck.id)
    with pytest.raises(forkbox.NotFoundError):
        client.restore_snapshot(ck.id)


def test_credentials(client: forkbox.Client, image: str) -> None:
    with client.sandbox(image=image, resources=RES, name="py-creds") as sb:
        cred = sb.credentials.set("API_KEY", "s3cret")
        assert (cred.name, cred.env, cred.per_fork) == ("API_KEY", "API_KEY", False)
        sb.credentials.set("token", "parent-token", file="token", per_fork=True)
        sb.credentials.set("OTHER", "x", env="OTHER_ENV")
        assert sorted(c.name for c in sb.credentials.list()) == ["API_KEY", "OTHER", "token"]
        assert (
            sb.exec("echo $API_KEY $OTHER_ENV; cat /run/secrets/token").wait().stdout
            == "s3cret x\nparent-token"
        )
        sb.credentials.delete("OTHER")
        assert sorted(c.name for c in sb.credentials.list()) == ["API_KEY", "token"]
        assert "s3cret" not in repr(sb.refresh())
        with pytest.raises(forkbox.FailedPreconditionError):
            sb.fork("no-token")
        with sb.fork("with-token", credentials={"token": "child-token"}) as child:
            assert (
                child.exec("echo $API_KEY; cat /run/secrets/token").wait().stdout
                == "s3cret\nchild-token"
            )


def test_pause_unpause(client: forkbox.Client, image: str) -> None:
    with client.sandbox(image=image, resources=RES, name="py-pause") as sb:
        sb.pause()
        assert sb.info.state == "paused"
        with pytest.raises(forkbox.FailedPreconditionError):
            sb.exec("true").wait()
        with sb.fork("while-paused") as child:
            assert child.exec("echo child").wait().stdout == "child\n"
        sb.unpause()
        assert sb.info.state == "running"
        assert sb.exec("echo alive").wait().stdout == "alive\n"


def test_hibernate_and_wake(client: forkbox.Client, image: str) -> None:
    with client.sandbox(image=image, resources=RES, name="py-hibernate") as sb:
        sb.exec("echo kept > /root/f").wait()
        sb.hibernate()
        assert sb.info.state == "hibernated"
        sb.wake()
        assert sb.info.state == "running"
        assert sb.exec("cat /root/f").wait().stdout == "kept\n"
        sb.hibernate()
        # The next exec wakes it.
        assert sb.exec("cat /root/f").wait().stdout == "kept\n"
        assert sb.refresh().state == "running"


def test_max_concurrency(daemon: Daemon, image: str) -> None:
    c = daemon.client(max_concurrency=3)
    sb = c.sandbox(image=image, resources=RES, name="py-slots")
    held = [sb]
    try:
        assert c.slots_in_use == 1
        with pytest.raises(forkbox.ResourceExhaustedError):
            sb.fork(count=3)
        assert c.slots_in_use == 1
        two = sb.fork(count=2)
        held += two.sandboxes
        assert c.slots_in_use == 3
        with pytest.raises(forkbox.ResourceExhaustedError):
            c.sandbox(image=image, resources=RES)
        held.pop().close()
        assert c.slots_in_use == 2
        be = sb.fork(count=3, best_effort=True)
        assert len(be.children) == 3
        assert len(be.sandboxes) == 1
        assert sum(isinstance(e, forkbox.ResourceExhaustedError) for e in be.errors) == 2
        held += be.sandboxes
        assert c.slots_in_use == 3
    finally:
        for h in held:
            h.close()
    assert c.slots_in_use == 0


def test_port_url(client: forkbox.Client, daemon: Daemon, image: str) -> None:
    import time
    import urllib.error
    import urllib.request

    with client.sandbox(image=image, resources=RES, name="py-ports") as sb:
        sb.exec("mkdir -p /www && echo hello-from-py > /www/index.html").wait()
        sb.exec("httpd -p 8080 -h /www").wait()  # busybox httpd goes to the background
        p = sb.port_url(8080)
        assert sb.get_host(8080) == p.host and p.host.startswith(f"8080-{sb.id}.localhost:")
        assert sb.url(8080) == p.url and p.url.endswith("?forkbox_token=" + p.token)
        base = p.path_url.split("?")[0]

        def get(headers: dict) -> tuple:
            req = urllib.request.Request(base + "index.html", headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=60) as r:
                    return r.status, r.read().decode()
            except urllib.error.HTTPError as e:
                return e.code, e.read().decode()

        deadline = time.monotonic() + 60
        while True:
            code, body = get({"X-Forkbox-Port-Token": p.token})
            if code != 502 or time.monotonic() > deadline:
                break
            time.sleep(0.05)  # poll: httpd may not listen yet
        assert (code, body) == (200, "hello-from-py\n")
        # The daemon's API token works as a bearer too; nothing is 401.
        assert get({"Authorization": "Bearer " + daemon.token}) == (200, "hello-from-py\n")
        assert get({})[0] == 401
        with pytest.raises(forkbox.PermissionDeniedError):
            sb.url(7077)


def test_lifetime(client: forkbox.Client, image: str) -> None:
    with client.sandbox(image=image, resources=RES, name="py-life", timeout=300) as sb:
        assert sb.info.timeout == 300 and sb.info.expires_at is not None
        first = sb.info.expires_at
        info = sb.set_timeout(600)
        assert info.timeout == 600 and info.expires_at is not None and info.expires_at > first
        assert sb.set_timeout(0).timeout == 0
        with pytest.raises(ValueError):
            sb.set_timeout(-1)
        # A short deadline ends the sandbox: the daemon closes it.
        sb.set_timeout(0.2)
        deadline = time.monotonic() + 60
        while sb.refresh().state != "closed":
            assert time.monotonic() < deadline, f"still {sb.info.state} after its deadline"
            time.sleep(0.05)
        types = [e.type for e in client.events(sb.id)]
        assert "sandbox.expired" in types and "sandbox.closed" in types


def test_egress_lists(client: forkbox.Client, image: str) -> None:
    allow = ["10.9.0.0/16", "api.example.com"]
    with client.sandbox(
        image=image, resources=RES, name="py-egress", egress_allow=allow, egress_deny=["10.9.9.9"]
    ) as sb:
        assert (sb.info.egress, sb.info.egress_allow, sb.info.egress_deny) == (
            "allow",
            allow,
            ["10.9.9.9/32"],  # an address is kept as its /32
        )
        info = sb.set_egress(allow=["*.example.org"])
        assert (info.egress, info.egress_allow, info.egress_deny) == ("allow", ["*.example.org"], [])
        info = sb.set_egress("none")
        assert (info.egress, info.egress_allow) == ("none", [])
        with pytest.raises(forkbox.InvalidArgumentError):
            sb.set_egress(allow=["not a name!"])
        with sb.fork("egress") as child:
            assert child.info.egress == "none"


def test_metrics(client: forkbox.Client, image: str) -> None:
    with client.sandbox(image=image, resources=RES, name="py-metrics") as sb:
        m = sb.metrics()
        assert isinstance(m, forkbox.SandboxMetrics)
        assert (m.sandbox_id, m.name, m.state) == (sb.id, "py-metrics", "running")
        # Under gVisor the host cgroup's limit is the backstop above the
        # sandbox's own (the sentry is charged there too); crun's is exact.
        assert m.memory_limit_bytes >= 256 << 20 and m.memory_bytes > 0
        assert m.cpu_limit == 1 and m.pids > 0
        assert m.time is not None
        assert any(x.sandbox_id == sb.id for x in client.metrics())
