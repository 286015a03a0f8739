// The SDK's sandbox surface against a real daemon: create, exec (awaited,
// piped, failing), typed errors, fork, checkpoints, restore vs resume,
// credentials, pause, maxConcurrency.
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { Client, ExecError, ForkboxError, isNotFound, isInvalidArgument, isResourceExhausted } from "../dist/index.js";
import { capture, skipReason, useDaemon } from "./helpers/daemon.mjs";

describe("sandboxes", { skip: skipReason() }, () => {
  const d = useDaemon();
  const res = { cpu: "1", memory: "256Mi" };

  it("creates, execs and closes", async () => {
    const sb = await d.client.sandbox({ image: d.image, resources: res, name: "ts-basic", env: { GREETING: "hi" } });
    try {
      assert.match(sb.id, /^sb-/);
      assert.equal(sb.name, "ts-basic");
      const r = await sb.exec("echo $GREETING; echo oops >&2");
      assert.equal(r.exitCode, 0);
      assert.equal(r.stdout, "hi\n");
      assert.equal(r.stderr, "oops\n");
      assert.equal(r.timedOut, false);
      assert.equal(r.oomKilled, false);
      assert.ok(r.durationMs >= 0);
      const argv = await sb.exec(["echo", "a b", "c"]);
      assert.equal(argv.stdout, "a b c\n");
      await sb.writeFile("/root/f.txt", "content");
      assert.equal(await sb.readFile("/root/f.txt", "utf8"), "content");
      assert.equal((await sb.exec("cat /root/f.txt")).stdout, "content");
      const stdin = await sb.exec("cat", { stdin: "from stdin" });
      assert.equal(stdin.stdout, "from stdin");
    } finally {
      await sb.close();
    }
    await sb.close(); // a second close is a no-op
    const live = await d.client.listSandboxes();
    assert.ok(!live.some((s) => s.id === sb.id), "closed sandbox still listed");
  });

  it("streams output with pipe()", async () => {
    const sb = await d.client.sandbox({ image: d.image, resources: res, name: "ts-pipe" });
    try {
      const out = capture();
      const err = capture();
      const r = await sb.exec("for i in 1 2 3; do echo line $i; sleep 0.2; done; echo bad >&2").pipe(out, err);
      assert.equal(out.text(), "line 1\nline 2\nline 3\n");
      assert.ok(out.writes() >= 2, `want output streamed in several chunks, got ${out.writes()}`);
      assert.equal(err.text(), "bad\n");
      assert.equal(r.stdout, out.text());
    } finally {
      await sb.close();
    }
  });

  it("rejects a failing command with ExecError, unless nothrow", async () => {
    const sb = await d.client.sandbox({ image: d.image, resources: res, name: "ts-fail" });
    try {
      await assert.rejects(sb.exec("echo partial; echo why >&2; exit 3"), (e) => {
        assert.ok(e instanceof ExecError);
        assert.equal(e.exitCode, 3);
        assert.equal(e.result.stdout, "partial\n");
        assert.match(e.message, /exited with code 3: why/);
        return true;
      });
      const r = await sb.exec("exit 4", { nothrow: true });
      assert.equal(r.exitCode, 4);
      const t = await sb.exec("sleep 5", { timeoutMs: 300, nothrow: true });
      assert.equal(t.timedOut, true);
      // .then() chains stop at a failing step, as in the seed.
      let ran = false;
      await assert.rejects(sb.exec("false").then(() => { ran = true; }), ExecError);
      assert.equal(ran, false);
    } finally {
      await sb.close();
    }
  });

  it("maps daemon errors to typed ForkboxErrors", async () => {
    await assert.rejects(d.client.getSandbox("sb-doesnotexist"), (e) => {
      assert.ok(e instanceof ForkboxError);
      assert.equal(e.code, "NotFound");
      assert.ok(isNotFound(e));
      return true;
    });
    await assert.rejects(d.client.sandbox({ image: d.image, resources: { cpu: "1", memory: "lots" } }), (e) => {
      assert.equal(e.code, "InvalidArgument");
      assert.ok(isInvalidArgument(e));
      return true;
    });
    await assert.rejects(d.client.sandbox({ image: "forkbox.local/nope:latest" }), (e) => e.code === "NotFound");
    const ghost = await d.client.sandbox({ image: d.image, resources: res, name: "ts-ghost" });
    await ghost.close();
    await assert.rejects(ghost.exec("true"), (e) => e instanceof ForkboxError && e.code !== "Unknown");
    await assert.rejects(d.client.restoreSnapshot("ck-nope"), (e) => e.code === "NotFound");
    const bad = new Client({ socket: "/nonexistent/forkbox.sock" });
    await assert.rejects(bad.listSandboxes(), (e) => e.code === "Unavailable");
  });

  it("forks: the child sees the parent's files and diverges", async () => {
    const sb = await d.client.sandbox({ image: d.image, resources: res, name: "ts-parent" });
    try {
      await sb.exec("echo base > /root/state");
      const child = await sb.fork("after-base");
      try {
        assert.notEqual(child.id, sb.id);
        assert.match(child.name, /^fork-ts-parent-/);
        assert.equal(child.info.parentId, sb.id);
        assert.equal((await child.exec("cat /root/state")).stdout, "base\n");
        await child.exec("echo child > /root/state");
        await sb.exec("echo parent > /root/state");
        assert.equal((await child.exec("cat /root/state")).stdout, "child\n");
        assert.equal((await sb.exec("cat /root/state")).stdout, "parent\n");
      } finally {
        await child.close();
      }
      const many = await sb.forkMany({ tag: "three", count: 3, overrides: { env: { ROLE: "worker" } } });
      assert.equal(many.children.length, 3);
      assert.equal(many.captured, "filesystem");
      try {
        for (const c of many.children) {
          assert.ok(c.sandbox, `child failed: ${c.error?.message}`);
          assert.equal((await c.sandbox.exec("echo $ROLE; cat /root/state")).stdout, "worker\nparent\n");
        }
      } finally {
        await Promise.all(many.children.map((c) => c.sandbox?.close()));
      }
      const tags = (await sb.listCheckpoints()).map((c) => c.tag);
      assert.deepEqual(tags.filter((t) => t === "after-base" || t === "three"), ["after-base", "three"]);
    } finally {
      await sb.close();
    }
  });

  it("streams a fork's children as they are ready (forkStream)", async () => {
    const sb = await d.client.sandbox({ image: d.image, resources: res, name: "ts-stream" });
    const kids = [];
    try {
      await sb.exec("echo streamed > /root/s");
      const types = [];
      const indices = new Set();
      for await (const ev of sb.forkStream({ tag: "streamed", count: 3 })) {
        types.push(ev.type);
        if (ev.type === "captured") {
          assert.equal(ev.captured, "filesystem");
          assert.equal(ev.count, 3);
          assert.ok(ev.checkpoint?.id);
        } else if (ev.type === "child") {
          assert.ok(ev.child.sandbox, `child ${ev.index} failed: ${ev.child.error?.message}`);
          kids.push(ev.child.sandbox);
          assert.ok(!indices.has(ev.index), `child ${ev.index} twice`);
          indices.add(ev.index);
          // Usable as it arrives, while its siblings may still start.
          assert.equal((await ev.child.sandbox.exec("cat /root/s")).stdout, "streamed\n");
        } else {
          assert.equal(ev.started, 3);
          assert.equal(ev.failed, 0);
        }
      }
      assert.deepEqual(types, ["captured", "child", "child", "child", "done"]);
    } finally {
      await Promise.all(kids.map((k) => k.close()));
      await sb.close();
    }
  });

  it("checkpoints, restores (clean history) and resumes (replayed)", async () => {
    const sb = await d.client.sandbox({ image: d.image, resources: res, name: "ts-session" });
    let restored, resumed;
    try {
      await sb.exec("echo one > /root/a");
      const ck = await sb.checkpoint("ready");
      assert.match(ck.id, /^ck-/);
      assert.equal(ck.tag, "ready");
      const list = await sb.listCheckpoints();
      assert.ok(list.some((c) => c.id === ck.id));
      await sb.exec("echo two >> /root/a");
      await sb.close();

      restored = await d.client.restoreSnapshot(ck.id);
      assert.equal((await restored.exec("cat /root/a")).stdout, "one\n");

      resumed = await d.client.resume("ts-session");
      assert.equal(resumed.resumed.checkpoint?.id, ck.id);
      assert.equal(resumed.resumed.replayed.length, 1);
      assert.equal((await resumed.exec("cat /root/a")).stdout, "one\ntwo\n");
    } finally {
      await sb.close();
      await restored?.close();
      await resumed?.close();
    }
    await assert.rejects(
      (async () => {
        const fresh = await d.client.sandbox({ image: d.image, resources: res, name: "ts-nock" });
        await fresh.close();
        await d.client.resume("ts-nock");
      })(),
      (e) => e.code === "FailedPrecondition",
    );
  });

  it("carries credentials to forks; per-fork ones must be supplied", async () => {
    const sb = await d.client.sandbox({ image: d.image, resources: res, name: "ts-creds" });
    try {
      await sb.credentials.set("API_KEY", "s3cret");
      await sb.credentials.set("token", "parent-token", { file: "token", perFork: true });
      const names = (await sb.credentials.list()).map((c) => c.name).sort();
      assert.deepEqual(names, ["API_KEY", "token"]);
      assert.equal((await sb.exec("echo $API_KEY; cat /run/secrets/token")).stdout, "s3cret\nparent-token");
      await assert.rejects(sb.fork("no-token"), (e) => e.code === "FailedPrecondition");
      const res1 = await sb.forkMany({ tag: "with-token", credentials: { token: "child-token" } });
      const child = res1.children[0].sandbox;
      assert.ok(child, res1.children[0].error?.message);
      try {
        assert.equal((await child.exec("echo $API_KEY; cat /run/secrets/token")).stdout, "s3cret\nchild-token");
      } finally {
        await child.close();
      }
    } finally {
      await sb.close();
    }
  });

  it("pauses and unpauses", async () => {
    const sb = await d.client.sandbox({ image: d.image, resources: res, name: "ts-pause" });
    try {
      await sb.pause();
      assert.equal(sb.info.state, "paused");
      const child = await sb.fork("while-paused");
      await child.close();
      await sb.unpause();
      assert.equal(sb.info.state, "running");
      assert.equal((await sb.exec("echo alive")).stdout, "alive\n");
    } finally {
      await sb.close();
    }
  });

  it("bounds live sandboxes with maxConcurrency", async () => {
    const c = new Client({ ...d.clientOptions, maxConcurrency: 3 });
    const sb = await c.sandbox({ image: d.image, resources: res, name: "ts-slots" });
    const held = [sb];
    try {
      assert.equal(c.slotsInUse, 1);
      await assert.rejects(sb.forkMany({ count: 3 }), (e) => isResourceExhausted(e));
      assert.equal(c.slotsInUse, 1);
      const two = await sb.forkMany({ count: 2 });
      held.push(...two.children.map((ch) => ch.sandbox));
      assert.equal(c.slotsInUse, 3);
      await assert.rejects(c.sandbox({ image: d.image, resources: res }), (e) => e.code === "ResourceExhausted");
      await held.pop().close();
      assert.equal(c.slotsInUse, 2);
      const be = await sb.forkMany({ count: 3, bestEffort: true });
      assert.equal(be.children.length, 3);
      assert.equal(be.children.filter((ch) => ch.sandbox).length, 1);
      assert.equal(be.children.filter((ch) => ch.error?.code === "ResourceExhausted").length, 2);
      held.push(...be.children.filter((ch) => ch.sandbox).map((ch) => ch.sandbox));
      assert.equal(c.slotsInUse, 3);
    } finally {
      for (const h of held) await h?.close();
    }
    assert.equal(c.slotsInUse, 0);
  });
});
