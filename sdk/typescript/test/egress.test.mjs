// Egress lists travel in create and fork overrides and come back in the
// sandbox's info; no daemon needed.
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { create } from "@bufbuild/protobuf";
import { overridesProto } from "../dist/client.js";
import { sandboxFrom } from "../dist/types.js";
import { SandboxSchema, OverridesSchema } from "../dist/gen/forkbox/v1/forkbox_pb.js";

describe("egress", () => {
  it("sends the lists in fork overrides", () => {
    const o = create(OverridesSchema, overridesProto({ egressAllow: ["api.example.com", "10.1.0.0/16"], egressDeny: ["10.1.2.0/24"] }));
    assert.deepEqual(o.egressAllow, ["api.example.com", "10.1.0.0/16"]);
    assert.deepEqual(o.egressDeny, ["10.1.2.0/24"]);
  });
  it("reads the lists back", () => {
    const s = sandboxFrom(create(SandboxSchema, { egress: "allow", egressAllow: ["10.1.0.0/16", "api.example.com"], egressDeny: ["10.1.2.0/24"] }));
    assert.equal(s.egress, "allow");
    assert.deepEqual(s.egressAllow, ["10.1.0.0/16", "api.example.com"]);
    assert.deepEqual(s.egressDeny, ["10.1.2.0/24"]);
  });
});
