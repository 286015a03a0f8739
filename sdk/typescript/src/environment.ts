// Environment: a declarative baseline (image + resources + setup) built once
// into a warm snapshot keyed by the hash of its definition; env.sandbox()
// hands over a fork of it (or a pooled one). Setup is either a list of steps
// run by the daemon, or an async function run by this client against a
// builder sandbox (BeginBuild / CompleteBuild).
import { createHash } from "node:crypto";
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { EnvironmentDefinitionSchema, SetupStepSchema } from "./gen/forkbox/v1/forkbox_pb.js";
import { buildProgressFrom, environmentFrom, type BuildProgress, type EnvironmentInfo } from "./types.js";
import { ForkboxError, rethrow } from "./errors.js";
import { SandboxHandle } from "./sandbox.js";
import type { Client, Overrides, Resources } from "./client.js";
import { overridesProto, resourcesProto } from "./client.js";

/** A setup step: a shell command, or a file to write. */
export type Step = string | { path: string; content: string | Uint8Array; mode?: number };

/** Setup run by the client in a builder sandbox; its source text is part of the environment's hash. */
export type SetupFunction = (sb: SandboxHandle) => Promise<unknown> | unknown;

export interface EnvironmentOptions {
  image: string;
  resources?: Resources;
  /** Steps run by the daemon, or an async function run by this client. */
  setup?: Step[] | SetupFunction;
  env?: Record<string, string>;
  cwd?: string;
  runtime?: string;
  egress?: string;
  /** Rebuild when the snapshot is older than this: seconds, or "30m", "12h", "7d". */
  maxAge?: number | string;
  /** Sandboxes kept forked and started, ready to hand over. */
  poolSize?: number;
  /**
   * Processes left running after the setup (gVisor only), like an E2B
   * template's start command: the snapshot is a memory checkpoint, and every
   * sandbox of the environment continues them (a server started here answers
   * at once). The snapshot waits for readyPort to listen and readyCommand to
   * exit 0 (those given), within readyTimeoutMs (default 60 s).
   */
  start?: string | StartCommand;
}

/** What an environment leaves running in its snapshot. */
export interface StartCommand {
  run: string;
  readyPort?: number;
  readyCommand?: string;
  readyTimeoutMs?: number;
}

function startProto(s: string | StartCommand | undefined) {
  if (s === undefined) return undefined;
  const c = typeof s === "string" ? { run: s } : s;
  return { run: c.run, readyPort: c.readyPort ?? 0, readyCommand: c.readyCommand ?? "", readyTimeoutMs: BigInt(c.readyTimeoutMs ?? 0) };
}

const units: Record<string, number> = { s: 1, m: 60, h: 3600, d: 86400 };

function seconds(v: number | string | undefined): number {
  if (v === undefined) return 0;
  if (typeof v === "number") return v;
  const m = /^(\d+)([smhd]?)$/.exec(v.trim());
  if (!m) throw new ForkboxError("InvalidArgument", `maxAge ${JSON.stringify(v)}: want seconds or a number with s, m, h or d`);
  return Number(m[1]) * units[m[2] || "s"]!;
}

function stepProto(s: Step): MessageInitShape<typeof SetupStepSchema> {
  if (typeof s === "string") return { run: s };
  const content = typeof s.content === "string" ? new TextEncoder().encode(s.content) : s.content;
  return { writePath: s.path, writeContent: content, writeMode: s.mode ?? 0 };
}

/** An environment of a client. */
export class Environment {
  readonly name: string;
  private readonly definition: MessageInitShape<typeof EnvironmentDefinitionSchema>;
  private readonly setupFn?: SetupFunction;

