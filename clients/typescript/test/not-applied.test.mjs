// The not_applied outcome (contract §4.1) against a real ledgerd: a
// failure known to have applied nothing, after which the key runs again.

import { test } from "node:test";
import assert from "node:assert/strict";
import {
  Client,
  EffectError,
  EffectFailure,
  InvalidRequestError,
  RetryNotAllowedError,
  deriveKey,
  notApplied,
  permanent,
} from "../dist/index.js";
import { sharedLedgerd, uid } from "./ledgerd.mjs";

const server = sharedLedgerd();

const client = (opts = {}) => new Client(server.url, { backoffBaseMs: 10, ...opts });

test("notApplied: builds an EffectFailure recorded as not_applied, never retryable", () => {
  const f = notApplied("ORDER_NOT_FOUND", new Error("no order 1234"));
  assert.ok(f instanceof EffectFailure);
  assert.equal(f.outcome, "not_applied");
  assert.equal(f.code, "ORDER_NOT_FOUND");
  assert.equal(f.message, "no order 1234");
  assert.equal(f.retryable, false);
  assert.equal(permanent("X").outcome, "failed");
});

test("do: notApplied commits not_applied and the next call runs the effect again", async () => {
  const c = client();
  // Not idempotent: a failure would be final, not_applied is not.
  const effect = { tool: "payments.refund", effect: "write", input: { order: uid() } };
  const key = deriveKey(effect.tool, effect.input);
  let runs = 0;
  let exists = false;
  const refund = async (k) => {
    runs++;
    assert.equal(k, key);
    if (!exists) throw notApplied("ORDER_NOT_FOUND", `no order ${effect.input.order}`);
    return { result: { refunded: effect.input.order }, externalRef: "re_1" };
  };

  const err = await c.do(effect, refund).catch((e) => e);
  assert.ok(err instanceof EffectError, String(err));
  assert.equal(err.outcome, "not_applied");
  assert.equal(err.failure.code, "ORDER_NOT_FOUND");
  assert.equal(err.failure.retryable, false);
  assert.ok(err.cause instanceof EffectFailure);
  assert.match(err.message, /not applied: ORDER_NOT_FOUND/);

  const view = await c.getEffect(key);
  assert.equal(view.state, "not_applied");
  const commit = view.receipts.at(-1);
  assert.equal(commit.seq, err.receipt.seq);
  assert.deepEqual(
    [commit.kind, commit.outcome, commit.error_code, commit.error_message, commit.retryable, commit.external_ref],
    ["commit", "not_applied", "ORDER_NOT_FOUND", `no order ${effect.input.order}`, false, ""],
  );

  exists = true;
  const got = await c.do(effect, refund);
  assert.equal(runs, 2, "the effect runs again after not_applied");
  assert.equal(got.replayed, false);
  assert.equal(got.retry, false);
  assert.deepEqual(got.afterNotApplied, { seq: commit.seq, errorCode: "ORDER_NOT_FOUND" });
  assert.deepEqual(got.result, { refunded: effect.input.order });

  const after = await c.getEffect(key);
  assert.equal(after.state, "succeeded");
  assert.deepEqual(after.receipts.map((r) => r.kind), ["reserve", "commit", "reserve", "commit"]);
  assert.equal(after.receipts[2].ref_seq, commit.seq);

  const again = await c.do(effect, refund);
  assert.equal(again.replayed, true);
  assert.equal(runs, 2);
});

test("do: a permanent failure stays final (not_applied is the exception)", async () => {
  const c = client();
  const effect = { tool: "payments.refund", effect: "write", input: { order: uid() } };
  await assert.rejects(
    c.do(effect, () => {
      throw permanent("REFUND_DECLINED", "declined after the transfer started");
    }),
    (err) => err instanceof EffectError && err.outcome === "failed",
  );
  assert.equal((await c.getEffect(deriveKey(effect.tool, effect.input))).state, "failed");
  await assert.rejects(c.do(effect, () => ({})), RetryNotAllowedError);
});

test("commit: outcome not_applied by hand, refused with an external_ref", async () => {
  const c = client();
  const key = "na-" + uid();
  const r = { key, executionId: "e1", tool: "repo.push", effect: "write" };
  const first = await c.reserve(r);
  assert.equal(first.status, "reserved");
  assert.equal(first.afterNotApplied, undefined);

  await assert.rejects(
    c.commit(key, first.reservation, { outcome: "not_applied", externalRef: "sha1", error: { code: "BRANCH_PROTECTED" } }),
    (err) => err instanceof InvalidRequestError && err.details.field === "external_ref",
  );
  const cm = await c.commit(key, first.reservation, { outcome: "not_applied", error: { code: "BRANCH_PROTECTED", message: "refused before any write" } });
  assert.ok(cm.receipt.seq > 0);
  const repeat = await c.commit(key, first.reservation, { outcome: "not_applied", error: { code: "BRANCH_PROTECTED", message: "refused before any write" } });
  assert.equal(repeat.repeat, true);
  assert.equal((await c.getEffect(key)).state, "not_applied");

  // Any execution may reserve it again.
  const second = await c.reserve({ ...r, executionId: "e2" });
  assert.equal(second.status, "reserved");
  assert.deepEqual(second.afterNotApplied, { seq: cm.receipt.seq, errorCode: "BRANCH_PROTECTED" });
  await c.commit(key, second.reservation, { outcome: "succeeded", externalRef: "sha2" });
  assert.equal((await c.getEffect(key)).state, "succeeded");
});
