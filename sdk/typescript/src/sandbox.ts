// SandboxHandle: one live sandbox. It holds one of its client's concurrency
// slots from the moment it is created (or forked, restored, resumed) until
// close().
import type { ForkResponse, Sandbox as SandboxMessage } from "./gen/forkbox/v1/forkbox_pb.js";
import {
  checkpointFrom, credentialFrom, fileInfoFrom, metricsFrom, sandboxFrom,
  type SandboxMetrics, type Checkpoint, type Credential, type Event, type FileInfo, type ReplayedExec, type SandboxInfo,
} from "./types.js";
import { ExecPromise, type ExecOptions } from "./exec.js";
import { Ptys } from "./pty.js";
import { ForkboxError, rethrow } from "./errors.js";
import { msProto, type Client, type Overrides } from "./client.js";
import { overridesProto, FULL_PAGE } from "./client.js";

/** Options of sb.forkMany(). */
export interface ForkOptions {
  /** Tag of the checkpoint the fork takes (stored in the ledger). */
  tag?: string;
  /** Number of children, 1 to 100 (default 1). */
  count?: number;
  /** Replace what children inherit. */
  overrides?: Overrides;
  /** Values for the source's per-fork credentials, by name. */
  credentials?: Record<string, string>;
  /** Fork from this existing checkpoint instead of taking a new one. */
  fromCheckpoint?: string;
  /** Start as many children as there are slots for; the rest fail with ResourceExhausted. */
  bestEffort?: boolean;
}

/** One child of a fork: a sandbox, or the error that child got. */
export interface ForkChild {
  sandbox?: SandboxHandle;
  error?: ForkboxError;
  startMs: number;
}

/** One event of sb.forkStream(): the capture, a child, or the totals (last). */
export type ForkStreamEvent =
  | { type: "captured"; checkpoint?: Checkpoint; captured: string; captureMs: number; flushMs: number; count: number }
  | { type: "child"; index: number; child: ForkChild }
  | { type: "done"; totalMs: number; started: number; failed: number };

/** The outcome of sb.forkMany(): per-child results. */
export interface ForkResult {
  checkpoint?: Checkpoint;
  /** What the children start from: "filesystem". */
  captured: string;
  /** How long the source was frozen (freeze + snapshot + thaw). */
  captureMs: number;
  /** Writeback of the source's dirty data before the freeze (while it ran). */
  flushMs: number;
  totalMs: number;
  children: ForkChild[];
}

/** How a credential reaches the sandbox. Neither env nor file: env = the name. */
export interface CredentialOptions {
  /** Injected as this environment variable into every exec. */
  env?: string;
  /** Written to /run/secrets/<file> (a tmpfs: never in a snapshot). */
  file?: string;
  /** Not copied to forks: each fork call must supply a value. */
  perFork?: boolean;
}

/**
 * How to reach one port of a sandbox through the daemon's preview listener
 * (forkbox serve --ports ADDR). Every URL carries the sandbox's port token: it
 * opens this sandbox's ports and nothing else, so it can be shared without
 * giving API access.
 */
export interface PortURL {
  /** The host form with the token, http://<port>-<id>.<domain>:<p>/?forkbox_token=T: the link to share. */
  url: string;
  /** The port token; send it as the X-Forkbox-Port-Token header instead of the query. */
  token: string;
  /** The preview host and port, <port>-<id>.<domain>:<p>. */
  host: string;
  /** The host form (the same as url). */
  hostUrl: string;
  /**
   * The path form, for non-browser clients that cannot set Host:
   * http://<addr>/sandboxes/<id>/ports/<port>/?forkbox_token=T. It takes no
   * cookie: send the token (query or X-Forkbox-Port-Token) with every request.
   */
  pathUrl: string;
}

/** A sandbox's credentials: values are stored sealed and never returned. */
export class Credentials {
  /** @internal */
  constructor(private readonly sb: SandboxHandle) {}

  async set(name: string, value: string, o: CredentialOptions = {}): Promise<Credential | undefined> {
    const env = !o.env && !o.file ? name : o.env;
    const r = await this.sb.client.rpc.sandboxes
      .setCredential({ sandbox: this.sb.id, value, credential: { name, env, file: o.file, perFork: o.perFork } })
      .catch(rethrow);
    return r.credential && credentialFrom(r.credential);
  }

