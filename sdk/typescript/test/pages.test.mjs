// The list helpers follow pages: allSandboxes is an async iterator that
// fetches a page at a time, listSandboxes and events collect every page.
// The RPC client is a stand-in that serves pages; no daemon needed.
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { Client, FULL_PAGE, isInvalidArgument } from "../dist/index.js";
import { ConnectError, Code } from "@connectrpc/connect";
import { create } from "@bufbuild/protobuf";
import { SandboxSchema, EventSchema } from "../dist/gen/forkbox/v1/forkbox_pb.js";

function paged(n) {
  const calls = [];
  const page = (req, make) => {
    calls.push({ pageSize: req.pageSize, pageToken: req.pageToken });
    if (req.pageToken !== "" && !/^\d+$/.test(req.pageToken)) {
      throw new ConnectError("page token is not valid", Code.InvalidArgument);
    }
    const from = req.pageToken === "" ? 0 : Number(req.pageToken);
    const size = req.pageSize || 100;
    const items = [];
    for (let i = from; i < Math.min(from + size, n); i++) items.push(make(i));
    return { items, next: from + size < n ? String(from + size) : "" };
  };
  const c = new Client({ socket: "/nonexistent/forkbox.sock" });
  Object.defineProperty(c, "rpc", {
    value: {
      sandboxes: {
        listSandboxes: async (req) => {
          const p = page(req, (i) => create(SandboxSchema, { id: `sb-${i}`, name: `n${i}`, state: "running" }));
          return { sandboxes: p.items, nextPageToken: p.next };
        },
        events: async (req) => {
          const p = page(req, (i) => create(EventSchema, { seq: BigInt(i + 1), type: "exec.started", dataJson: "{}" }));
          return { events: p.items, nextPageToken: p.next };
        },
      },
    },
  });
  return { c, calls };
}

describe("pages", () => {
  it("iterates every sandbox once, a page at a time", async () => {
    const { c, calls } = paged(250);
    const seen = new Set();
    for await (const sb of c.allSandboxes({ pageSize: 40 })) {
      assert.ok(!seen.has(sb.id), `${sb.id} twice`);
      seen.add(sb.id);
    }
    assert.equal(seen.size, 250);
    assert.equal(calls.length, 7);
    assert.ok(calls.every((x) => x.pageSize === 40));
  });

  it("fetches no further page after a break", async () => {
    const { c, calls } = paged(250);
    let n = 0;
    for await (const _ of c.allSandboxes({ pageSize: 10 })) {
      if (++n === 15) break;
    }
    assert.equal(calls.length, 2);
  });

  it("collects every page in listSandboxes and events", async () => {
    const { c, calls } = paged(2500);
    assert.equal((await c.listSandboxes()).length, 2500);
    assert.equal(calls.length, 3);
    assert.equal(calls[0].pageSize, FULL_PAGE);
    assert.equal((await c.events("sb-1")).length, 2500);
  });

  it("gives one page with its token", async () => {
    const { c } = paged(5);
    const p = await c.listSandboxesPage({ pageSize: 2 });
    assert.deepEqual(p.sandboxes.map((s) => s.id), ["sb-0", "sb-1"]);
    assert.equal(p.nextPageToken, "2");
    const last = await c.listSandboxesPage({ pageSize: 2, pageToken: "4" });
    assert.equal(last.nextPageToken, "");
  });

  it("refuses a bad token as InvalidArgument", async () => {
    const { c } = paged(5);
    await assert.rejects(async () => {
      for await (const _ of c.allSandboxes({ pageToken: "forged' OR 1=1" })) assert.fail("a sandbox for a bad token");
    }, (err) => isInvalidArgument(err));
  });
});
