// The two example programs of the SDK reference (seeds/sdk-fork-reference.txt),
// run for real. Only the image names and the package-install commands are
// swapped for offline ones (busybox), and `.pipe(process.stdout)` pipes into
// `stdout`, a writable the test captures. Everything else is the seed's text.
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { capture, skipReason, useDaemon } from "./helpers/daemon.mjs";

// "Basic usage". npm ci → a setup that writes and archives files; npm test
// and npm run build → commands that print something checkable.
async function basicUsage(client, stdout) {
  const sb = await client.sandbox({
    image: "forkbox.local/busybox:latest",
    resources: { cpu: "1", memory: "512Mi" },
    name: "my-job",
  });

  try {
    await sb.exec("mkdir -p /app && echo 'console' > /app/a && tar czf /app/deps.tgz /app/a");

    const fork = await sb.fork("after-install");
    try {
      // Run different workloads in parallel on the same base state
      await Promise.all([
        sb.exec("tar tzf /app/deps.tgz && echo 'tests: 1 passed'").pipe(stdout),
        fork.exec("mkdir -p /app/dist && cp /app/a /app/dist/bundle.js && echo built $(cat /app/dist/bundle.js)").pipe(stdout),
      ]);
    } finally {
      await fork.close();
    }
  } finally {
    await sb.close();
  }
}

// "Branching experiments". pip install → commands that write version files;
// python3 -c 'import X; print(X.__version__)' → cat of that file.
async function branchingExperiments(client, stdout) {
  const env = client.environment("python-base", {
    image: "forkbox.local/busybox:latest",
    resources: { cpu: "1", memory: "1Gi" },
    setup: async (sb) => {
      await sb.exec("mkdir -p /site && echo 1.26.4 > /site/numpy.version");
    },
  });

  const sb = await env.sandbox();
  try {
    // Fork into two independent experiment tracks
    const [forkA, forkB] = await Promise.all([sb.fork("track-a"), sb.fork("track-b")]);

    await Promise.all([
      forkA
        .exec("test -f /site/numpy.version && echo 2.2.3 > /site/pandas.version")
        .then(() =>
          forkA.exec("cat /site/pandas.version").pipe(stdout),
        )
        .finally(() => forkA.close()),

      forkB
        .exec("test -f /site/numpy.version && echo 2.5.1+cpu > /site/torch.version")
        .then(() =>
          forkB.exec("cat /site/torch.version").pipe(stdout),
        )
        .finally(() => forkB.close()),
    ]);
  } finally {
    await sb.close();
  }
}

describe("seed examples", { skip: skipReason() }, () => {
  const d = useDaemon();

  it("basic usage: fork after install, run two workloads in parallel", async () => {
    assert.equal(d.image, "forkbox.local/busybox:latest");
    const stdout = capture();
    await basicUsage(d.client, stdout);
    const lines = stdout.text().split("\n").filter(Boolean).sort();
    assert.deepEqual(lines, ["app/a", "built console", "tests: 1 passed"]);
    const checkpoints = await d.client.events("my-job");
    assert.ok(checkpoints.some((e) => e.type === "sandbox.checkpoint_created" && e.dataJson.includes("after-install")));
    assert.equal((await d.client.listSandboxes()).length, 0, "the example leaves no sandbox");
  });

  it("branching experiments: environment with a setup function, two fork tracks", async () => {
    const stdout = capture();
    await branchingExperiments(d.client, stdout);
    const lines = stdout.text().split("\n").filter(Boolean).sort();
    assert.deepEqual(lines, ["2.2.3", "2.5.1+cpu"]);
    assert.equal((await d.client.listSandboxes()).length, 0, "the example leaves no sandbox");
    // Run again: the environment is built; the setup is not run twice.
    const again = capture();
    await branchingExperiments(d.client, again);
    assert.deepEqual(again.text().split("\n").filter(Boolean).sort(), ["2.2.3", "2.5.1+cpu"]);
    const envs = await d.client.rpc.environments.listEnvironments({});
    const pb = envs.environments.find((e) => e.definition?.name === "python-base");
    assert.equal(pb?.state, "ready");
  });
});