  /** @internal */
  constructor(private readonly client: Client, name: string, o: EnvironmentOptions) {
    this.name = name;
    const { setup, ...rest } = o;
    this.definition = {
      name, image: o.image, resources: resourcesProto(o.resources),
      env: o.env, cwd: o.cwd, runtime: o.runtime, egress: o.egress,
      maxAgeSeconds: BigInt(seconds(o.maxAge)), poolSize: o.poolSize ?? 0, start: startProto(o.start),
    };
    if (typeof setup === "function") {
      this.setupFn = setup;
      this.definition.setupHash = createHash("sha256").update(setup.toString()).update(JSON.stringify(rest)).digest("hex");
    } else {
      this.definition.steps = (setup ?? []).map(stepProto);
    }
  }

  /**
   * Builds the environment unless it is built (concurrent builds of one
   * definition, from any client, make one build). Step setups stream their
   * progress to onProgress.
   */
  async build(onProgress?: (p: BuildProgress) => void): Promise<{ environment: EnvironmentInfo; built: boolean }> {
    if (this.setupFn) return this.runSetup();
    let env: EnvironmentInfo | undefined;
    let built = false;
    try {
      for await (const msg of this.client.rpc.environments.buildEnvironment({ definition: this.definition })) {
        const p = buildProgressFrom(msg);
        if (p.phase === "step" || p.phase === "create") built = true;
        if (p.environment) env = p.environment;
        onProgress?.(p);
      }
    } catch (err) {
      throw ForkboxError.from(err);
    }
    if (!env) throw new ForkboxError("Unavailable", "build stream ended without an environment");
    return { environment: env, built };
  }

  /**
   * A sandbox of the environment: from its warm pool when one is ready, else
   * forked from its snapshot, built first if needed. Holds a slot until
   * close(). `handover.built` says whether this call built the environment.
   */
  async sandbox(o: { overrides?: Overrides } = {}): Promise<SandboxHandle> {
    let builtHere = false;
    if (this.setupFn) builtHere = (await this.runSetup()).built;
    this.client.acquire(1);
    try {
      const r = await this.client.rpc.environments.environmentSandbox({
        definition: this.definition, overrides: overridesProto(o.overrides),
      });
      const sb = new SandboxHandle(this.client, r.sandbox!, this.client.limited);
      sb.handover = { built: r.built || builtHere, fromPool: r.fromPool, handoverMs: r.handoverMs };
      return sb;
    } catch (err) {
      this.client.release(1);
      throw ForkboxError.from(err);
    }
  }

  /** The environment as the daemon knows it (NotFound before its first build). */
  async info(): Promise<EnvironmentInfo> {
    const r = await this.client.rpc.environments.getEnvironment({ name: this.name }).catch(rethrow);
    return environmentFrom(r.environment!);
  }

  /** Deletes the environment (its snapshot and pool). */
  async delete(): Promise<void> {
    await this.client.rpc.environments.deleteEnvironment({ name: this.name }).catch(rethrow);
  }

  /**
   * The client-run setup: BeginBuild returns the environment if its hash is
   * built (it waits while another caller builds it), else a builder sandbox
   * and a lease; the setup function runs against the builder and
   * CompleteBuild keeps (ok) or drops (error) the result.
   */
  private async runSetup(): Promise<{ environment: EnvironmentInfo; built: boolean }> {
    const rpc = this.client.rpc.environments;
    const begin = await rpc.beginBuild({ definition: this.definition }).catch(rethrow);
    if (begin.environment && !begin.builder) return { environment: environmentFrom(begin.environment), built: false };
    if (!begin.builder || !begin.lease) throw new ForkboxError("Internal", "BeginBuild returned neither an environment nor a builder");
    const builder = new SandboxHandle(this.client, begin.builder, false);
    try {
      await this.setupFn!(builder);
    } catch (err) {
      const msg = err instanceof Error ? err.message : String(err);
      await rpc.completeBuild({ lease: begin.lease, ok: false, error: msg }).catch(() => {});
      throw err;
    }
    const done = await rpc.completeBuild({ lease: begin.lease, ok: true }).catch(rethrow);
    return { environment: environmentFrom(done.environment!), built: true };
  }
}