  async list(): Promise<Credential[]> {
    const r = await this.sb.client.rpc.sandboxes.listCredentials({ sandbox: this.sb.id }).catch(rethrow);
    return r.credentials.map(credentialFrom);
  }

  async delete(name: string): Promise<void> {
    await this.sb.client.rpc.sandboxes.deleteCredential({ sandbox: this.sb.id, name }).catch(rethrow);
  }
}

/** A handle on one sandbox. */
export class SandboxHandle {
  readonly client: Client;
  readonly id: string;
  /** What the daemon knows of the sandbox (as of the last call that returned it). */
  info: SandboxInfo;
  readonly credentials: Credentials;
  /** Terminals: sandbox.pty.create({ cmd: "sh", rows, cols, onData }). */
  readonly pty: Ptys;
  /** Set by client.resume(): the checkpoint restored and the execs replayed. */
  resumed?: { checkpoint?: Checkpoint; replayed: ReplayedExec[] };
  /** Set by env.sandbox(): how this sandbox was handed over. */
  handover?: { built: boolean; fromPool: boolean; handoverMs: number };
  private slot: boolean;
  private closed = false;

  /** @internal */
  constructor(client: Client, info: SandboxMessage, holdsSlot: boolean) {
    this.client = client;
    this.id = info.id;
    this.info = sandboxFrom(info);
    this.slot = holdsSlot;
    this.credentials = new Credentials(this);
    this.pty = new Ptys(() => client.rpc.sandboxesH2(), info.id);
  }

  get name(): string {
    return this.info.name;
  }

  /**
   * Runs a command: a string runs with /bin/sh -c, an array is argv. Await
   * the result (rejects with ExecError on failure unless `nothrow`), or
   * `.pipe(writable)` to stream its output.
   */
  exec(cmd: string | string[], opts?: ExecOptions): ExecPromise {
    return new ExecPromise(this.client.rpc.sandboxes, this.id, cmd, opts);
  }

  /** Forks one child from the sandbox's current state (the source keeps running); throws that child's error. */
  async fork(tag?: string): Promise<SandboxHandle> {
    const res = await this.forkMany({ tag, count: 1 });
    const child = res.children[0];
    if (!child?.sandbox) throw child?.error ?? new ForkboxError("Internal", "fork returned no child");
    return child.sandbox;
  }

  /** Checkpoints the sandbox and starts `count` children from it: per-child results. Needs `count` free slots. */
  async forkMany(o: ForkOptions = {}): Promise<ForkResult> {
    const want = Math.max(o.count ?? 1, 1);
    // With bestEffort, only as many children as this client has slots for
    // are asked of the daemon; the rest report ResourceExhausted.
    const n = this.client.acquire(want, o.bestEffort);
    let r: ForkResponse;
    try {
      r = await this.client.rpc.sandboxes.fork({
        sandbox: this.id, tag: o.tag, count: n, overrides: overridesProto(o.overrides),
        credentials: o.credentials, fromCheckpoint: o.fromCheckpoint, bestEffort: o.bestEffort,
      });
    } catch (err) {
      this.client.release(n);
      throw ForkboxError.from(err);
    }
    let started = 0;
    const children = r.children.map((c): ForkChild => {
      const child: ForkChild = { startMs: c.startMs };
      if (c.sandbox) {
        child.sandbox = new SandboxHandle(this.client, c.sandbox, this.client.limited);
        started++;
      }
      if (c.error) child.error = ForkboxError.fromClassName(c.errorClass, c.error);
      return child;
    });
    for (let i = n; i < want; i++) {
      children.push({ startMs: 0, error: new ForkboxError("ResourceExhausted", "no free slot of this client (maxConcurrency)") });
    }
    this.client.release(n - started);
    return { checkpoint: r.checkpoint && checkpointFrom(r.checkpoint), captured: r.captured, captureMs: r.captureMs, flushMs: r.flushMs, totalMs: r.totalMs, children };
  }

