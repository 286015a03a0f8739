// E2B's JavaScript SDK (npm "e2b", the version pinned in package-lock.json),
// unmodified, against a real forkbox daemon's E2B-compatible endpoint:
// sandboxes from an image (gVisor) and from an environment (one per
// runtime), commands, files, watch, fork, timeout, list, pause and connect,
// metrics, kill, and the errors E2B's SDK maps to its error classes.
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { Sandbox, CommandExitError, NotFoundError, AuthenticationError, SandboxError } from "e2b";
import { useE2BDaemon, skipReason } from "./helpers/daemon.mjs";

const skip = skipReason();

/** Polls cond until it holds (an error counts as not yet), failing after a generous deadline. */
async function waitFor(cond, what) {
  const deadline = Date.now() + 20_000;
  for (;;) {
    if (await Promise.resolve().then(cond).catch(() => false)) return;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

describe("E2B SDK against forkbox serve --e2b", { skip }, () => {
  const d = useE2BDaemon();
  const created = [];
  const make = async (template, opts = {}) => {
    const sb = await Sandbox.create(template, { timeoutMs: 300_000, ...opts });
    created.push(sb);
    return sb;
  };

  // The image starts on the daemon's default runtime (gVisor); the crun
  // environment runs the same scenarios on crun.
  for (const [where, template] of [["image, gVisor", "image"], ["environment, crun", "crun"]]) {
    const tmpl = () => (template === "image" ? d.image : d.envs.crun);
    it(`runs commands (${where}): exit codes, streaming, stdin, background + kill`, async () => {
      const sb = await make(tmpl(), { metadata: { suite: "e2b", kind: template }, envs: { GREETING: "hi" } });
      const r = await sb.commands.run("echo $GREETING; echo oops >&2");
      assert.equal(r.exitCode, 0);
      assert.equal(r.stdout, "hi\n");
      assert.equal(r.stderr, "oops\n");

      await assert.rejects(sb.commands.run("echo partial; exit 7"), (err) => {
        assert.ok(err instanceof CommandExitError, `got ${err}`);
        assert.equal(err.exitCode, 7);
        assert.equal(err.stdout, "partial\n");
        return true;
      });

      const out = [];
      const errs = [];
      await sb.commands.run("for i in 1 2 3; do echo out$i; echo err$i >&2; done", {
        onStdout: (s) => out.push(s),
        onStderr: (s) => errs.push(s),
      });
      assert.equal(out.join(""), "out1\nout2\nout3\n");
      assert.equal(errs.join(""), "err1\nerr2\nerr3\n");

      const cat = await sb.commands.run("read line; echo got:$line; cat", { background: true, stdin: true });
      await sb.commands.sendStdin(cat.pid, "first\n");
      await sb.commands.sendStdin(cat.pid, "second\n");
      await sb.commands.closeStdin(cat.pid);
      const done = await cat.wait();
      assert.equal(done.stdout, "got:first\nsecond\n");

      const bg = await sb.commands.run("echo started; sleep 600", { background: true });
      await waitFor(() => bg.stdout.includes("started"), "background output");
      const listed = await sb.commands.list();
      assert.ok(listed.some((p) => p.pid === bg.pid), `pid ${bg.pid} not in ${JSON.stringify(listed)}`);
      assert.equal(await sb.commands.kill(bg.pid), true);
      await assert.rejects(bg.wait(), (err) => err instanceof CommandExitError);
      assert.equal(await sb.commands.kill(bg.pid), false, "a second kill finds no process");
    });

    it(`moves files (${where}): text, binary, ~5 MB, list with depth, remove, rename, watch`, async () => {
      const sb = await make(tmpl());
      await sb.files.write("/work/hello.txt", "hello e2b");
      assert.equal(await sb.files.read("/work/hello.txt"), "hello e2b");
      const bin = new Uint8Array(256).map((_, i) => i);
      await sb.files.write("/work/bin.dat", bin.buffer);
      assert.deepEqual(await sb.files.read("/work/bin.dat", { format: "bytes" }), bin);
      const big = new Uint8Array(5 << 20).map((_, i) => (i * 7) & 0xff);
      await sb.files.write("/work/big.dat", new Blob([big]));
      const back = await sb.files.read("/work/big.dat", { format: "bytes" });
      assert.equal(back.length, big.length);
      assert.ok(Buffer.from(back).equals(Buffer.from(big)), "the 5 MB file came back changed");
      assert.equal((await sb.commands.run("wc -c < /work/big.dat")).stdout.trim(), String(5 << 20));

      assert.equal(await sb.files.makeDir("/work/sub/deeper"), true);
      assert.equal(await sb.files.makeDir("/work/sub/deeper"), false, "makeDir of an existing dir");
      await sb.files.write("/work/sub/deeper/x.txt", "x");
      const top = (await sb.files.list("/work")).map((e) => e.name).sort();
      assert.deepEqual(top, ["big.dat", "bin.dat", "hello.txt", "sub"]);
      const deep = (await sb.files.list("/work", { depth: 3 })).map((e) => e.path).sort();
      assert.ok(deep.includes("/work/sub/deeper/x.txt"), `depth 3 lists ${deep}`);
      const info = await sb.files.getInfo("/work/hello.txt");
      assert.equal(info.size, 9);
      assert.equal(info.type, "file");
      await sb.files.rename("/work/hello.txt", "/work/renamed.txt");
      assert.equal(await sb.files.exists("/work/hello.txt"), false);
      assert.equal(await sb.files.exists("/work/renamed.txt"), true);
      await sb.files.remove("/work/sub");
      assert.equal(await sb.files.exists("/work/sub"), false);
      await assert.rejects(sb.files.read("/work/missing"), (err) => err instanceof NotFoundError);

      const events = [];
      const w = await sb.files.watchDir("/work", (e) => events.push(`${e.type} ${e.name}`), { recursive: true });
      await sb.files.write("/work/new.txt", "n");
      await sb.commands.run("echo more >> /work/renamed.txt; rm /work/bin.dat");
      await waitFor(() => ["create new.txt", "write renamed.txt", "remove bin.dat"].every((x) => events.includes(x)),
        `watch events (got ${events})`);
      await w.stop();
    });
  }

  for (const rt of ["gvisor", "crun"]) {
    it(`creates from an environment (${rt}), forks 3 children with the parent's state, pauses and connects`, async () => {
      const sb = await make(d.envs[rt], { metadata: { suite: "e2b", runtime: rt } });
      const marker = await sb.commands.run("cat /opt/env/marker").catch((err) => err);
      assert.equal(marker.stdout, "built-by-env\n", `env sandbox: ${marker.stderr ?? marker}`);
      await sb.files.write("/state/parent.txt", `parent on ${rt}`);

      const children = await sb.fork({ count: 3, timeoutMs: 120_000 });
      assert.equal(children.length, 3);
      const ids = new Set();
      for (const [i, c] of children.entries()) {
        assert.ok(c instanceof Sandbox, `fork ${i}: ${c}`);
        created.push(c);
        ids.add(c.sandboxId);
        assert.equal(await c.files.read("/state/parent.txt"), `parent on ${rt}`);
        await c.files.write("/state/child.txt", `child ${i}`);
      }
      assert.equal(ids.size, 3);
      for (const [i, c] of children.entries()) assert.equal(await c.files.read("/state/child.txt"), `child ${i}`);
      assert.equal(await sb.files.exists("/state/child.txt"), false, "a child's write reached the parent");

      // The SDK hides it; the REST answer says what the fork captured.
      const res = await fetch(`${d.url}/sandboxes/${sb.sandboxId}/fork`, { method: "POST",
        headers: { "X-API-Key": d.key, "Content-Type": "application/json" }, body: JSON.stringify({ count: 1, timeout: 60 }) });
      assert.equal(res.status, 201);
      const [one] = await res.json();
      assert.equal(one.forkbox.captured, rt === "gvisor" ? "filesystem+memory" : "filesystem");
      created.push(await Sandbox.connect(one.sandbox.sandboxID));

      const bg = await sb.commands.run("while true; do date +%s%N >> /state/ticks; sleep 0.05; done", { background: true, timeoutMs: 0 });
      await waitFor(async () => (await sb.files.read("/state/ticks")).split("\n").length > 3, "ticks before pause");
      assert.equal(await sb.betaPause(), true);
      assert.equal((await Sandbox.getInfo(sb.sandboxId)).state, "paused");
      assert.equal(await sb.betaPause(), false, "a second pause");
      const again = await Sandbox.connect(sb.sandboxId);
      assert.equal((await Sandbox.getInfo(sb.sandboxId)).state, "running");
      assert.equal(await again.files.read("/state/parent.txt"), `parent on ${rt}`);
      assert.equal((await again.commands.run("echo alive")).stdout, "alive\n");
      // The background process ran on: a freeze keeps its stream; after a
      // gVisor hibernation the endpoint reattaches to it.
      const ticks = async () => (await again.files.read("/state/ticks")).trim().split("\n").length;
      const n = await ticks();
      await waitFor(async () => (await ticks()) > n + 2, "the background process ticking after connect");
      assert.ok((await again.commands.list()).some((p) => p.pid === bg.pid), "the process is listed after connect");
      await again.commands.kill(bg.pid);
      await assert.rejects(bg.wait(), (err) => err instanceof CommandExitError && err.exitCode === -1);
    });
  }

  it("lists with filters and pages, sets timeouts, reads metrics, kills", async () => {
    const a = await make(d.image, { metadata: { suite: "list", n: "1" } });
    const b = await make(d.image, { metadata: { suite: "list", n: "2" } });
    const mine = await Sandbox.list({ query: { metadata: { suite: "list" } } }).nextItems();
    assert.deepEqual(mine.map((s) => s.sandboxId).sort(), [a.sandboxId, b.sandboxId].sort());
    assert.deepEqual(mine.find((s) => s.sandboxId === a.sandboxId).metadata, { suite: "list", n: "1" });
    const pager = Sandbox.list({ query: { metadata: { suite: "list" } }, limit: 1 });
    const p1 = await pager.nextItems();
    assert.equal(pager.hasNext, true);
    const p2 = await pager.nextItems();
    assert.equal(p1.length + p2.length, 2);
    assert.notEqual(p1[0].sandboxId, p2[0].sandboxId);

    const before = (await a.getInfo()).endAt.getTime();
    await a.setTimeout(600_000);
    const after = (await a.getInfo()).endAt.getTime();
    assert.ok(after > before + 200_000, `endAt ${new Date(before)} → ${new Date(after)}`);

    await a.commands.run("i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done");
    const m = await a.getMetrics();
    assert.ok(m.length >= 1);
    assert.ok(m[0].memUsed > 0 && m[0].cpuCount >= 1, JSON.stringify(m[0]));

    await b.kill();
    assert.equal(await b.isRunning(), false);
    await assert.rejects(Sandbox.getInfo(b.sandboxId), (err) => err instanceof NotFoundError);
    await assert.rejects(b.commands.run("true"), (err) => err instanceof SandboxError);
  });

  it("refuses a wrong API key, a wrong access token, an unknown template, and what it does not serve", async () => {
    await assert.rejects(Sandbox.create(d.image, { apiKey: "e2b_wrong" }), (err) => err instanceof AuthenticationError);
    await assert.rejects(Sandbox.create("no-such-template"), (err) => err instanceof NotFoundError || /404/.test(err.message));
    await assert.rejects(Sandbox.create(d.image, { mcp: { foo: {} } }), /forkbox/);
    const sb = await make(d.image);
    const other = await make(d.image);
    const forged = await Sandbox.connect(sb.sandboxId);
    forged.envdAccessToken = other.envdAccessToken;
    await assert.rejects(forged.commands.run("true"), (err) => err instanceof AuthenticationError);
    await assert.rejects(sb.commands.run("true", { user: "user" }), /forkbox runs commands/);
  });
});
