// How much exec output the SDK keeps: the result holds at most
// maxOutputBytes of each stream (its tail, flagged truncated) while pipe()
// streams everything; and a socket the caller may not open is
// PermissionDenied, not Unavailable.
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { chmodSync, mkdtempSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { Writable } from "node:stream";
import { ConnectError, Code } from "@connectrpc/connect";
import { DEFAULT_MAX_OUTPUT_BYTES, ForkboxError, isPermissionDenied } from "../dist/index.js";
import { TailBuffer, merged } from "../dist/tail.js";
import { skipReason, useDaemon } from "./helpers/daemon.mjs";

const MiB = 1 << 20;

/** A writable that counts bytes and checks every one is `x`, keeping none. */
function counter() {
  let n = 0;
  let other = 0;
  const w = new Writable({
    write(chunk, _enc, cb) {
      n += chunk.length;
      for (const b of chunk) if (b !== 0x78) other++;
      cb();
    },
  });
  w.bytes = () => n;
  w.other = () => other;
  return w;
}

describe("TailBuffer", () => {
  const enc = (s) => new TextEncoder().encode(s);

  it("keeps everything under the bound", () => {
    const t = new TailBuffer(10);
    t.push(0, enc("abc"));
    t.push(1, enc("def"));
    assert.equal(t.text(), "abcdef");
    assert.equal(t.truncated, false);
  });

  it("keeps the last bytes, cutting the first kept chunk", () => {
    const t = new TailBuffer(5);
    for (const [i, s] of ["abc", "def", "ghi"].entries()) t.push(i, enc(s));
    assert.equal(t.text(), "efghi");
    assert.equal(t.truncated, true);
    const big = new TailBuffer(4);
    big.push(0, enc("ab"));
    big.push(1, enc("0123456789"));
    assert.equal(big.text(), "6789");
    assert.equal(big.truncated, true);
    const exact = new TailBuffer(4);
    exact.push(0, enc("1234"));
    assert.equal(exact.text(), "1234");
    assert.equal(exact.truncated, false);
  });

  it("keeps nothing with 0 and everything with Infinity", () => {
    const none = new TailBuffer(0);
    none.push(0, enc("abc"));
    assert.equal(none.text(), "");
    assert.equal(none.truncated, true);
    const all = new TailBuffer(Infinity);
    for (let i = 0; i < 1000; i++) all.push(i, enc("0123456789"));
    assert.equal(all.text().length, 10000);
    assert.equal(all.truncated, false);
  });

  it("does not start the text with half a UTF-8 character", () => {
    const t = new TailBuffer(5);
    t.push(0, enc("aé€b")); // 1 + 2 + 3 + 1 bytes: the tail starts inside "é"
    assert.equal(t.text(), "€b");
  });

  it("stays bounded over many small chunks", () => {
    const t = new TailBuffer(100);
    for (let i = 0; i < 100_000; i++) t.push(i, enc("x"));
    assert.equal(t.kept().length, 100);
    assert.equal(t.text(), "x".repeat(100));
  });

  it("merges two streams back into arrival order", () => {
    const out = new TailBuffer(100);
    const err = new TailBuffer(100);
    out.push(0, enc("a"));
    err.push(1, enc("b"));
    out.push(2, enc("c"));
    const m = merged(["stdout", out.kept()], ["stderr", err.kept()]);
    assert.deepEqual(m.map((c) => `${c.stream}:${Buffer.from(c.data)}`), ["stdout:a", "stderr:b", "stdout:c"]);
  });
});

describe("socket errors", () => {
  it("maps EACCES to PermissionDenied and ENOENT to Unavailable", () => {
    const denied = ForkboxError.from(new ConnectError("connect EACCES /run/x.sock", Code.Internal, undefined, undefined, Object.assign(new Error("EACCES"), { code: "EACCES" })));
    assert.equal(denied.code, "PermissionDenied");
    assert.ok(isPermissionDenied(denied));
    const gone = ForkboxError.from(new ConnectError("connect ENOENT", Code.Internal, undefined, undefined, Object.assign(new Error("ENOENT"), { code: "ENOENT" })));
    assert.equal(gone.code, "Unavailable");
  });

  it("reports PermissionDenied for a socket this user may not open", { skip: process.getuid?.() !== 0 ? "needs root (to run a client as nobody)" : false }, async (t) => {
    const dir = mkdtempSync(join(tmpdir(), "forkbox-ts-perm-"));
    t.after(() => rmSync(dir, { recursive: true, force: true }));
    const sock = join(dir, "forkbox.sock");
    const srv = createServer((c) => c.destroy());
    await new Promise((res, rej) => srv.once("error", rej).listen(sock, res));
    t.after(() => new Promise((res) => srv.close(res)));
    chmodSync(sock, 0o600); // root's only: nobody gets EACCES on connect
    const index = resolve(dirname(fileURLToPath(import.meta.url)), "../dist/index.js");
    const script = `
      const { Client } = await import(${JSON.stringify(index)});
      try { await new Client({ socket: ${JSON.stringify(sock)} }).listSandboxes(); console.log("ok"); }
      catch (e) { console.log(e.code); }`;
    const child = spawn(process.execPath, ["--input-type=module", "-e", script], { uid: 65534, gid: 65534, stdio: ["ignore", "pipe", "inherit"] });
    let out = "";
    child.stdout.on("data", (b) => (out += b));
    const code = await new Promise((res) => child.once("exit", res));
    assert.equal(code, 0);
    assert.equal(out.trim(), "PermissionDenied");
  });
});

describe("exec output bound", { skip: skipReason() }, () => {
  const d = useDaemon();
  const res = { cpu: "1", memory: "256Mi" };

  it("keeps the tail of 40 MiB in the result while pipe() gets all of it", async () => {
    const sb = await d.client.sandbox({ image: d.image, resources: res, name: "ts-bigout" });
    try {
      const w = counter();
      const r = await sb
        .exec("head -c 41943040 /dev/zero | tr '\\0' x; echo done >&2", { maxOutputBytes: MiB })
        .pipe(w);
      assert.equal(w.bytes(), 40 * MiB, "the piped writable got every byte");
      assert.equal(w.other(), 0);
      assert.ok(r.stdout.length <= MiB, `stdout kept ${r.stdout.length} bytes`);
      assert.equal(r.stdout.length, MiB);
      assert.equal(r.stdout, "x".repeat(MiB));
      assert.equal(r.stdoutTruncated, true);
      assert.equal(r.stderr, "done\n");
      assert.equal(r.stderrTruncated, false);
    } finally {
      await sb.close();
    }
  });

  it("bounds an endless command to its timeout and maxOutputBytes", async () => {
    const sb = await d.client.sandbox({ image: d.image, resources: res, name: "ts-yes" });
    try {
      const r = await sb.exec("yes", { timeoutMs: 2000, maxOutputBytes: 64 * 1024, nothrow: true });
      assert.equal(r.timedOut, true);
      assert.equal(r.stdoutTruncated, true);
      assert.equal(r.stdout.length, 64 * 1024);
      assert.match(r.stdout, /^\n?(y\n)*y?$/);
      const small = await sb.exec("echo hi");
      assert.equal(small.stdout, "hi\n");
      assert.equal(small.stdoutTruncated, false);
      assert.equal(DEFAULT_MAX_OUTPUT_BYTES, 16 * MiB);
      await assert.rejects(sb.exec("true", { maxOutputBytes: -1 }), (e) => e instanceof ForkboxError && e.code === "InvalidArgument");
    } finally {
      await sb.close();
    }
  });
});

describe("ExecPromise.pipe", () => {
  // A writable attached while another waits for "drain" gets the chunk
  // once: from the replay of what came before, not again from the loop
  // that was delivering it.
  it("does not give a chunk twice to a sink added during backpressure", async () => {
    const { ExecPromise } = await import("../dist/exec.js");
    const X = new TextEncoder().encode("X");
    const svc = {
      async *exec() {
        yield { event: { case: "stdout", value: X } };
        yield { event: { case: "exit", value: { exitCode: 0, signal: "", durationMs: 0, timedOut: false, oomKilled: false } } };
      },
    };
    let release;
    let entered;
    const inWrite = new Promise((r) => (entered = r));
    const a = new Writable({
      highWaterMark: 1,
      write(_chunk, _enc, cb) {
        release = cb;
        entered();
      },
    });
    const got = [];
    const b = new Writable({
      write(chunk, _enc, cb) {
        got.push(Buffer.from(chunk).toString());
        cb();
      },
    });
    const p = new ExecPromise(svc, "sb-1", "echo X").pipe(a);
    await inWrite;
    p.pipe(b);
    release();
    const res = await p;
    assert.equal(res.stdout, "X");
    assert.deepEqual(got, ["X"]);
  });
});
