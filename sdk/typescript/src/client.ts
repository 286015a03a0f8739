// Client: a connection to a forkbox daemon over its unix socket (or TCP with
// a bearer token), and the client-side concurrency slots.
import * as http from "node:http";
import * as https from "node:https";
import * as net from "node:net";
import { createClient, type Client as ConnectClient, type Interceptor } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import type { MessageInitShape } from "@bufbuild/protobuf";
import {
  EnvironmentService, ImageService, SandboxService, type OverridesSchema, type ImageProgress as ImageProgressMessage,
} from "./gen/forkbox/v1/forkbox_pb.js";
import {
  checkpointFrom, eventFrom, imageFrom, replayedFrom, imageProgressFrom, sandboxFrom,
  type Event, type Image, type ImageProgress, type SandboxInfo,
} from "./types.js";
import { ForkboxError, rethrow } from "./errors.js";
import { SandboxHandle } from "./sandbox.js";
import { Environment, type EnvironmentOptions } from "./environment.js";

/** Where the daemon listens by default. */
export const DEFAULT_SOCKET = "/run/forkbox/forkbox.sock";

export interface ClientOptions {
  /** The daemon's unix socket (default: FORKBOX_HOST unix:///path, else /run/forkbox/forkbox.sock). */
  socket?: string;
  /** The daemon's TCP address, "http://host:port"; wins over socket. */
  url?: string;
  /** Bearer token (required on TCP); default FORKBOX_TOKEN. */
  token?: string;
  /**
   * Bound on the live sandboxes this client holds (created, forked, restored,
   * resumed or handed over by an environment, until closed); 0 = none. A
   * fork of N needs N free slots; over the bound is ResourceExhausted,
   * before the daemon is called.
   */
  maxConcurrency?: number;
}

/** A sandbox's limits: CPU cores ("1", "0.5") and memory ("512Mi", "1Gi"). */
export interface Resources {
  cpu?: string;
  memory?: string;
  pids?: number;
  /**
   * The most the sandbox's writable layer may hold ("2Gi"; "0" = no limit;
   * unset = the daemon's default). Past it, writes inside the sandbox fail
   * with EDQUOT. A fork counts only what it writes itself, and inherits its
   * parent's limit unless overridden.
   */
  disk?: string;
}

export interface SandboxOptions {
  image: string;
  name?: string;
  resources?: Resources;
  env?: Record<string, string>;
  cwd?: string;
  /** "none" (default), "all", or "allow" (implied by egressAllow). */
  egress?: string;
  /** CIDRs ("10.1.0.0/16") and DNS names ("api.example.com", "*.example.com") the sandbox may reach. */
  egressAllow?: string[];
  /** CIDRs (and names, with egressAllow) it may not reach; wins over egressAllow. */
  egressDeny?: string[];
  /** "gvisor" (default) or "crun". */
  runtime?: string;
  /**
   * The sandbox expires this many ms after it starts (E2B's timeoutMs);
   * setTimeout() moves the deadline. Unset: no timeout (the daemon's
   * --max-lifetime and --idle-timeout still apply). Forks inherit it.
   */
  timeoutMs?: number;
  /** What expiry does: "close" (default) or "hibernate" (gvisor; the next exec wakes it). */
  onTimeout?: "close" | "hibernate";
}

/** What a child (or a restored sandbox) gets instead of what it inherits. */
export interface Overrides {
  resources?: Resources;
  /** Merged over the inherited env. */
  env?: Record<string, string>;
  cwd?: string;
  egress?: string;
  /** With egress and egressDeny: replaces the inherited egress policy as a whole. */
  egressAllow?: string[];
  egressDeny?: string[];
  name?: string;
  /** The child's timeout in ms, counted from its own start (unset: inherited). */
  timeoutMs?: number;
  /** "close" or "hibernate" (unset: inherited). */
  onTimeout?: "close" | "hibernate";
}

/** @internal */
export function msProto(ms?: number): bigint {
  if (ms === undefined) return 0n;
  if (!Number.isFinite(ms)) throw new RangeError(`timeout ${ms}: want a finite number of milliseconds`);
  return BigInt(Math.ceil(ms));
}

/** @internal */
export function resourcesProto(r?: Resources) {
  return r ? { cpu: r.cpu ?? "", memory: r.memory ?? "", pids: BigInt(r.pids ?? 0), disk: r.disk ?? "" } : undefined;
}

/** @internal */
export function overridesProto(o?: Overrides): MessageInitShape<typeof OverridesSchema> | undefined {
  if (!o) return undefined;
  return {
    resources: resourcesProto(o.resources), env: o.env, cwd: o.cwd, egress: o.egress, name: o.name,
    timeoutMs: msProto(o.timeoutMs), onTimeout: o.onTimeout,
    egressAllow: o.egressAllow, egressDeny: o.egressDeny,
  };
}

