// Sandbox lifetimes through the SDK: timeoutMs at create, setTimeout
// (E2B's semantics: the deadline becomes now + timeout), and expiry.
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { isInvalidArgument } from "../dist/index.js";
import { skipReason, useDaemon } from "./helpers/daemon.mjs";

describe("lifetimes", { skip: skipReason() }, () => {
  const d = useDaemon();
  const res = { cpu: "1", memory: "256Mi" };

  it("sets, extends and expires", async () => {
    const before = Date.now();
    const sb = await d.client.sandbox({ image: d.image, resources: res, name: "ts-life", timeoutMs: 600_000 });
    try {
      assert.equal(sb.info.timeoutMs, 600_000);
      assert.equal(sb.info.onTimeout, "close");
      assert.ok(sb.info.expiresAt instanceof Date, "expiresAt set");
      assert.ok(sb.info.expiresAt.getTime() >= before + 600_000, `expiresAt ${sb.info.expiresAt} is before now + 10m`);
      const t = Date.now();
      const at = await sb.setTimeout(3_600_000);
      assert.ok(at.getTime() >= t + 3_600_000, `after setTimeout: ${at}, want now + 1h`);
      assert.equal((await sb.refresh()).expiresAt?.getTime(), at.getTime());
      assert.equal(JSON.parse(JSON.stringify(sb.info)).timeoutMs, 3_600_000);
      await assert.rejects(sb.setTimeout(-1), (e) => isInvalidArgument(e));
      // A short timeout: the daemon closes the sandbox and says why.
      await sb.setTimeout(200);
      const deadline = Date.now() + 60_000;
      let evs = [];
      while (Date.now() < deadline) {
        evs = await sb.events();
        if (evs.some((e) => e.type === "sandbox.closed")) break;
        await new Promise((r) => setTimeout(r, 100)); // a poll interval
      }
      const expired = evs.find((e) => e.type === "sandbox.expired");
      assert.ok(expired, `no sandbox.expired in ${evs.map((e) => e.type)}`);
      assert.equal(expired.data.action, "close");
      assert.equal(expired.data.reason, "timeout");
      assert.ok(evs.some((e) => e.type === "sandbox.closed"), "not closed");
    } finally {
      await sb.close();
    }
  });

  it("refuses hibernate on crun", async () => {
    await assert.rejects(
      d.client.sandbox({ image: d.image, resources: res, runtime: "crun", onTimeout: "hibernate", timeoutMs: 1000 }),
      (e) => isInvalidArgument(e),
    );
  });
});
