// A throwaway forkbox daemon for the SDK tests, started the way e2e/main_test.go
// starts one: its own state, run dir and socket in a temp dir, its own bridge,
// nftables table, veth prefix, subnet and cgroup parent. At the end every
// sandbox is closed, the daemon gets SIGTERM and `forkbox uninstall --purge`
// removes its host state (bridge, nft table, btrfs loop device).
import { execFileSync, spawn } from "node:child_process";
import { mkdtempSync, openSync, readFileSync, rmSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { before, after } from "node:test";
import { Writable } from "node:stream";
import { Client } from "../../dist/index.js";

/** The repository root: sdk/typescript/test/helpers → ../../../.. */
export const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), "../../../..");
const bin = join(repoRoot, "bin/forkbox");

const netFlags = [
  "--bridge", "fbxts0", "--net-table", "forkbox_ts", "--veth-prefix", "fbt",
  "--subnet", "10.216.0.0/24", "--cgroup-parent", "forkbox-ts", "--btrfs-size", "8Gi",
];

function which(cmd) {
  try {
    execFileSync("sh", ["-c", `command -v ${cmd}`], { stdio: "ignore" });
    return true;
  } catch {
    return false;
  }
}

/** What this machine lacks for the tests, or "". */
export function prerequisite() {
  if (process.getuid?.() !== 0) return "needs root";
  for (const b of ["runsc", "mkfs.btrfs", "go", "make"]) if (!which(b)) return `${b} is not installed (run ./scripts/setup.sh)`;
  return "";
}

/**
 * The skip option for a suite: a reason outside CI, and in CI (CI=true) a
 * missing prerequisite is a failure instead.
 */
export function skipReason() {
  const why = prerequisite();
  if (why && process.env.CI === "true") throw new Error(`prerequisite missing in CI: ${why}`);
  return why || false;
}

/**
 * Registers before/after hooks that start and tear down a daemon (with
 * extra serve flags); returns an object whose fields are set once it runs:
 * client, clientOptions (to make another Client of the same daemon),
 * hostArgs (the CLI's flags that reach it), socket, image, dir.
 */
export function useDaemon(extra = []) {
  const d = { client: undefined, socket: "", image: "", dir: "", archive: "", flags: [], proc: undefined, log: "" };
  if (process.env.FORKBOX_TEST_GATEWAY) return useGateway(d);
  before(async () => {
    execFileSync("make", ["-s", "build"], { cwd: repoRoot, stdio: ["ignore", "ignore", "inherit"] });
    d.dir = mkdtempSync(join(tmpdir(), "forkbox-ts-"));
    d.socket = join(d.dir, "forkbox.sock");
    d.log = join(d.dir, "daemon.log");
    d.flags = ["--state-dir", join(d.dir, "state"), "--run-dir", join(d.dir, "run"), "--socket", d.socket, ...netFlags];
    const out = openSync(d.log, "a");
    d.proc = spawn(bin, ["serve", ...d.flags, ...extra, "--log-level", "debug"], { stdio: ["ignore", out, out] });
    d.exited = new Promise((res) => d.proc.once("exit", res));
    try {
      d.clientOptions = { socket: d.socket };
      d.hostArgs = ["--host", `unix://${d.socket}`];
      d.client = new Client(d.clientOptions);
      await waitReady(d);
      const archive = join(d.dir, "busybox.tar");
      d.archive = archive;
      execFileSync("go", ["run", "./tools/mkimage", "-o", archive], { cwd: repoRoot, stdio: ["ignore", "ignore", "inherit"] });
      d.image = (await d.client.importImage(archive)).name;
    } catch (err) {
      await teardown(d);
      throw err;
    }
  });
  after(() => teardown(d));
  return d;
}

/**
 * The suite against a running `forkbox serve --gateway` instead of a
 * daemon of its own (e2e/cluster's TestGatewayTypeScriptSDK sets these):
 * FORKBOX_TEST_GATEWAY (http://host:port), FORKBOX_TEST_TOKEN, and
 * FORKBOX_TEST_IMAGE (an image on the cluster's nodes), FORKBOX_TEST_ARCHIVE
 * (an image archive on this host, for importImage's bytes). There is no local
 * socket, state dir or serve flags then; the sandboxes left at the end
 * are closed.
 */
function useGateway(d) {
  before(() => {
    execFileSync("make", ["-s", "build"], { cwd: repoRoot, stdio: ["ignore", "ignore", "inherit"] }); // the CLI, for tests that run it
    d.gateway = process.env.FORKBOX_TEST_GATEWAY;
    d.clientOptions = { url: d.gateway, token: process.env.FORKBOX_TEST_TOKEN ?? "" };
    d.hostArgs = ["--host", d.gateway, "--token", d.clientOptions.token];
    d.client = new Client(d.clientOptions);
    d.image = process.env.FORKBOX_TEST_IMAGE ?? "";
    d.archive = process.env.FORKBOX_TEST_ARCHIVE ?? ""; // an image archive on this host
  });
  after(async () => {
    for (const s of await d.client.listSandboxes()) await (await d.client.getSandbox(s.id)).close().catch(() => {});
  });
  return d;
}

async function waitReady(d) {
  const deadline = Date.now() + 60_000;
  while (Date.now() < deadline) {
    if (d.proc.exitCode !== null) break;
    try {
      await d.client.listSandboxes();
      return;
    } catch {
      await new Promise((r) => setTimeout(r, 100));
    }
  }
  throw new Error(`daemon did not answer on ${d.socket}:\n${tail(d.log)}`);
}

function tail(path, n = 4096) {
  try {
    const s = readFileSync(path, "utf8");
    return s.slice(-n);
  } catch {
    return "";
  }
}

async function teardown(d) {
  if (!d.dir) return;
  if (d.proc && d.proc.exitCode === null) {
    try {
      const c = new Client({ socket: d.socket });
      for (const s of await c.listSandboxes()) await (await c.getSandbox(s.id)).close().catch(() => {});
    } catch {}
    d.proc.kill("SIGTERM");
    await d.exited;
  }
  if (process.env.FORKBOX_TS_LOG) console.error(tail(d.log, 1 << 20));
  try {
    execFileSync(bin, ["uninstall", "--purge", ...d.flags], { stdio: ["ignore", "ignore", "inherit"] });
  } catch (err) {
    console.error("forkbox uninstall:", err.message);
  }
  if (existsSync(d.dir)) rmSync(d.dir, { recursive: true, force: true });
  d.dir = "";
}

/** A writable that keeps what is written to it: capture().text(). */
export function capture() {
  const chunks = [];
  const w = new Writable({
    write(chunk, _enc, cb) {
      chunks.push(Buffer.from(chunk));
      cb();
    },
  });
  w.text = () => Buffer.concat(chunks).toString("utf8");
  w.writes = () => chunks.length;
  return w;
}