/** The Connect clients of the three services. */
export interface Rpc {
  sandboxes: ConnectClient<typeof SandboxService>;
  /** The sandbox service over HTTP/2 (bidi streams: ExecPty), made on first use. */
  sandboxesH2: () => ConnectClient<typeof SandboxService>;
  images: ConnectClient<typeof ImageService>;
  environments: ConnectClient<typeof EnvironmentService>;
}

/** Selects a page of sandboxes: closed ones too with all; at most pageSize (0 = the daemon's default, 100; at most 1,000). */
export interface ListOptions {
  all?: boolean;
  pageSize?: number;
  pageToken?: string;
}

/** One page of the sandbox list; nextPageToken is "" on the last. */
export interface SandboxPage {
  sandboxes: SandboxInfo[];
  nextPageToken: string;
}

/** The page size of the helpers that list everything. */
export const FULL_PAGE = 1000;

/** A connection to a forkbox daemon. `new Client()` talks to the local daemon. */
export class Client {
  /** @internal */
  readonly rpc: Rpc;
  readonly maxConcurrency: number;
  private inUse = 0;

  constructor(o: ClientOptions = {}) {
    let { socket, url } = o;
    if (!socket && !url) {
      const host = process.env.FORKBOX_HOST ?? "";
      if (host.startsWith("unix://")) socket = host.slice("unix://".length);
      else if (host) url = host;
      else socket = DEFAULT_SOCKET;
    }
    const token = o.token ?? process.env.FORKBOX_TOKEN ?? "";
    this.maxConcurrency = o.maxConcurrency ?? 0;
    const auth: Interceptor = (next) => (req) => {
      if (token) req.header.set("Authorization", `Bearer ${token}`);
      return next(req);
    };
    const baseUrl = url ?? "http://forkbox";
    const agent = url
      ? new (url.startsWith("https:") ? https.Agent : http.Agent)({ keepAlive: true })
      : new http.Agent({ keepAlive: true });
    const transport = createConnectTransport({
      baseUrl,
      httpVersion: "1.1",
      nodeOptions: url ? { agent } : { agent, socketPath: socket },
      interceptors: [auth],
    });
    let h2: ConnectClient<typeof SandboxService> | undefined;
    const sandboxesH2 = () => {
      // The daemon serves h2c on its socket and on TCP; https uses TLS.
      h2 ??= createClient(SandboxService, createConnectTransport({
        baseUrl,
        httpVersion: "2",
        nodeOptions: url ? {} : { createConnection: () => net.connect(socket!) },
        interceptors: [auth],
      }));
      return h2;
    };
    this.rpc = {
      sandboxes: createClient(SandboxService, transport),
      sandboxesH2,
      images: createClient(ImageService, transport),
      environments: createClient(EnvironmentService, transport),
    };
  }

  /** Creates a sandbox and returns once it is ready for exec. Holds a slot until close(). */
  async sandbox(o: SandboxOptions): Promise<SandboxHandle> {
    this.acquire(1);
    try {
      const r = await this.rpc.sandboxes.createSandbox({
        image: o.image, name: o.name, resources: resourcesProto(o.resources), env: o.env, cwd: o.cwd, egress: o.egress, runtime: o.runtime,
        timeoutMs: msProto(o.timeoutMs), onTimeout: o.onTimeout,
        egressAllow: o.egressAllow, egressDeny: o.egressDeny,
      });
      return new SandboxHandle(this, r.sandbox!, this.limited);
    } catch (err) {
      this.release(1);
      throw ForkboxError.from(err);
    }
  }

  /**
   * A handle on an existing sandbox by ID or name. It holds no slot of this
   * client (it was not made by it).
   */
  async getSandbox(idOrName: string): Promise<SandboxHandle> {
    const r = await this.rpc.sandboxes.getSandbox({ sandbox: idOrName }).catch(rethrow);
    return new SandboxHandle(this, r.sandbox!, false);
  }

  /** Live sandboxes (all: closed ones too), oldest first: every page. */
  async listSandboxes(all = false): Promise<SandboxInfo[]> {
    const out: SandboxInfo[] = [];
    for await (const sb of this.allSandboxes({ all, pageSize: FULL_PAGE })) out.push(sb);
    return out;
  }

  /**
   * One page of sandboxes, oldest first; pass its nextPageToken as
   * pageToken for the next ("" on the last page). A token from another
   * request (or made up) is InvalidArgument.
   */
  async listSandboxesPage(o: ListOptions = {}): Promise<SandboxPage> {
    const r = await this.rpc.sandboxes
      .listSandboxes({ all: o.all ?? false, pageSize: o.pageSize ?? 0, pageToken: o.pageToken ?? "" })
      .catch(rethrow);
    return { sandboxes: r.sandboxes.map(sandboxFrom), nextPageToken: r.nextPageToken };
  }

  /**
   * Every sandbox, fetching a page at a time as the loop goes:
   * `for await (const sb of client.allSandboxes()) { ... }`.
   */
  async *allSandboxes(o: ListOptions = {}): AsyncGenerator<SandboxInfo, void, undefined> {
    let pageToken = o.pageToken ?? "";
    for (;;) {
      const page = await this.listSandboxesPage({ ...o, pageToken });
      yield* page.sandboxes;
      if (!page.nextPageToken) return;
      pageToken = page.nextPageToken;
    }
  }

