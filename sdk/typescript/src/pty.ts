// pty: a command on a terminal in a sandbox, over a bidirectional ExecPty
// stream (HTTP/2). sandbox.pty.create() returns a PtyHandle once the
// command runs: sendInput() types keys, resize() sets the size, kill() ends
// the session, wait() resolves with how it ended.
import type { Client as ConnectClient } from "@connectrpc/connect";
import type { MessageInitShape } from "@bufbuild/protobuf";
import { SandboxService, type PtyRequestSchema, type PtyResponse } from "./gen/forkbox/v1/forkbox_pb.js";
import { ForkboxError } from "./errors.js";

type PtyRequestInit = MessageInitShape<typeof PtyRequestSchema>;

/** The most input sent in one message (the daemon takes up to 64 KiB). */
const CHUNK = 32 << 10;

export interface PtyOptions {
  /** A string runs with /bin/sh -c, an array is argv. */
  cmd: string | string[];
  /** Terminal size (default 24 rows, 80 columns; at most 1000 each). */
  rows?: number;
  cols?: number;
  /** TERM is xterm unless set here. */
  env?: Record<string, string>;
  cwd?: string;
  /** The session is killed after this many milliseconds (0: no limit). */
  timeoutMs?: number;
  /** What the terminal prints, as it comes. */
  onData?: (data: Uint8Array) => void;
  /** Aborting it kills the session. */
  signal?: AbortSignal;
}

/** How a terminal's command ended. */
export interface PtyResult {
  exitCode: number;
  /** The signal that ended it ("SIGKILL"), or "". */
  signal: string;
  durationMs: number;
  timedOut: boolean;
  oomKilled: boolean;
}

/** An async iterable the caller pushes into: the request side of the stream. */
class Outbox implements AsyncIterable<PtyRequestInit> {
  private items: PtyRequestInit[] = [];
  private waiting?: () => void;
  private closed = false;

  push(m: PtyRequestInit): boolean {
    if (this.closed) return false;
    this.items.push(m);
    this.waiting?.();
    return true;
  }

  close(): void {
    this.closed = true;
    this.waiting?.();
  }

  async *[Symbol.asyncIterator](): AsyncIterator<PtyRequestInit> {
    for (;;) {
      const m = this.items.shift();
      if (m) {
        yield m;
        continue;
      }
      if (this.closed) return;
      await new Promise<void>((r) => (this.waiting = r));
      this.waiting = undefined;
    }
  }
}

/** A command running on a terminal in a sandbox. */
export class PtyHandle {
  /** The exec's id in the ledger. */
  readonly execId: string;
  /** Its pid in the sandbox. */
  readonly pid: number;
  private readonly done: Promise<PtyResult>;
  private ended = false;

  /** @internal */
  constructor(
    private readonly out: Outbox,
    private readonly abort: AbortController,
    started: { execId: string; pid: bigint },
    rest: AsyncIterator<PtyResponse>,
    onData?: (data: Uint8Array) => void,
  ) {
    this.execId = started.execId;
    this.pid = Number(started.pid);
    this.done = this.receive(rest, onData);
    this.done.catch(() => {});
  }

  private async receive(rest: AsyncIterator<PtyResponse>, onData?: (data: Uint8Array) => void): Promise<PtyResult> {
    let exit: PtyResult | undefined;
    try {
      for (;;) {
        const r = await rest.next();
        if (r.done) break;
        const ev = r.value.event;
        if (ev.case === "data") onData?.(ev.value);
        else if (ev.case === "exit") {
          this.ended = true;
          this.out.close(); // the daemon waits for it before it ends the stream
          const x = ev.value;
          exit = { exitCode: x.exitCode, signal: x.signal, durationMs: x.durationMs, timedOut: x.timedOut, oomKilled: x.oomKilled };
        }
      }
    } catch (err) {
      // A stream reset after the exit arrived changes nothing of the result.
      if (!exit) throw ForkboxError.from(err);
    } finally {
      this.ended = true;
      this.out.close();
    }
    if (!exit) throw new ForkboxError("Unavailable", "pty stream ended without an exit status");
    return exit;
  }

  private send(m: PtyRequestInit): void {
    if (this.ended || !this.out.push(m)) throw new ForkboxError("FailedPrecondition", "the terminal session has ended");
  }

  /** Types data into the terminal (Ctrl-C is "\x03"). */
  async sendInput(data: string | Uint8Array): Promise<void> {
    const b = typeof data === "string" ? new TextEncoder().encode(data) : data;
    for (let i = 0; i < b.length; i += CHUNK) this.send({ event: { case: "input", value: b.subarray(i, i + CHUNK) } });
  }

  /** Sets the terminal's size; the foreground program gets SIGWINCH. */
  async resize(rows: number, cols: number): Promise<void> {
    if (!Number.isInteger(rows) || !Number.isInteger(cols) || rows < 1 || cols < 1) {
      throw new ForkboxError("InvalidArgument", `terminal size ${rows}x${cols}: rows and cols must be positive integers`);
    }
    this.send({ event: { case: "resize", value: { rows, cols } } });
  }

  /** Kills every process of the terminal's session; wait() then resolves (SIGKILL). */
  async kill(): Promise<void> {
    this.send({ event: { case: "kill", value: {} } });
  }

  /** Resolves with how the command ended, after all its output went to onData. */
  wait(): Promise<PtyResult> {
    return this.done;
  }

  /** Ends the stream; a session still running is killed. */
  close(): void {
    this.abort.abort();
  }
}

/** sandbox.pty: terminals in a sandbox. */
export class Ptys {
  /** @internal */
  constructor(private readonly svc: () => ConnectClient<typeof SandboxService>, private readonly sandbox: string) {}

  /** Starts a command on a new terminal; resolves once it runs. */
  async create(o: PtyOptions): Promise<PtyHandle> {
    for (const [k, v] of [["rows", o.rows], ["cols", o.cols]] as const) {
      if (v !== undefined && (!Number.isInteger(v) || v < 0)) throw new ForkboxError("InvalidArgument", `${k} must be a non-negative integer, got ${v}`);
    }
    const abort = new AbortController();
    const onAbort = () => abort.abort();
    o.signal?.addEventListener("abort", onAbort, { once: true });
    const out = new Outbox();
    const shell = typeof o.cmd === "string" ? o.cmd : "";
    const argv = typeof o.cmd === "string" ? [] : o.cmd;
    out.push({
      event: {
        case: "start",
        value: {
          sandbox: this.sandbox, argv, shell, env: o.env, cwd: o.cwd, timeoutMs: BigInt(o.timeoutMs ?? 0),
          size: { rows: o.rows ?? 0, cols: o.cols ?? 0 },
        },
      },
    });
    try {
      const it = this.svc().execPty(out, { signal: abort.signal })[Symbol.asyncIterator]();
      const first = await it.next();
      if (first.done || first.value.event.case !== "started") {
        throw new ForkboxError("Internal", "the daemon did not answer the pty start with started");
      }
      return new PtyHandle(out, abort, first.value.event.value, it, o.onData);
    } catch (err) {
      out.close();
      abort.abort();
      throw ForkboxError.from(err);
    }
  }
}
