// Derived keys in a namespace that commits its payloads (contract §14)
// against a real ledgerd: dk2_ with the namespace's derivation key,
// fetched once per Client (a failed fetch is not kept); dk_ in an inline
// namespace and for a read.

import { before, test } from "node:test";
import assert from "node:assert/strict";
import { createHmac } from "node:crypto";
import { canonicalJSON, Client, deriveKey, deriveKeyWith } from "../dist/index.js";
import { startLedgerd, uid } from "./ledgerd.mjs";

let server;
before(async () => {
  server = await startLedgerd({ args: ["--default-payloads", "committed"] });
  const r = await fetch(server.url + "/v1/namespaces", { method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ name: "plain", payloads: "inline" }) });
  assert.equal(r.status, 201, await r.text());
});

async function servedKey(prefix) {
  const r = await fetch(server.url + prefix + "/derivation-key");
  assert.equal(r.status, 200);
  return r.json();
}

/** A fetch that counts the derivation-key requests and fails while down.on. */
function countingFetch(down = { on: false }) {
  const asked = [];
  const f = async (url, init) => {
    const path = new URL(url).pathname;
    if (path.endsWith("/derivation-key")) asked.push(path);
    if (down.on) throw new TypeError("fetch failed");
    return fetch(url, init);
  };
  return { f, asked, down };
}

test("a committed namespace derives dk2_ keys, the derivation key fetched once", async () => {
  const served = await servedKey("/v1");
  assert.equal(served.payloads, "committed");
  const effect = { tool: "crm.contact.upsert", effect: "write", input: { contact: uid(), name: "Zoë" } };
  // Independently of the client: HMAC-SHA-256(key, tool ‖ 0x00 ‖ JCS(input)).
  const want = "dk2_" + createHmac("sha256", Buffer.from(served.key, "hex"))
    .update(Buffer.concat([Buffer.from(effect.tool), Buffer.from([0]), Buffer.from(canonicalJSON(effect.input))])).digest("hex");
  const { f, asked } = countingFetch();
  const c = new Client(server.url, { fetch: f });
  let runs = 0;
  const first = await c.do(effect, async () => ({ result: { n: ++runs } }));
  assert.equal(first.key, want);
  const other = await c.do({ ...effect, input: { ...effect.input, name: "Zoé" } }, async () => ({ result: { n: ++runs } }));
  assert.match(other.key, /^dk2_[0-9a-f]{64}$/);
  assert.notEqual(other.key, want);
  assert.deepEqual(asked, ["/v1/derivation-key"], "fetched once per client");
  const dk = await c.derivationKey();
  assert.equal(dk.payloads, "committed");
  assert.equal(Buffer.from(dk.key).toString("hex"), served.key);
  assert.equal(await deriveKeyWith(dk.key, effect.tool, effect.input), want);

  const again = await new Client(server.url).do(effect, async () => ({ result: { n: ++runs } }));
  assert.equal(again.replayed, true, "another client derives the same key: a replay");
  assert.equal(again.key, want);
  assert.equal(runs, 2);

  // A read skips the ledger: dk_, nothing asked.
  const r = countingFetch();
  const read = await new Client(server.url, { fetch: r.f }).do({ tool: "crm.contact.get", effect: "read", input: { contact: 1 } },
    async (key) => ({ result: key }));
  assert.equal(read.key, deriveKey("crm.contact.get", { contact: 1 }));
  assert.deepEqual(r.asked, []);
});

test("an inline namespace derives dk_ keys", async () => {
  assert.equal((await servedKey("/v1/ns/plain")).payloads, "inline");
  const effect = { tool: "crm.contact.upsert", effect: "write", input: { contact: uid() } };
  const got = await new Client(server.url, { namespace: "plain" }).do(effect, async () => ({ result: 1 }));
  assert.equal(got.key, deriveKey(effect.tool, effect.input));
});

test("a failed fetch of the derivation key fails the call and is not kept", async () => {
  const { f, asked, down } = countingFetch({ on: true });
  const c = new Client(server.url, { fetch: f, maxRetries: 1, backoffBaseMs: 1, backoffMaxMs: 1 });
  const effect = { tool: "crm.contact.upsert", effect: "write", input: { contact: uid() } };
  let runs = 0;
  await assert.rejects(c.do(effect, async () => ({ result: ++runs })));
  assert.equal(runs, 0, "nothing ran");
  assert.equal(asked.length, 2, "retried once");
  down.on = false;
  const got = await c.do(effect, async () => ({ result: ++runs }));
  assert.match(got.key, /^dk2_/);
  assert.equal(runs, 1);
  assert.equal(asked.length, 3, "asked again");
});
