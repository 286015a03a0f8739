// Every result the SDK hands its users is a plain object: numbers and Dates,
// no protobuf `$typeName`, no BigInt, so JSON.stringify works on each of them.
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { ExecError, ForkboxError } from "../dist/index.js";
import { skipReason, useDaemon } from "./helpers/daemon.mjs";

/** Asserts v (and everything under it) is plain, and that JSON.stringify(v) works; returns the JSON. */
function assertPlain(what, v) {
  const walk = (x, path, seen) => {
    assert.notEqual(typeof x, "bigint", `${what}${path} is a BigInt`);
    if (x === null || typeof x !== "object" || x instanceof Date || x instanceof Uint8Array) return;
    if (seen.has(x)) return;
    seen.add(x);
    assert.ok(!Object.hasOwn(x, "$typeName"), `${what}${path} has $typeName (a protobuf message)`);
    const json = typeof x.toJSON === "function" ? x.toJSON() : x;
    if (json !== x) return walk(json, `${path}.toJSON()`, seen);
    for (const [k, val] of Object.entries(x)) walk(val, `${path}.${k}`, seen);
  };
  walk(v, "", new Set());
  let text;
  assert.doesNotThrow(() => { text = JSON.stringify(v); }, `JSON.stringify(${what})`);
  assert.ok(!text.includes("$typeName"), `${what} serializes $typeName`);
  return text;
}

describe("plain results", { skip: skipReason() }, () => {
  const d = useDaemon();
  const resources = { cpu: "1", memory: "256Mi", pids: 512 };

  it("every SDK result is a plain, JSON-serializable object", async () => {
    const c = d.client;
    const progress = [];
    // The archive's bytes: a gateway (like a daemon over TCP) reads no host path.
    const archive = readFileSync(d.archive);
    assertPlain("importImage()", await c.importImage(archive, { onProgress: (p) => progress.push(p) }));
    assert.ok(progress.length > 0);
    assertPlain("importImage onProgress", progress);
    const images = await c.listImages();
    assertPlain("listImages()", images);
    assert.equal(typeof images[0].size, "number");
    assert.ok(images[0].createdAt instanceof Date);

    const sb = await c.sandbox({ image: d.image, resources, name: "ts-plain", env: { A: "1" } });
    const closers = [sb];
    try {
      assertPlain("sandbox()", sb);
      assertPlain("sb.info", sb.info);
      assert.ok(sb.info.createdAt instanceof Date);
      assert.equal(sb.info.resources.pids, 512);
      const parsed = JSON.parse(JSON.stringify(sb));
      assert.equal(parsed.id, sb.id);
      assert.equal(parsed.info.name, "ts-plain");

      assertPlain("exec()", await sb.exec("echo hi > /root/f; echo out"));
      const failed = await sb.exec("exit 3").catch((e) => e);
      assert.ok(failed instanceof ExecError);
      assert.equal(JSON.parse(assertPlain("ExecError", failed)).exitCode, 3);
      await sb.writeFile("/root/g", "g");
      assertPlain("readFile()", await sb.readFile("/root/g"));
      const files = await sb.listFiles("/root");
      assertPlain("listFiles()", files);
      assert.equal(typeof files[0].size, "number");
      assert.ok(files[0].mtime instanceof Date);

      assertPlain("credentials.set()", await sb.credentials.set("KEY", "v"));
      assertPlain("credentials.list()", await sb.credentials.list());

      const ck = await sb.checkpoint("plain");
      assertPlain("checkpoint()", ck);
      assert.equal(typeof ck.size, "number");
      assert.ok(ck.createdAt instanceof Date);
      assertPlain("listCheckpoints()", await sb.listCheckpoints());

      const many = await sb.forkMany({ tag: "plain-fork", count: 1 });
      closers.push(...many.children.map((ch) => ch.sandbox).filter(Boolean));
      assertPlain("forkMany()", many);
      const child = await sb.fork();
      closers.push(child);
      assertPlain("fork()", child);

      await sb.pause();
      assertPlain("info after pause()", sb.info);
      await sb.unpause();
      assertPlain("refresh()", await sb.refresh());
      assertPlain("getSandbox()", await c.getSandbox(sb.id));
      assertPlain("listSandboxes()", await c.listSandboxes());
      assertPlain("listSandboxes(all)", await c.listSandboxes(true));
      const events = await sb.events();
      assertPlain("events()", events);
      assert.equal(typeof events[0].seq, "number");
      assert.ok(events[0].time instanceof Date);
      assert.equal(events[0].type, "sandbox.created");
      assertPlain("client.events()", await c.events(sb.id));

      const restored = await c.restoreSnapshot(ck.id);
      closers.push(restored);
      assertPlain("restoreSnapshot()", restored);

      const err = await c.getSandbox("sb-nope").catch((e) => e);
      assert.ok(err instanceof ForkboxError);
      assert.deepEqual(JSON.parse(assertPlain("ForkboxError", err)).code, "NotFound");
    } finally {
      for (const h of closers) await h.close();
    }
    const resumed = await c.resume("ts-plain");
    try {
      assertPlain("resume()", resumed);
      assertPlain("resume().resumed", resumed.resumed);
    } finally {
      await resumed.close();
    }
  });

  it("environment results are plain too", async () => {
    const env = d.client.environment("ts-plain-env", {
      image: d.image, resources: { cpu: "1", memory: "256Mi" }, maxAge: "1h",
      setup: ["echo built > /root/env", { path: "/root/cfg", content: "x" }],
    });
    const progress = [];
    const built = await env.build((p) => progress.push(p));
    assertPlain("env.build()", built);
    assertPlain("env.build onProgress", progress);
    const info = await env.info();
    assertPlain("env.info()", info);
    assert.ok(info.builtAt instanceof Date);
    assert.equal(info.definition.maxAgeSeconds, 3600);
    const sb = await env.sandbox();
    try {
      assertPlain("env.sandbox()", sb);
      assertPlain("handover", sb.handover);
    } finally {
      await sb.close();
    }
    const fnEnv = d.client.environment("ts-plain-fn", {
      image: d.image, resources: { cpu: "1", memory: "256Mi" },
      setup: async (b) => { await b.exec("echo fn > /root/fn"); },
    });
    assertPlain("env.build() with a setup function", await fnEnv.build());
    await env.delete();
    await fnEnv.delete();
  });
});