  /**
   * Like forkMany, but yields as the fork goes: first the capture, then each
   * child as soon as it is ready (or has failed), in the order they become
   * ready, then the totals. The first child can be used before the last has
   * started. Leaving the loop early stops listening only: every child asked
   * for still starts (close the ones received).
   *
   *     for await (const ev of sb.forkStream({ count: 20 })) {
   *       if (ev.type === "child" && ev.child.sandbox) use(ev.child.sandbox);
   *     }
   */
  async *forkStream(o: ForkOptions = {}): AsyncGenerator<ForkStreamEvent> {
    const want = Math.max(o.count ?? 1, 1);
    const n = this.client.acquire(want, o.bestEffort);
    let held = n; // this client's slots for children not yet received
    try {
      const stream = this.client.rpc.sandboxes.forkStream({
        sandbox: this.id, tag: o.tag, count: n, overrides: overridesProto(o.overrides),
        credentials: o.credentials, fromCheckpoint: o.fromCheckpoint, bestEffort: o.bestEffort,
      });
      let doneEvent: ForkStreamEvent | undefined;
      try {
        for await (const msg of stream) {
          const ev = msg.event;
          if (ev.case === "captured") {
            const c = ev.value;
            yield { type: "captured", checkpoint: c.checkpoint && checkpointFrom(c.checkpoint), captured: c.captured,
              captureMs: c.captureMs, flushMs: c.flushMs, count: want };
          } else if (ev.case === "child") {
            const fc = ev.value.child;
            const child: ForkChild = { startMs: fc?.startMs ?? 0 };
            held--;
            if (fc?.sandbox) child.sandbox = new SandboxHandle(this.client, fc.sandbox, this.client.limited);
            else this.client.release(1);
            if (fc?.error) child.error = ForkboxError.fromClassName(fc.errorClass, fc.error);
            yield { type: "child", index: ev.value.index, child };
          } else if (ev.case === "done") {
            doneEvent = { type: "done", totalMs: ev.value.totalMs, started: ev.value.started, failed: ev.value.failed + (want - n) };
          }
        }
      } catch (err) {
        throw ForkboxError.from(err);
      }
      for (let i = n; i < want; i++) {
        yield { type: "child", index: i, child: { startMs: 0, error: new ForkboxError("ResourceExhausted", "no free slot of this client (maxConcurrency)") } };
      }
      if (!doneEvent) throw new ForkboxError("Unavailable", "fork stream ended without its totals");
      yield doneEvent;
    } finally {
      if (held > 0) this.client.release(held);
    }
  }

  /** Captures the sandbox's state under tag; records sandbox.checkpoint_created. */
  async checkpoint(tag?: string): Promise<Checkpoint> {
    const r = await this.client.rpc.sandboxes.checkpoint({ sandbox: this.id, tag }).catch(rethrow);
    return checkpointFrom(r.checkpoint!);
  }

  /** The sandbox's checkpoints (forks' too), oldest first. */
  async listCheckpoints(): Promise<Checkpoint[]> {
    const out: Checkpoint[] = [];
    let pageToken = "";
    for (;;) {
      const r = await this.client.rpc.sandboxes
        .listCheckpoints({ sandbox: this.id, pageSize: FULL_PAGE, pageToken })
        .catch(rethrow);
      out.push(...r.checkpoints.map(checkpointFrom));
      if (!r.nextPageToken) return out;
      pageToken = r.nextPageToken;
    }
  }

  /** Freezes the sandbox in place (processes stop, memory kept). */
  async pause(): Promise<void> {
    const r = await this.client.rpc.sandboxes.pauseSandbox({ sandbox: this.id }).catch(rethrow);
    if (r.sandbox) this.info = sandboxFrom(r.sandbox);
  }

  /**
   * Replaces the sandbox's egress policy while it runs: egress "none", "all" or "allow"
   * (omitted: "allow" with an allow list), an allowlist and a denylist. Open connections stay.
   */
  async setEgress(o: { egress?: string; allow?: string[]; deny?: string[] }): Promise<void> {
    const r = await this.client.rpc.sandboxes
      .setEgress({ sandbox: this.id, egress: o.egress, egressAllow: o.allow, egressDeny: o.deny })
      .catch(rethrow);
    if (r.sandbox) this.info = sandboxFrom(r.sandbox);
  }

  /** Thaws a paused sandbox. */
  async unpause(): Promise<void> {
    const r = await this.client.rpc.sandboxes.unpauseSandbox({ sandbox: this.id }).catch(rethrow);
    if (r.sandbox) this.info = sandboxFrom(r.sandbox);
  }

