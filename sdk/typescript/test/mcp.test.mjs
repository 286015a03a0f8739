// `forkbox mcp` driven by the official MCP TypeScript client
// (@modelcontextprotocol/sdk), as an agent would drive it: over stdio as a
// subprocess, and over streamable HTTP behind a bearer token, against a real
// daemon.
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { join } from "node:path";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { repoRoot, skipReason, useDaemon } from "./helpers/daemon.mjs";

const bin = join(repoRoot, "bin/forkbox");

/** Calls a tool and returns its structured content; a tool error fails the test with its text. */
async function tool(mcp, name, args) {
  const r = await mcp.callTool({ name, arguments: args });
  assert.ok(!r.isError, `${name}: ${r.content?.map((c) => c.text).join("")}`);
  return r.structuredContent;
}

describe("forkbox mcp", { skip: skipReason() }, () => {
  const d = useDaemon();

  it("serves tools and the ledger over stdio", async () => {
    const transport = new StdioClientTransport({ command: bin, args: [...d.hostArgs, "mcp"], stderr: "pipe" });
    let stderr = "";
    transport.stderr?.on("data", (b) => { stderr += b; });
    const mcp = new Client({ name: "forkbox-test", version: "0.0.0" });
    await mcp.connect(transport);
    const made = [];
    try {
      const { tools } = await mcp.listTools();
      const names = tools.map((t) => t.name).sort();
      assert.deepEqual(names, ["checkpoint", "close", "create", "exec", "fork", "list", "read_file", "restore", "write_file"]);
      for (const t of tools) {
        assert.equal(t.inputSchema.type, "object", `${t.name} input schema`);
        assert.ok(t.outputSchema, `${t.name} has no output schema`);
      }
      const exec = tools.find((t) => t.name === "exec");
      assert.ok(exec.inputSchema.properties.max_output_bytes);
      assert.ok(exec.outputSchema.properties.stdout_truncated);

      const sb = await tool(mcp, "create", { image: d.image, name: "mcp-src", memory: "256Mi" });
      made.push(sb.id);
      assert.match(sb.id, /^sb-/);
      assert.equal(sb.name, "mcp-src");
      assert.equal(sb.state, "running");

      const echo = await tool(mcp, "exec", { sandbox: "mcp-src", command: "echo hello from mcp; echo to-err >&2; exit 2" });
      assert.equal(echo.exit_code, 2);
      assert.equal(echo.stdout, "hello from mcp\n");
      assert.equal(echo.stderr, "to-err\n");
      assert.equal(echo.stdout_truncated, false);

      const big = await tool(mcp, "exec", { sandbox: sb.id, argv: ["sh", "-c", "seq 1 100000"], max_output_bytes: 100 });
      assert.equal(big.exit_code, 0);
      assert.equal(big.stdout_truncated, true);
      assert.ok(big.stdout.length <= 100);
      assert.ok(big.stdout.endsWith("99999\n100000\n"), big.stdout);

      await tool(mcp, "write_file", { sandbox: sb.id, path: "/root/state", content: "from the parent\n" });
      const fork = await tool(mcp, "fork", { sandbox: sb.id, count: 2, tag: "mcp-fork" });
      assert.equal(fork.children.length, 2);
      assert.equal(fork.captured, "filesystem");
      assert.match(fork.checkpoint.id, /^ck-/);
      for (const c of fork.children) {
        assert.ok(c.sandbox, `child failed: ${c.error} (${c.error_class})`);
        made.push(c.sandbox.id);
        assert.equal(c.sandbox.parent_id, sb.id);
      }
      const child = fork.children[0].sandbox;
      await tool(mcp, "exec", { sandbox: child.id, command: "echo child >> /root/state" });
      const file = await tool(mcp, "read_file", { sandbox: child.id, path: "/root/state" });
      assert.equal(file.content, "from the parent\nchild\n");
      assert.equal(file.encoding, "utf8");
      assert.equal(file.truncated, false);
      const cut = await tool(mcp, "read_file", { sandbox: sb.id, path: "/root/state", max_bytes: 4 });
      assert.deepEqual([cut.content, cut.truncated, cut.size], ["from", true, 16]);

      const ck = await tool(mcp, "checkpoint", { sandbox: sb.id, tag: "mcp-ck" });
      const cks = await tool(mcp, "list", { sandbox: sb.id });
      assert.deepEqual(cks.checkpoints.map((c) => c.tag).filter((t) => t.startsWith("mcp-")), ["mcp-fork", "mcp-ck"]);
      const restored = await tool(mcp, "restore", { checkpoint: ck.id, name: "mcp-restored" });
      made.push(restored.id);
      assert.equal(restored.from_checkpoint, ck.id);
      const live = await tool(mcp, "list", {});
      assert.ok(made.every((id) => live.sandboxes.some((s) => s.id === id)));

      const { resourceTemplates } = await mcp.listResourceTemplates();
      assert.deepEqual(resourceTemplates.map((t) => t.uriTemplate), ["forkbox://sandboxes/{id}/ledger"]);
      const ledger = await mcp.readResource({ uri: `forkbox://sandboxes/${sb.id}/ledger` });
      assert.equal(ledger.contents[0].mimeType, "application/json");
      const events = JSON.parse(ledger.contents[0].text);
      const types = events.map((e) => e.type);
      assert.equal(types[0], "sandbox.created");
      assert.ok(types.includes("sandbox.checkpoint_created"), types.join(", "));
      assert.ok(types.filter((t) => t.startsWith("exec.")).length >= 2, types.join(", "));

      const missing = await mcp.callTool({ name: "exec", arguments: { sandbox: "sb-nope", command: "true" } });
      assert.equal(missing.isError, true);
      assert.equal(missing._meta?.errorClass, "NotFound");
      assert.match(missing.content[0].text, /\(NotFound\)$/);
      const bad = await mcp.callTool({ name: "fork", arguments: { sandbox: sb.id, count: 500 } });
      assert.equal(bad.isError, true);
      assert.equal(bad._meta?.errorClass, "InvalidArgument");

      for (const id of made.splice(0)) assert.deepEqual(await tool(mcp, "close", { sandbox: id }), { closed: id });
      const closed = await mcp.callTool({ name: "close", arguments: { sandbox: sb.id } });
      assert.equal(closed._meta?.errorClass, "NotFound");
    } catch (err) {
      err.message += `\nforkbox mcp stderr:\n${stderr}`;
      throw err;
    } finally {
      for (const id of made) await mcp.callTool({ name: "close", arguments: { sandbox: id } }).catch(() => {});
      await mcp.close();
    }
  });

  it("serves streamable HTTP behind a bearer token", async () => {
    const proc = spawn(bin, [...d.hostArgs, "mcp", "--http", "127.0.0.1:0", "--api-token", "t0ken"], {
      stdio: ["ignore", "ignore", "pipe"],
    });
    const exited = once(proc, "exit");
    try {
      // The address is logged once the listener is up.
      let log = "";
      const url = await new Promise((resolve, reject) => {
        proc.stderr.on("data", (b) => {
          log += b;
          const m = /addr=(http:\/\/127\.0\.0\.1:\d+)/.exec(log);
          if (m) resolve(m[1]);
        });
        proc.once("exit", (code) => reject(new Error(`forkbox mcp --http exited ${code}:\n${log}`)));
      });
      const denied = await fetch(url, { method: "POST", headers: { "Content-Type": "application/json" }, body: "{}" });
      assert.equal(denied.status, 401);

      const mcp = new Client({ name: "forkbox-test-http", version: "0.0.0" });
      await mcp.connect(new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers: { Authorization: "Bearer t0ken" } } }));
      try {
        const sb = await tool(mcp, "create", { image: d.image, name: "mcp-http", memory: "256Mi" });
        try {
          const r = await tool(mcp, "exec", { sandbox: sb.id, command: "echo over http" });
          assert.equal(r.stdout, "over http\n");
        } finally {
          await tool(mcp, "close", { sandbox: sb.id });
        }
      } finally {
        await mcp.close();
      }
    } finally {
      proc.kill("SIGTERM");
      await exited;
    }
  });
});