  /** Starts a new sandbox from a checkpoint, with a clean exec history. */
  async restoreSnapshot(checkpointId: string, o: { overrides?: Overrides; credentials?: Record<string, string> } = {}): Promise<SandboxHandle> {
    this.acquire(1);
    try {
      const r = await this.rpc.sandboxes.restoreSnapshot({
        checkpoint: checkpointId, overrides: overridesProto(o.overrides), credentials: o.credentials,
      });
      return new SandboxHandle(this, r.sandbox!, this.limited);
    } catch (err) {
      this.release(1);
      throw ForkboxError.from(err);
    }
  }

  /**
   * Brings back a closed or crashed session (a sandbox ID or name): its last
   * checkpoint is restored and the execs recorded after it are replayed.
   * The handle's `resumed` says which.
   */
  async resume(session: string): Promise<SandboxHandle> {
    this.acquire(1);
    try {
      const r = await this.rpc.sandboxes.resume({ session });
      const sb = new SandboxHandle(this, r.sandbox!, this.limited);
      sb.resumed = { checkpoint: r.checkpoint && checkpointFrom(r.checkpoint), replayed: r.replayed.map(replayedFrom) };
      return sb;
    } catch (err) {
      this.release(1);
      throw ForkboxError.from(err);
    }
  }

  /** Deletes a checkpoint. */
  async deleteCheckpoint(id: string): Promise<void> {
    await this.rpc.sandboxes.deleteCheckpoint({ checkpoint: id }).catch(rethrow);
  }

  /** A sandbox's ledger (closed sandboxes too), oldest first. */
  async events(idOrName: string): Promise<Event[]> {
    const out: Event[] = [];
    let pageToken = "";
    for (;;) {
      const r = await this.rpc.sandboxes.events({ sandbox: idOrName, pageSize: FULL_PAGE, pageToken }).catch(rethrow);
      out.push(...r.events.map(eventFrom));
      if (!r.nextPageToken) return out;
      pageToken = r.nextPageToken;
    }
  }

  /**
   * An environment: image + resources + setup, built once into a warm
   * snapshot; env.sandbox() hands over a fork of it. Nothing is called until
   * env.sandbox() or env.build().
   */
  environment(name: string, o: EnvironmentOptions): Environment {
    return new Environment(this, name, o);
  }

  /**
   * Imports an oci-archive or docker-archive: a path on the daemon's host
   * (local socket only), or the archive's bytes, sent in the request (any
   * connection, a gateway too; at most 32 MiB: larger images go through a
   * registry).
   */
  async importImage(
    archive: string | Uint8Array,
    o: { name?: string; onProgress?: (p: ImageProgress) => void } = {},
  ): Promise<Image> {
    const req = typeof archive === "string" ? { path: archive, name: o.name } : { archive, name: o.name };
    return this.drain(this.rpc.images.importImage(req), o.onProgress);
  }

  /** Pulls an image from a registry. */
  async pullImage(ref: string, o: { insecure?: boolean; onProgress?: (p: ImageProgress) => void } = {}): Promise<Image> {
    return this.drain(this.rpc.images.pullImage({ ref, insecure: o.insecure }), o.onProgress);
  }

  async listImages(): Promise<Image[]> {
    const r = await this.rpc.images.listImages({}).catch(rethrow);
    return r.images.map(imageFrom);
  }

  private async drain(stream: AsyncIterable<ImageProgressMessage>, onProgress?: (p: ImageProgress) => void): Promise<Image> {
    let img: Image | undefined;
    try {
      for await (const msg of stream) {
        const p = imageProgressFrom(msg);
        if (p.image) img = p.image;
        onProgress?.(p);
      }
    } catch (err) {
      throw ForkboxError.from(err);
    }
    if (!img) throw new ForkboxError("Unavailable", "image stream ended without an image");
    return img;
  }

  /** The number of this client's slots in use. */
  get slotsInUse(): number {
    return this.inUse;
  }

  /** @internal Whether handles hold slots. */
  get limited(): boolean {
    return this.maxConcurrency > 0;
  }

  /**
   * @internal Takes n slots, or throws ResourceExhausted. With bestEffort,
   * takes as many as are free (at least one) and returns how many.
   */
  acquire(n: number, bestEffort = false): number {
    if (!this.limited) return n;
    const free = this.maxConcurrency - this.inUse;
    if (bestEffort && free > 0) n = Math.min(n, free);
    if (n > free) {
      throw new ForkboxError("ResourceExhausted",
        `${n} sandbox slots needed, ${free} of this client's ${this.maxConcurrency} free (maxConcurrency)`);
    }
    this.inUse += n;
    return n;
  }

  /** @internal */
  release(n: number): void {
    if (this.limited && n > 0) this.inUse -= n;
  }
}
