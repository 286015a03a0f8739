// A throwaway forkbox daemon with its E2B-compatible endpoint, for running
// E2B's own SDK (from npm, unmodified) against it. It is started the way
// e2e/main_test.go and sdk/typescript's tests start one: its own state, run
// dir and socket in a temp dir, its own bridge, nftables table, veth prefix,
// subnet and cgroup parent. The E2B SDK reads E2B_API_URL, E2B_SANDBOX_URL
// and E2B_API_KEY, which this sets. At the end every sandbox is closed, the
// daemon gets SIGTERM and `forkbox uninstall --purge` removes its host state.
import { execFileSync, spawn } from "node:child_process";
import { mkdtempSync, openSync, readFileSync, rmSync, existsSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { before, after } from "node:test";
import { randomBytes } from "node:crypto";

/** The repository root: sdk/e2b-compat/test/helpers → ../../../.. */
export const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), "../../../..");
const bin = join(repoRoot, "bin/forkbox");

const netFlags = [
  "--bridge", "fbxe2b0", "--net-table", "forkbox_e2b", "--veth-prefix", "fbe",
  "--subnet", "10.217.0.0/24", "--cgroup-parent", "forkbox-e2b", "--btrfs-size", "8Gi",
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
  for (const b of ["runsc", "crun", "mkfs.btrfs", "go", "make"]) if (!which(b)) return `${b} is not installed (run ./scripts/setup.sh)`;
  return "";
}

/** The skip option: a reason outside CI; in CI (CI=true) a missing prerequisite fails. */
export function skipReason() {
  const why = prerequisite();
  if (why && process.env.CI === "true") throw new Error(`prerequisite missing in CI: ${why}`);
  return why || false;
}

async function freePort() {
  return await new Promise((res, rej) => {
    const s = createServer();
    s.once("error", rej);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => res(port));
    });
  });
}

function cli(d, ...args) {
  return execFileSync(bin, ["--host", `unix://${d.socket}`, ...args], { encoding: "utf8", stdio: ["ignore", "pipe", "inherit"] });
}

/**
 * Registers before/after hooks that start and tear down a daemon with its
 * E2B endpoint, import a busybox image and build two environments (one per
 * runtime). Returns an object whose fields are set once it runs: url, key,
 * image, envs ({gvisor, crun}), dir.
 */
export function useE2BDaemon() {
  const d = { url: "", key: "", image: "", envs: {}, dir: "", socket: "", flags: [], proc: undefined, log: "" };
  before(async () => {
    execFileSync("make", ["-s", "build"], { cwd: repoRoot, stdio: ["ignore", "ignore", "inherit"] });
    d.dir = mkdtempSync(join(tmpdir(), "forkbox-e2b-"));
    d.socket = join(d.dir, "forkbox.sock");
    d.log = join(d.dir, "daemon.log");
    d.key = "e2b_" + randomBytes(16).toString("hex");
    const port = await freePort();
    d.url = `http://127.0.0.1:${port}`;
    d.flags = ["--state-dir", join(d.dir, "state"), "--run-dir", join(d.dir, "run"), "--socket", d.socket, ...netFlags];
    const out = openSync(d.log, "a");
    d.proc = spawn(bin, ["serve", ...d.flags, "--api-token", d.key, "--e2b", `127.0.0.1:${port}`, "--log-level", "debug"],
      { stdio: ["ignore", out, out] });
    d.exited = new Promise((res) => d.proc.once("exit", res));
    try {
      await waitReady(d);
      const archive = join(d.dir, "busybox.tar");
      execFileSync("go", ["run", "./tools/mkimage", "-o", archive], { cwd: repoRoot, stdio: ["ignore", "ignore", "inherit"] });
      d.image = JSON.parse(cli(d, "--json", "image", "import", archive)).name;
      for (const rt of ["gvisor", "crun"]) {
        const name = `e2b-${rt}`;
        const def = join(d.dir, `${name}.json`);
        writeFileSync(def, JSON.stringify({ name, image: d.image, runtime: rt, egress: "none",
          setup: ["mkdir -p /opt/env && echo built-by-env > /opt/env/marker"] }));
        cli(d, "env", "build", "-f", def);
        d.envs[rt] = name;
      }
      process.env.E2B_API_URL = d.url;
      process.env.E2B_SANDBOX_URL = d.url;
      process.env.E2B_API_KEY = d.key;
    } catch (err) {
      await teardown(d);
      throw err;
    }
  });
  after(() => teardown(d));
  return d;
}

async function waitReady(d) {
  const deadline = Date.now() + 60_000;
  while (Date.now() < deadline) {
    if (d.proc.exitCode !== null) break;
    try {
      const r = await fetch(`${d.url}/health`, { headers: { "X-API-Key": d.key } });
      if (r.ok) return;
    } catch {}
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`daemon did not answer on ${d.url}:\n${tail(d.log)}`);
}

/** The daemon's log, to show when a test fails. */
export function tail(path, n = 4096) {
  try {
    return readFileSync(path, "utf8").slice(-n);
  } catch {
    return "";
  }
}

async function teardown(d) {
  if (!d.dir) return;
  if (d.proc && d.proc.exitCode === null) {
    try {
      for (const s of JSON.parse(cli(d, "--json", "ls"))) {
        try {
          cli(d, "rm", s.id);
        } catch {}
      }
    } catch {}
    d.proc.kill("SIGTERM");
    await d.exited;
  }
  if (process.env.FORKBOX_E2B_LOG) console.error(tail(d.log, 1 << 20));
  try {
    execFileSync(bin, ["uninstall", "--purge", ...d.flags], { stdio: ["ignore", "ignore", "inherit"] });
  } catch (err) {
    console.error("forkbox uninstall:", err.message);
  }
  if (existsSync(d.dir)) rmSync(d.dir, { recursive: true, force: true });
  d.dir = "";
}
