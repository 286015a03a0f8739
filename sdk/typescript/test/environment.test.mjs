// Environments against a real daemon: server-run steps (built once, then
// forked), a client-run async setup function (concurrent callers make one
// build), a failing setup, and the warm pool.
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { Client } from "../dist/index.js";
import { skipReason, useDaemon } from "./helpers/daemon.mjs";

describe("environments", { skip: skipReason() }, () => {
  const d = useDaemon();
  const resources = { cpu: "1", memory: "256Mi" };

  it("builds steps once; later sandboxes are forks of the snapshot", async () => {
    const env = d.client.environment("ts-steps", {
      image: d.image, resources, env: { MODE: "steps" },
      setup: ["mkdir -p /app && echo hello > /app/hello", { path: "/app/cfg.json", content: '{"a":1}' }],
    });
    const a = await env.sandbox();
    try {
      assert.equal(a.handover.built, true);
      assert.equal((await a.exec("cat /app/hello /app/cfg.json; echo $MODE")).stdout, 'hello\n{"a":1}steps\n');
      await a.exec("echo mine > /app/hello");
      const b = await env.sandbox();
      try {
        assert.equal(b.handover.built, false);
        assert.notEqual(b.id, a.id);
        assert.equal((await b.exec("cat /app/hello")).stdout, "hello\n");
      } finally {
        await b.close();
      }
    } finally {
      await a.close();
    }
    const info = await env.info();
    assert.equal(info.state, "ready");
    assert.match(info.checkpoint, /^ck-/);
    const again = await env.build();
    assert.equal(again.built, false);
    assert.equal(again.environment.hash, info.hash);
  });

  it("reports a failing step as a typed error", async () => {
    const env = d.client.environment("ts-badstep", { image: d.image, resources, setup: ["echo no >&2; exit 7"] });
    await assert.rejects(env.sandbox(), (e) => {
      assert.equal(e.code, "FailedPrecondition");
      assert.match(e.message, /exited 7/);
      return true;
    });
  });

  it("runs an async setup function once for concurrent callers", async () => {
    let runs = 0;
    const setup = async (sb) => {
      runs++;
      await sb.exec("mkdir -p /site && echo 1.26.4 > /site/numpy.version");
      await sb.writeFile("/site/by", "setup-fn");
    };
    // Two clients of the same server (as two processes would have), each
    // with its Environment: the server makes the second caller wait for
    // the first one's build.
    const opts = { image: d.image, resources, setup };
    const [a, b] = await Promise.all([
      d.client.environment("ts-fn", opts).sandbox(),
      new Client(d.clientOptions).environment("ts-fn", opts).sandbox(),
    ]);
    try {
      assert.equal(runs, 1);
      assert.deepEqual([a.handover.built, b.handover.built].sort(), [false, true]);
      for (const sb of [a, b]) {
        assert.equal((await sb.exec("cat /site/numpy.version /site/by")).stdout, "1.26.4\nsetup-fn");
      }
      const c = await d.client.environment("ts-fn", opts).sandbox();
      assert.equal(c.handover.built, false);
      await c.close();
      assert.equal(runs, 1);
    } finally {
      await a.close();
      await b.close();
    }
  });

  it("a throwing setup function fails the build and the next call retries it", async () => {
    let attempts = 0;
    const flaky = async (sb) => {
      attempts++;
      await sb.exec("echo try > /root/t");
      if (attempts === 1) throw new Error("setup broke");
    };
    const env = d.client.environment("ts-flaky", { image: d.image, resources, setup: flaky });
    await assert.rejects(env.sandbox(), /setup broke/);
    const sb = await env.sandbox();
    try {
      assert.equal(attempts, 2);
      assert.equal(sb.handover.built, true);
      assert.equal((await sb.exec("cat /root/t")).stdout, "try\n");
    } finally {
      await sb.close();
    }
    const live = await d.client.listSandboxes();
    assert.ok(!live.some((s) => s.name.startsWith("build-ts-flaky")), "builder sandboxes left running");
  });

  it("hands over from the warm pool", async () => {
    const env = d.client.environment("ts-pool", { image: d.image, resources, poolSize: 1, setup: ["echo pooled > /root/p"] });
    try {
      const first = await env.sandbox();
      await first.close();
      // The pool refills in the background: wait for it, bounded.
      const deadline = Date.now() + 60_000;
      while ((await env.info()).poolReady < 1) {
        assert.ok(Date.now() < deadline, "the pool did not refill");
        await new Promise((r) => setTimeout(r, 200));
      }
      const sb = await env.sandbox();
      try {
        assert.equal(sb.handover.fromPool, true);
        assert.equal((await sb.exec("cat /root/p")).stdout, "pooled\n");
      } finally {
        await sb.close();
      }
    } finally {
      // A failure above leaves no pool behind for the later tests.
      await env.delete();
    }
  });
});
