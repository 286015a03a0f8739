// Resources travel both ways with every field, disk included; no daemon needed.
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { create } from "@bufbuild/protobuf";
import { resourcesProto, overridesProto } from "../dist/client.js";
import { resourcesFrom } from "../dist/types.js";
import { ResourcesSchema } from "../dist/gen/forkbox/v1/forkbox_pb.js";

describe("resources", () => {
  it("sends disk on create and in fork overrides", () => {
    assert.equal(resourcesProto({ disk: "2Gi" }).disk, "2Gi");
    assert.equal(resourcesProto({ cpu: "1" }).disk, "");
    assert.equal(overridesProto({ resources: { disk: "0" } }).resources.disk, "0");
  });
  it("reads disk back as a plain string", () => {
    const r = resourcesFrom(create(ResourcesSchema, { cpu: "1", memory: "1Gi", pids: 10n, disk: "2Gi" }));
    assert.deepEqual(r, { cpu: "1", memory: "1Gi", pids: 10, disk: "2Gi" });
  });
});
