// sandbox.getMetrics() against a real daemon: every counter is read, and
// CPU time moves when the sandbox burns CPU.
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { isFailedPrecondition } from "../dist/index.js";
import { skipReason, useDaemon } from "./helpers/daemon.mjs";

describe("metrics", { skip: skipReason() }, () => {
  const d = useDaemon();

  it("reads a sandbox's counters", async () => {
    const sb = await d.client.sandbox({ image: d.image, resources: { cpu: "1", memory: "256Mi", disk: "128Mi" }, name: "ts-metrics" });
    try {
      const m0 = await sb.getMetrics();
      assert.equal(m0.sandboxId, sb.id);
      assert.equal(m0.cpuLimit, 1);
      assert.equal(m0.diskLimitBytes, 128 * 1024 * 1024);
      assert.ok(m0.memoryBytes > 0 && m0.memoryLimitBytes > 0 && m0.pids >= 1, JSON.stringify(m0));
      assert.deepEqual(m0.unavailable, {});
      assert.ok(m0.time instanceof Date);
      await sb.exec("i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done");
      const m1 = await sb.getMetrics();
      assert.ok(m1.cpuSeconds > m0.cpuSeconds, `cpu ${m0.cpuSeconds} -> ${m1.cpuSeconds}`);
    } finally {
      await sb.close();
    }
    await assert.rejects(sb.getMetrics(), (e) => isFailedPrecondition(e));
  });
});
