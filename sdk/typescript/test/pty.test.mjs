// sandbox.pty against a real daemon: a shell on a terminal of the size
// asked for, resize, Ctrl-C of a foreground job, kill, the exit code, and
// sizes out of bounds refused.
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { isFailedPrecondition, isInvalidArgument } from "../dist/index.js";
import { skipReason, useDaemon } from "./helpers/daemon.mjs";

/** What a terminal printed; until(re) waits (bounded) for text after the last match. */
function screen() {
  let text = "";
  let from = 0;
  let wake = () => {};
  return {
    onData: (b) => {
      text += Buffer.from(b).toString("utf8");
      wake();
    },
    text: () => text,
    async until(re, ms = 60_000) {
      const deadline = Date.now() + ms;
      for (;;) {
        const m = re.exec(text.slice(from));
        if (m) {
          from += m.index + m[0].length;
          return m;
        }
        const left = deadline - Date.now();
        if (left <= 0) throw new Error(`the terminal never printed ${re}; it printed ${JSON.stringify(text)}`);
        await new Promise((r) => {
          const t = setTimeout(r, left);
          wake = () => {
            clearTimeout(t);
            r();
          };
        });
      }
    },
  };
}

/** Runs cmd until its exit status is success (or not), bounded. */
async function waitExec(sb, cmd, success) {
  const deadline = Date.now() + 60_000;
  for (;;) {
    const r = await sb.exec(cmd, { nothrow: true });
    if ((r.exitCode === 0) === success) return;
    if (Date.now() > deadline) throw new Error(`${cmd}: exit ${r.exitCode}, want success=${success}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

describe("pty", { skip: skipReason() }, () => {
  const d = useDaemon();

  it("runs a shell on a terminal: size, resize, Ctrl-C, exit code", async () => {
    const sb = await d.client.sandbox({ image: d.image, resources: { cpu: "1", memory: "256Mi" } });
    try {
      const scr = screen();
      const pty = await sb.pty.create({ cmd: ["sh"], rows: 30, cols: 100, env: { PS1: "$ " }, onData: scr.onData });
      assert.ok(pty.pid > 0);
      assert.match(pty.execId, /^ex-/);
      await pty.sendInput("tty; stty size; echo one-$((1+1))\n");
      await scr.until(/\/dev\/pts\/\d+\r\n30 100\r\none-2/);
      await pty.resize(40, 120);
      await pty.sendInput("stty size; echo two-$((1+2))\n");
      await scr.until(/40 120\r\ntwo-3/);
      await pty.sendInput("sleep 100\n");
      await waitExec(sb, "pidof sleep", true);
      await pty.sendInput("\x03");
      await waitExec(sb, "pidof sleep", false);
      await pty.sendInput("echo rc=$?\n");
      await scr.until(/rc=130/);
      await pty.sendInput("exit 7\n");
      const r = await pty.wait();
      assert.equal(r.exitCode, 7);
      assert.equal(r.signal, "");
      await assert.rejects(pty.sendInput("late\n"), (e) => isFailedPrecondition(e));
    } finally {
      await sb.close();
    }
  });

  it("kills the session, and refuses bad sizes", async () => {
    const sb = await d.client.sandbox({ image: d.image, resources: { cpu: "1", memory: "256Mi" } });
    try {
      await assert.rejects(sb.pty.create({ cmd: "sh", rows: 1001, cols: 80 }), (e) => isInvalidArgument(e));
      await assert.rejects(sb.pty.create({ cmd: "sh", rows: -1 }), (e) => isInvalidArgument(e));
      const pty = await sb.pty.create({ cmd: "sh" });
      await assert.rejects(pty.resize(0, 80), (e) => isInvalidArgument(e));
      await pty.sendInput("sleep 100\n");
      await waitExec(sb, "pidof sleep", true);
      await pty.kill();
      const r = await pty.wait();
      assert.equal(r.signal, "SIGKILL");
      await waitExec(sb, "pidof sleep", false);
    } finally {
      await sb.close();
    }
  });
});
