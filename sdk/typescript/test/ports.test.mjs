// sandbox.url / sandbox.getHost against a real daemon with a preview
// listener: a server in the sandbox reached with its token, refused without.
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { isPermissionDenied } from "../dist/index.js";
import { skipReason, useDaemon } from "./helpers/daemon.mjs";

describe("ports", { skip: skipReason() }, () => {
  const d = useDaemon(["--ports", "127.0.0.1:0"]);

  it("gives each sandbox port a URL with its token", async () => {
    const sb = await d.client.sandbox({ image: d.image, resources: { cpu: "1", memory: "256Mi" } });
    try {
      await sb.exec("mkdir -p /www && echo hello-from-ts > /www/index.html");
      sb.exec("httpd -f -p 8080 -h /www").catch(() => {}); // runs until the sandbox closes
      const host = await sb.getHost(8080);
      assert.match(host, new RegExp(`^8080-${sb.id}\\.localhost:\\d+$`));
      const url = await sb.url(8080);
      const p = await sb.portURL(8080);
      assert.equal(url, p.url);
      assert.ok(url.startsWith(`http://${host}/?forkbox_token=`) && url.endsWith(p.token));
      // Node's fetch cannot set Host: use the path form, token in the header.
      const base = p.pathUrl.replace(/\?.*$/, "");
      const deadline = Date.now() + 60_000;
      let r;
      for (;;) {
        r = await fetch(base + "index.html", { headers: { "X-Forkbox-Port-Token": p.token } });
        if (r.status !== 502 || Date.now() > deadline) break;
        await new Promise((res) => setTimeout(res, 50)); // poll: httpd may not listen yet
      }
      assert.equal(r.status, 200);
      assert.equal(await r.text(), "hello-from-ts\n");
      const anon = await fetch(base + "index.html");
      assert.equal(anon.status, 401);
      await assert.rejects(sb.url(7077), (e) => isPermissionDenied(e));
    } finally {
      await sb.close();
    }
  });
});
