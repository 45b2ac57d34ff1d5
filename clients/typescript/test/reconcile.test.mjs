// Reconciling an unknown outcome (contract §15) against a real ledgerd:
// do() asks the effect's reconcile function when an interrupted attempt
// answers unsafe_resume, and records what it found.

import { test } from "node:test";
import assert from "node:assert/strict";
import {
  Client,
  InvalidRequestError,
  NotInterruptedError,
  ReconcileNotAllowedError,
  ReconcileTooEarlyError,
  UnsafeResumeError,
  deriveKey,
  sleep,
} from "../dist/index.js";
import { sharedLedgerd, uid } from "./ledgerd.mjs";

const server = sharedLedgerd();
const client = (opts = {}) => new Client(server.url, { backoffBaseMs: 10, ...opts });

let policy;
// withPolicy sets the shared ledgerd's policy once: payments.* may be
// reconciled, with a settle time of 300 ms.
function withPolicy(c) {
  policy ??= c.setPolicy({ rules: [{ tool: "payments.*", reconcile: { allow: true, settle_ms: 300 } }] });
  return policy;
}

// interrupted leaves an attempt of a (not idempotent) effect of tool
// interrupted, and returns the effect.
async function interrupted(c, tool) {
  await withPolicy(c);
  const effect = { tool, effect: "external", input: { order: uid() } };
  const req = await c.reserveRequest({ ...effect, leaseMs: 10 });
  await c.reserve(req);
  await sleep(50); // the crashed attempt's lease ends
  return effect;
}

const found = (key) => ({ outcome: "succeeded", externalRef: "ch_1", result: { amount: 1200 },
  lookup: "payments.find_charge", answer: { applied: true, key } });
const nothing = (key) => ({ outcome: "not_applied", error: { code: "NOT_FOUND" }, lookup: "payments.find_charge",
  answer: { applied: false, key } });

test("do: reconcile succeeded is replayed without running", async () => {
  const c = client();
  const effect = await interrupted(c, "payments.charge");
  const key = deriveKey(effect.tool, effect.input);
  const asked = [];
  let runs = 0;
  const res = await c.do({ ...effect, reconcile: async (k) => (asked.push(k), found(k)) }, () => { runs++; });
  assert.equal(res.replayed, true);
  assert.equal(res.reconciled, true);
  assert.equal(res.externalRef, "ch_1");
  assert.deepEqual(res.result, { amount: 1200 });
  assert.equal(runs, 0);
  assert.deepEqual(asked, [key]);
  const view = await c.getEffect(key);
  assert.equal(view.state, "succeeded");
  const rec = view.receipts.at(-1);
  assert.equal(rec.kind, "reconcile");
  assert.equal(rec.note, `{"answer":{"applied":true,"key":"${key}"},"lookup":"payments.find_charge"}`);
  const again = await c.do(effect, () => { runs++; });
  assert.equal(again.replayed, true);
  assert.equal(again.reconciled, undefined);
  assert.equal(runs, 0);
});

test("do: reconcile not_applied waits out settle_ms and runs once", async () => {
  const c = client();
  const effect = await interrupted(c, "payments.charge");
  let runs = 0;
  const start = Date.now();
  const res = await c.do({ ...effect, reconcile: nothing }, () => (runs++, { result: { charged: true } }));
  assert.equal(res.replayed, false);
  assert.deepEqual(res.result, { charged: true });
  assert.equal(runs, 1);
  assert.equal(res.afterNotApplied?.errorCode, "NOT_FOUND");
  assert.ok(Date.now() - start >= 200, "reconcile_too_early was waited out");
  assert.equal((await c.getEffect(deriveKey(effect.tool, effect.input))).state, "succeeded");
});

test("do: a lookup that throws leaves unsafe_resume", async () => {
  const c = client();
  const effect = await interrupted(c, "payments.charge");
  const err = await c.do({ ...effect, reconcile: () => { throw new Error("the provider did not answer"); } },
    () => assert.fail("must not run")).catch((e) => e);
  assert.ok(err instanceof UnsafeResumeError, String(err));
  assert.match(String(err.cause), /did not answer/);
  assert.equal((await c.getEffect(deriveKey(effect.tool, effect.input))).state, "interrupted");
});

test("do: a refused reconcile leaves unsafe_resume, with the refusal as its cause", async () => {
  const c = client();
  const effect = await interrupted(c, "email.send");
  const err = await c.do({ ...effect, reconcile: found }, () => assert.fail("must not run")).catch((e) => e);
  assert.ok(err instanceof UnsafeResumeError, String(err));
  assert.ok(err.cause instanceof ReconcileNotAllowedError, String(err.cause));
  // Too early, past the caller's wait.
  const charge = await interrupted(c, "payments.charge");
  const early = await c.do({ ...charge, maxWaitMs: 0, reconcile: nothing }, () => assert.fail("must not run")).catch((e) => e);
  assert.ok(early instanceof UnsafeResumeError, String(early));
  assert.ok(early.cause instanceof ReconcileTooEarlyError, String(early.cause));
});

test("reconcile: records, and refuses what §15 refuses", async () => {
  const c = client();
  const effect = await interrupted(c, "payments.charge");
  const key = deriveKey(effect.tool, effect.input);
  await assert.rejects(c.reconcile(key, { outcome: "failed", error: { code: "X" }, lookup: "q", answer: {} }), InvalidRequestError);
  await assert.rejects(c.reconcile(key, { outcome: "succeeded", externalRef: "x" }), TypeError);
  const rec = await c.reconcile(key, found(key));
  assert.equal(rec.state, "succeeded");
  assert.equal(rec.key, key);
  await assert.rejects(c.reconcile(key, found(key)), NotInterruptedError);
});
