// types: what the SDK hands its users, as plain objects. The daemon's
// protobuf messages carry `$typeName` and BigInt fields, which
// JSON.stringify cannot serialize; every result goes through one of the
// converters below, so users get numbers, Dates for times and nothing else.
import type * as pb from "./gen/forkbox/v1/forkbox_pb.js";
import type { Resources } from "./client.js";

/** A sandbox as the daemon knows it. */
export interface SandboxInfo {
  id: string;
  name: string;
  /** "creating", "running", "paused", "hibernating", "hibernated", "degraded", "failed", "closing", "closed". */
  state: string;
  image: string;
  imageDigest: string;
  resources: Resources;
  env: Record<string, string>;
  cwd: string;
  /** "none", "all" or "allow". */
  egress: string;
  /** Egress lists, canonical (CIDRs, then names). */
  egressAllow: string[];
  egressDeny: string[];
  runtime: string;
  hostname: string;
  ip: string;
  createdAt: Date;
  snapshotter: string;
  /** Why the sandbox failed, if it did. */
  error: string;
  /** The checkpoint it was started from (forks, restores), or "". */
  fromCheckpoint: string;
  /** The sandbox it was forked from, or "". */
  parentId: string;
  /** Names of its credentials (never values). */
  credentials: string[];
  machineId: string;
  /**
   * When the sandbox expires (its deadline, capped by the daemon's
   * --max-lifetime), or null if it never does (the daemon's --idle-timeout
   * aside).
   */
  expiresAt: Date | null;
  /** Its timeout in ms (0 = none); forks and restores inherit it. */
  timeoutMs: number;
  /** What expiry does: "close" or "hibernate". */
  onTimeout: string;
}

/** A named, immutable capture of a sandbox's state. */
export interface Checkpoint {
  id: string;
  sandboxId: string;
  sandboxName: string;
  tag: string;
  createdAt: Date;
  /** Bytes of the snapshot, where known. */
  size: number;
  /** "filesystem" or "filesystem+memory". */
  kind: string;
  image: string;
  /** How long the source was frozen. */
  captureMs: number;
  /** Writeback before the freeze (while the source ran). */
  flushMs: number;
}

/** One entry of a sandbox's ledger. */
export interface Event {
  seq: number;
  sandboxId: string;
  /** "sandbox.created", "exec.finished", "sandbox.checkpoint_created", ... */
  type: string;
  time: Date;
  /** The event's data as the daemon recorded it (JSON text). */
  dataJson: string;
  /** dataJson parsed, or undefined when there is none. */
  data?: unknown;
}

export interface FileInfo {
  name: string;
  size: number;
  mode: number;
  dir: boolean;
  mtime: Date;
}

/**
 * One reading of a sandbox's usage counters. Under gVisor cpu, memory and
 * pids are the runtime's on the host (the sentry runs the sandbox's
 * processes; pids counts its threads); under crun the processes' own. A CPU
 * rate is the difference of two readings' cpuSeconds over their time.
 */
export interface SandboxMetrics {
  sandboxId: string;
  name: string;
  state: string;
  runtime: string;
  time: Date;
  cpuSeconds: number;
  cpuLimit: number;
  memoryBytes: number;
  memoryLimitBytes: number;
  diskBytes: number;
  diskLimitBytes: number;
  netRxBytes: number;
  netTxBytes: number;
  pids: number;
  pidsLimit: number;
  /** Counters that could not be read this time, with why. */
  unavailable: Record<string, string>;
}

/** @internal */
export function metricsFrom(m: pb.SandboxMetrics): SandboxMetrics {
  return {
    sandboxId: m.sandboxId, name: m.name, state: m.state, runtime: m.runtime, time: new Date(Number(m.timeUnixMs)),
    cpuSeconds: m.cpuSeconds, cpuLimit: m.cpuLimit, memoryBytes: Number(m.memoryBytes), memoryLimitBytes: Number(m.memoryLimitBytes),
    diskBytes: Number(m.diskBytes), diskLimitBytes: Number(m.diskLimitBytes), netRxBytes: Number(m.netRxBytes),
    netTxBytes: Number(m.netTxBytes), pids: Number(m.pids), pidsLimit: Number(m.pidsLimit), unavailable: { ...m.unavailable },
  };
}

/** A credential's settings (its value is never returned). */
export interface Credential {
  name: string;
  env: string;
  file: string;
  perFork: boolean;
  updatedAt: Date;
}

export interface Image {
  name: string;
  digest: string;
  size: number;
  layers: number;
  createdAt: Date;
}

export interface ImageProgress {
  phase: string;
  done: number;
  total: number;
  /** Set on the last message. */
  image?: Image;
}

/** One exec replayed (or skipped) by client.resume(). */
export interface ReplayedExec {
  execId: string;
  argv: string[];
  shell: string;
  skipped: boolean;
  skipReason: string;
  exitCode: number;
  error: string;
}

/** A setup step of an environment definition. */
export interface SetupStepInfo {
  run: string;
  writePath: string;
  writeContent: Uint8Array;
  writeMode: number;
}

export interface EnvironmentDefinition {
  name: string;
  image: string;
  resources: Resources;
  env: Record<string, string>;
  cwd: string;
  runtime: string;
  steps: SetupStepInfo[];
  maxAgeSeconds: number;
  poolSize: number;
  setupHash: string;
  egress: string;
  /** What the environment leaves running (its snapshot holds memory). */
  start?: { run: string; readyPort: number; readyCommand: string; readyTimeoutMs: number };
}

