// exec: one command in a sandbox, streamed. exec() returns an ExecPromise:
// await it for the result, or .pipe(writable) to stream the output as it
// is produced.
import { once } from "node:events";
import type { Writable } from "node:stream";
import type { Client as ConnectClient } from "@connectrpc/connect";
import { SandboxService } from "./gen/forkbox/v1/forkbox_pb.js";
import { ExecError, ForkboxError } from "./errors.js";
import { TailBuffer, merged } from "./tail.js";

/** Default of ExecOptions.maxOutputBytes: 16 MiB of stdout and 16 MiB of stderr. */
export const DEFAULT_MAX_OUTPUT_BYTES = 16 << 20;

/** How a command ended, and what it printed. */
export interface ExecResult {
  exitCode: number;
  /** The signal that ended it ("SIGKILL"), or "". */
  signal: string;
  /** stdout as UTF-8: at most `maxOutputBytes` of it, the last bytes when there was more. */
  stdout: string;
  /** stderr as UTF-8: at most `maxOutputBytes` of it, the last bytes when there was more. */
  stderr: string;
  /** The command printed more than `maxOutputBytes` of stdout: `stdout` holds only its tail. */
  stdoutTruncated: boolean;
  /** The command printed more than `maxOutputBytes` of stderr: `stderr` holds only its tail. */
  stderrTruncated: boolean;
  durationMs: number;
  timedOut: boolean;
  oomKilled: boolean;
}

export interface ExecOptions {
  env?: Record<string, string>;
  cwd?: string;
  stdin?: string | Uint8Array;
  /** Killed after this many milliseconds (0: no limit). */
  timeoutMs?: number;
  /** Not replayed by client.resume() (the command has effects outside the sandbox). */
  nonReplayable?: boolean;
  /** Resolve with the result even when the command fails, instead of rejecting with ExecError. */
  nothrow?: boolean;
  signal?: AbortSignal;
  /**
   * Bytes of stdout, and separately of stderr, kept in memory for the result
   * (default 16 MiB): the last bytes when the command prints more, with
   * `stdoutTruncated` / `stderrTruncated` set. pipe() still gets everything.
   * 0 keeps nothing; Infinity keeps all.
   */
  maxOutputBytes?: number;
}

type Sink = { stdout?: Writable; stderr?: Writable };

/**
 * The pending result of sb.exec(). It is a Promise<ExecResult> that rejects
 * with ExecError when the command fails (non-zero exit, signal, timeout, OOM)
 * unless `nothrow` was given, and with ForkboxError when the call itself
 * fails. The output is also kept in the result (stdout, stderr as UTF-8), up
 * to `maxOutputBytes` of each stream (its tail).
 */
export class ExecPromise implements Promise<ExecResult> {
  readonly [Symbol.toStringTag] = "ExecPromise";
  private readonly sinks: Sink[] = [];
  private out: { stdout: TailBuffer; stderr: TailBuffer } | undefined;
  private seq = 0;
  private readonly done: Promise<ExecResult>;

  /** @internal */
  constructor(svc: ConnectClient<typeof SandboxService>, sandbox: string, cmd: string | string[], o: ExecOptions = {}) {
    this.done = this.run(svc, sandbox, cmd, o);
    // The caller may attach handlers later (after pipe()); never report an
    // unhandled rejection for that window.
    this.done.catch(() => {});
  }

  /**
   * Streams the command's stdout into `stdout` as it is produced, and its
   * stderr into `stderr` — by default process.stderr when `stdout` is
   * process.stdout, else nowhere (it is still in the result). Returns this
   * promise. Writables are not ended. Attached right after exec() (before
   * the next await), it gets all the output; attached later, only what the
   * result still keeps of what came before (the last maxOutputBytes).
   */
  pipe(stdout: Writable, stderr?: Writable): ExecPromise {
    const sink: Sink = { stdout, stderr: stderr ?? (stdout === process.stdout ? process.stderr : undefined) };
    if (this.out) {
      for (const c of merged(["stdout", this.out.stdout.kept()], ["stderr", this.out.stderr.kept()])) sink[c.stream]?.write(c.data);
    }
    this.sinks.push(sink);
    return this;
  }

  then<T1 = ExecResult, T2 = never>(
    onfulfilled?: ((value: ExecResult) => T1 | PromiseLike<T1>) | null,
    onrejected?: ((reason: any) => T2 | PromiseLike<T2>) | null,
  ): Promise<T1 | T2> {
    return this.done.then(onfulfilled, onrejected);
  }

  catch<T = never>(onrejected?: ((reason: any) => T | PromiseLike<T>) | null): Promise<ExecResult | T> {
    return this.done.catch(onrejected);
  }

  finally(onfinally?: (() => void) | null): Promise<ExecResult> {
    return this.done.finally(onfinally);
  }

  private async run(svc: ConnectClient<typeof SandboxService>, sandbox: string, cmd: string | string[], o: ExecOptions): Promise<ExecResult> {
    // Let the caller attach pipe() before the first byte arrives.
    await Promise.resolve();
    const max = o.maxOutputBytes ?? DEFAULT_MAX_OUTPUT_BYTES;
    if (typeof max !== "number" || Number.isNaN(max) || max < 0 || (Number.isFinite(max) && !Number.isInteger(max))) {
      throw new ForkboxError("InvalidArgument", `maxOutputBytes must be a non-negative integer or Infinity, got ${String(max)}`);
    }
    this.out = { stdout: new TailBuffer(max), stderr: new TailBuffer(max) };
    const shell = typeof cmd === "string" ? cmd : "";
    const argv = typeof cmd === "string" ? [] : cmd;
    const stdin = typeof o.stdin === "string" ? new TextEncoder().encode(o.stdin) : o.stdin;
    let exit: ExecResult | undefined;
    try {
      const stream = svc.exec(
        { sandbox, argv, shell, env: o.env, cwd: o.cwd, stdin, timeoutMs: BigInt(o.timeoutMs ?? 0), nonReplayable: o.nonReplayable },
        { signal: o.signal },
      );
      for await (const msg of stream) {
        const ev = msg.event;
        if (ev.case === "stdout" || ev.case === "stderr") {
          await this.deliver(ev.case, ev.value);
        } else if (ev.case === "exit") {
          const x = ev.value;
          exit = {
            exitCode: x.exitCode, signal: x.signal, durationMs: x.durationMs, timedOut: x.timedOut, oomKilled: x.oomKilled,
            stdout: "", stderr: "", stdoutTruncated: false, stderrTruncated: false,
          };
        }
      }
    } catch (err) {
      throw ForkboxError.from(err);
    }
    if (!exit) throw new ForkboxError("Unavailable", "exec stream ended without an exit status");
    exit.stdout = this.out.stdout.text();
    exit.stderr = this.out.stderr.text();
    exit.stdoutTruncated = this.out.stdout.truncated;
    exit.stderrTruncated = this.out.stderr.truncated;
    const failed = exit.exitCode !== 0 || exit.signal !== "" || exit.timedOut || exit.oomKilled;
    if (failed && !o.nothrow) throw new ExecError(typeof cmd === "string" ? cmd : cmd.join(" "), exit);
    return exit;
  }

  private async deliver(stream: "stdout" | "stderr", data: Uint8Array): Promise<void> {
    this.out![stream].push(this.seq++, data);
    // The sinks of now: one that pipe() adds while a write below waits for
    // "drain" was given this chunk already (replayed from the tail).
    for (const s of [...this.sinks]) {
      const w = s[stream];
      if (w && !w.write(data) && w !== process.stdout && w !== process.stderr) {
        await once(w, "drain");
      }
    }
  }
}