  /** The preview URLs of a port of the sandbox (see PortURL). */
  async portURL(port: number): Promise<PortURL> {
    const r = await this.client.rpc.sandboxes.getPortURL({ sandbox: this.id, port }).catch(rethrow);
    return { url: r.url, token: r.token, host: r.host, hostUrl: r.hostUrl, pathUrl: r.pathUrl };
  }

  /** The preview URL of a port, with the sandbox's token (the link to share). */
  async url(port: number): Promise<string> {
    return (await this.portURL(port)).url;
  }

  /** The preview host of a port, "8080-sb-….localhost:8089" (as E2B's getHost); requests to it need the token too. */
  async getHost(port: number): Promise<string> {
    return (await this.portURL(port)).host;
  }

  /** Same as unpause(). (client.resume(session) is the other resume: a closed session brought back.) */
  resume(): Promise<void> {
    return this.unpause();
  }

  /** Reads a file: bytes, or a string when an encoding is given. */
  readFile(path: string): Promise<Uint8Array>;
  readFile(path: string, encoding: BufferEncoding): Promise<string>;
  async readFile(path: string, encoding?: BufferEncoding): Promise<Uint8Array | string> {
    const r = await this.client.rpc.sandboxes.readFile({ sandbox: this.id, path }).catch(rethrow);
    return encoding ? Buffer.from(r.data).toString(encoding) : r.data;
  }

  /** Writes a file (strings as UTF-8; mode default 0644). */
  async writeFile(path: string, data: string | Uint8Array, opts: { mode?: number } = {}): Promise<void> {
    const bytes = typeof data === "string" ? new TextEncoder().encode(data) : data;
    await this.client.rpc.sandboxes.writeFile({ sandbox: this.id, path, data: bytes, mode: opts.mode }).catch(rethrow);
  }

  async listFiles(path: string): Promise<FileInfo[]> {
    const r = await this.client.rpc.sandboxes.listFiles({ sandbox: this.id, path }).catch(rethrow);
    return r.files.map(fileInfoFrom);
  }

  /** Reads the sandbox's CPU, memory, disk, network and pids counters now. */
  async getMetrics(): Promise<SandboxMetrics> {
    const r = await this.client.rpc.sandboxes.getSandboxMetrics({ sandbox: this.id }).catch(rethrow);
    if (r.metrics.length !== 1) {
      throw new ForkboxError("Internal", `metrics of ${this.id}: got ${r.metrics.length} readings`);
    }
    return metricsFrom(r.metrics[0]);
  }

  /** The sandbox's ledger, oldest first. */
  async events(): Promise<Event[]> {
    return this.client.events(this.id);
  }

  /** What JSON.stringify(handle) gives: the sandbox's data, not its connection. */
  toJSON(): { id: string; name: string; info: SandboxInfo; resumed?: SandboxHandle["resumed"]; handover?: SandboxHandle["handover"] } {
    return { id: this.id, name: this.name, info: this.info, resumed: this.resumed, handover: this.handover };
  }

  /**
   * Sets the sandbox's deadline to now + timeoutMs (E2B's setTimeout); 0
   * removes its own timeout. The daemon's --max-lifetime may clamp it:
   * returns the effective deadline (null: never), also in `info.expiresAt`.
   */
  async setTimeout(timeoutMs: number): Promise<Date | null> {
    const r = await this.client.rpc.sandboxes.setTimeout({ sandbox: this.id, timeoutMs: msProto(timeoutMs) }).catch(rethrow);
    this.info = sandboxFrom(r.sandbox!);
    return this.info.expiresAt;
  }

  /** Reloads `info`. */
  async refresh(): Promise<SandboxInfo> {
    const r = await this.client.rpc.sandboxes.getSandbox({ sandbox: this.id }).catch(rethrow);
    this.info = sandboxFrom(r.sandbox!);
    return this.info;
  }

  /** Closes the sandbox (nothing of it is left on the host) and frees its slot. A second close is a no-op. */
  async close(): Promise<void> {
    if (this.closed) return;
    try {
      await this.client.rpc.sandboxes.deleteSandbox({ sandbox: this.id });
    } catch (err) {
      const e = ForkboxError.from(err);
      if (e.code !== "NotFound") throw e;
    }
    this.closed = true;
    if (this.slot) {
      this.slot = false;
      this.client.release(1);
    }
  }
}