/** An environment as the daemon knows it. */
export interface EnvironmentInfo {
  definition?: EnvironmentDefinition;
  hash: string;
  /** The warm snapshot (a checkpoint ID); "" until built. */
  checkpoint: string;
  builtAt: Date;
  buildMs: number;
  /** "ready", "building", "failed", "new". */
  state: string;
  error: string;
  poolReady: number;
  cachedSteps: number;
}

export interface BuildProgress {
  /** "cached", "create", "step", "checkpoint", "done", "wait". */
  phase: string;
  step: number;
  steps: number;
  message: string;
  /** Output of a step, as produced. */
  output: Uint8Array;
  exitCode: number;
  /** Set on the last message. */
  environment?: EnvironmentInfo;
}

const date = (ms: bigint) => new Date(Number(ms));

/**
 * @internal Resources as plain values: every field the message has (fields
 * added to the proto later too), int64s as numbers.
 */
export function resourcesFrom(r?: pb.Resources): Resources {
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(r ?? {})) {
    if (k !== "$typeName") out[k] = typeof v === "bigint" ? Number(v) : v;
  }
  return out as Resources;
}

/** @internal */
export function sandboxFrom(s: pb.Sandbox): SandboxInfo {
  return {
    id: s.id, name: s.name, state: s.state, image: s.image, imageDigest: s.imageDigest,
    resources: resourcesFrom(s.resources), env: { ...s.env }, cwd: s.cwd, egress: s.egress,
    egressAllow: [...s.egressAllow], egressDeny: [...s.egressDeny], runtime: s.runtime,
    hostname: s.hostname, ip: s.ip, createdAt: date(s.createdAtUnixMs), snapshotter: s.snapshotter, error: s.error,
    fromCheckpoint: s.fromCheckpoint, parentId: s.parentId, credentials: [...s.credentials], machineId: s.machineId,
    expiresAt: s.expiresAtUnixMs ? date(s.expiresAtUnixMs) : null, timeoutMs: Number(s.timeoutMs), onTimeout: s.onTimeout,
  };
}

/** @internal */
export function checkpointFrom(c: pb.Checkpoint): Checkpoint {
  return {
    id: c.id, sandboxId: c.sandboxId, sandboxName: c.sandboxName, tag: c.tag, createdAt: date(c.createdAtUnixMs),
    size: Number(c.size), kind: c.kind, image: c.image, captureMs: c.captureMs, flushMs: c.flushMs,
  };
}

/** @internal */
export function eventFrom(e: pb.Event): Event {
  const ev: Event = { seq: Number(e.seq), sandboxId: e.sandboxId, type: e.type, time: date(e.timeUnixMs), dataJson: e.dataJson };
  if (e.dataJson) {
    try {
      ev.data = JSON.parse(e.dataJson);
    } catch {
      // Not JSON: dataJson keeps the text.
    }
  }
  return ev;
}

/** @internal */
export function fileInfoFrom(f: pb.FileInfo): FileInfo {
  return { name: f.name, size: Number(f.size), mode: f.mode, dir: f.dir, mtime: date(f.mtimeUnixMs) };
}

/** @internal */
export function credentialFrom(c: pb.Credential): Credential {
  return { name: c.name, env: c.env, file: c.file, perFork: c.perFork, updatedAt: date(c.updatedAtUnixMs) };
}

/** @internal */
export function imageFrom(i: pb.Image): Image {
  return { name: i.name, digest: i.digest, size: Number(i.size), layers: i.layers, createdAt: date(i.createdAtUnixMs) };
}

/** @internal */
export function imageProgressFrom(p: pb.ImageProgress): ImageProgress {
  const out: ImageProgress = { phase: p.phase, done: Number(p.done), total: Number(p.total) };
  if (p.image) out.image = imageFrom(p.image);
  return out;
}

/** @internal */
export function replayedFrom(r: pb.ReplayedExec): ReplayedExec {
  return {
    execId: r.execId, argv: [...r.argv], shell: r.shell, skipped: r.skipped, skipReason: r.skipReason,
    exitCode: r.exitCode, error: r.error,
  };
}

function definitionFrom(d: pb.EnvironmentDefinition): EnvironmentDefinition {
  return {
    name: d.name, image: d.image, resources: resourcesFrom(d.resources), env: { ...d.env }, cwd: d.cwd, runtime: d.runtime,
    steps: d.steps.map((s) => ({ run: s.run, writePath: s.writePath, writeContent: s.writeContent, writeMode: s.writeMode })),
    maxAgeSeconds: Number(d.maxAgeSeconds), poolSize: d.poolSize, setupHash: d.setupHash, egress: d.egress,
    start: d.start && { run: d.start.run, readyPort: d.start.readyPort, readyCommand: d.start.readyCommand,
      readyTimeoutMs: Number(d.start.readyTimeoutMs) },
  };
}

/** @internal */
export function environmentFrom(e: pb.Environment): EnvironmentInfo {
  const out: EnvironmentInfo = {
    hash: e.hash, checkpoint: e.checkpoint, builtAt: date(e.builtAtUnixMs), buildMs: e.buildMs, state: e.state,
    error: e.error, poolReady: e.poolReady, cachedSteps: e.cachedSteps,
  };
  if (e.definition) out.definition = definitionFrom(e.definition);
  return out;
}

/** @internal */
export function buildProgressFrom(p: pb.BuildProgress): BuildProgress {
  const out: BuildProgress = {
    phase: p.phase, step: p.step, steps: p.steps, message: p.message, output: p.output, exitCode: p.exitCode,
  };
  if (p.environment) out.environment = environmentFrom(p.environment);
  return out;
}
