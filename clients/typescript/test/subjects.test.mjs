// Subjects (contract §14) against a real ledgerd: do()'s effect and
// reserve() send them; an erasure by subject erases the call's result,
// and a replay carries erased (field → the erase receipt's seq).

import { before, test } from "node:test";
import assert from "node:assert/strict";
import { Client, InvalidRequestError } from "../dist/index.js";
import { startLedgerd, uid } from "./ledgerd.mjs";

let server;
before(async () => {
  server = await startLedgerd({ args: ["--default-payloads", "committed"] });
});

async function erase(subject) {
  const r = await fetch(server.url + "/v1/erasures", { method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ subject }) });
  const body = await r.text();
  assert.equal(r.status, 201, body);
  return JSON.parse(body).receipt.seq;
}

test("do() sends subjects; after an erasure by subject the replay says erased", async () => {
  const id = uid();
  const subject = "customer-" + id;
  const c = new Client(server.url);
  const effect = { tool: "crm.note", effect: "write", key: "subj-ts-" + id, input: { n: 1 }, subjects: [subject, "team-7"] };
  const first = await c.do(effect, async () => ({ result: { secret: id } }));
  assert.equal(first.replayed, false);
  assert.equal(first.erased, undefined);
  const seq = await erase(subject);
  const view = await (await fetch(server.url + "/v1/effects/" + effect.key)).text();
  assert.ok(view.includes(`"erased":{"result":${seq}}`), view);
  assert.ok(!view.includes("secret"), view);
  const again = await c.do(effect, async () => assert.fail("ran again"));
  assert.equal(again.replayed, true);
  assert.equal(again.result, null);
  assert.deepEqual(again.erased, { result: seq });
});

test("reserve() sends subjects; a bad one is invalid_request on field subjects, never echoed", async () => {
  const id = uid();
  const c = new Client(server.url);
  const rsv = await c.reserve({ key: "subj-rs-" + id, executionId: "e-" + id, tool: "mail.send", effect: "external",
    inputHash: "sha256:" + "0".repeat(64), subjects: ["recipient-" + id] });
  assert.equal(rsv.status, "reserved");
  await c.commit(rsv.key, rsv.reservation, { outcome: "succeeded", result: { secret: id } });
  const seq = await erase("recipient-" + id);
  const replay = await c.reserve({ key: "subj-rs-" + id, executionId: "e2-" + id, tool: "mail.send", effect: "external",
    inputHash: "sha256:" + "0".repeat(64) });
  assert.equal(replay.status, "replayed");
  assert.deepEqual(replay.erased, { result: seq });
  const long = "x".repeat(129);
  await assert.rejects(c.do({ tool: "crm.note", effect: "write", key: "subj-bad-" + id, input: { n: 1 }, subjects: [long] }, async () => ({})),
    (err) => err instanceof InvalidRequestError && err.details.field === "subjects" && !err.message.includes(long));
});
