// Client.do against a real ledgerd built from this repository.

import { test } from "node:test";
import assert from "node:assert/strict";
import {
  Client,
  EffectError,
  FingerprintMismatchError,
  InProgressError,
  InvalidKeyError,
  LedgerError,
  OutcomeUnknown,
  RetryNotAllowedError,
  UnknownNamespaceError,
  UnknownOutcomeError,
  deriveKey,
  permanent,
  retryable,
} from "../dist/index.js";
import { ledgerctl, sharedLedgerd, startLedgerd, uid } from "./ledgerd.mjs";

const server = sharedLedgerd();

const client = (opts = {}) => new Client(server.url, { backoffBaseMs: 10, ...opts });

/** An effect function that counts its runs. */
function counter(outcome = { result: { refunded: 1200 }, externalRef: "re_1" }) {
  const fn = async (key) => {
    fn.runs++;
    fn.keys.push(key);
    return outcome;
  };
  fn.runs = 0;
  fn.keys = [];
  return fn;
}

test("do: reserves, runs once, commits; a repeat replays", async () => {
  const c = client();
  const effect = { tool: "payments.refund", effect: "write", input: { order: uid(), amount: 1200 }, idempotent: true };
  const fn = counter();
  const first = await c.do(effect, fn);
  assert.equal(first.replayed, false);
  assert.equal(first.key, deriveKey(effect.tool, effect.input));
  assert.deepEqual(first.result, { refunded: 1200 });
  assert.equal(first.receipt.seq > 0, true);
  assert.deepEqual(fn.keys, [first.key], "the function gets the key to pass downstream");

  const again = await c.do({ ...effect, input: { amount: 1200, order: effect.input.order } }, fn);
  assert.equal(fn.runs, 1, "a repeat does not run the effect");
  assert.equal(again.replayed, true);
  assert.equal(again.key, first.key);
  assert.deepEqual(again.result, { refunded: 1200 });
  assert.equal(again.externalRef, "re_1");
  assert.deepEqual(again.original, first.receipt);

  const state = await c.getEffect(first.key);
  assert.equal(state.state, "succeeded");
  assert.deepEqual(state.receipts.map((r) => r.kind), ["reserve", "commit", "replay"]);
});

test("do: read effects run without the ledger", async () => {
  const head = await client().head();
  const got = await client().do({ tool: "db.query", effect: "read", input: { q: uid() } }, () => ({ result: 7 }));
  assert.equal(got.notRecorded, true);
  assert.equal(got.result, 7);
  assert.deepEqual(await client().head(), head);
});

test("do: a permanent failure is recorded and not run again", async () => {
  const c = client();
  const effect = { tool: "email.send", effect: "external", input: { to: uid() }, idempotent: true };
  await assert.rejects(
    c.do(effect, () => {
      throw permanent("MAILBOX_UNKNOWN", new Error("550 no such user"));
    }),
    (err) => err instanceof EffectError && err.failure.code === "MAILBOX_UNKNOWN" && !err.failure.retryable && err.receipt.seq > 0,
  );
  const fn = counter();
  await assert.rejects(c.do(effect, fn), (err) => err instanceof RetryNotAllowedError && err.status === 409);
  assert.equal(fn.runs, 0);
});

test("do: a retryable failure of an idempotent effect runs again", async () => {
  const c = client();
  const effect = { tool: "psp.charge", effect: "write", input: { cart: uid() }, idempotent: true };
  await assert.rejects(
    c.do(effect, () => {
      throw retryable("PSP_TIMEOUT", "timed out");
    }),
    EffectError,
  );
  const got = await c.do(effect, counter());
  assert.equal(got.retry, true);
  assert.equal(got.replayed, false);
});

test("do: any other error is recorded as EFFECT_FAILED", async () => {
  const err = await client()
    .do({ tool: "t.fail", effect: "write", input: { n: uid() } }, () => {
      throw new Error("boom");
    })
    .catch((e) => e);
  assert.ok(err instanceof EffectError);
  assert.equal(err.failure.code, "EFFECT_FAILED");
  assert.equal(err.cause.message, "boom");
});

test("do: an unknown outcome records nothing and leaves the key reserved", async () => {
  const c = client();
  const effect = { tool: "t.unknown", effect: "write", input: { n: uid() } };
  const err = await c
    .do(effect, () => {
      throw new OutcomeUnknown("sent, no answer");
    })
    .catch((e) => e);
  assert.ok(err instanceof UnknownOutcomeError, String(err));
  assert.match(err.reservation, /^rsv_[0-9a-f]{64}$/);
  assert.equal((await c.getEffect(err.key)).state, "reserved");
  const done = await c.commit(err.key, err.reservation, { outcome: "succeeded", externalRef: "later" });
  assert.equal(done.outcome, "succeeded");
  const repeat = await c.commit(err.key, err.reservation, { outcome: "succeeded", externalRef: "later" });
  assert.equal(repeat.repeat, true, "an identical commit is recognised, not appended twice");
});

test("do: the same key for another input is a fingerprint mismatch", async () => {
  const c = client();
  const key = "order-" + uid();
  await c.do({ tool: "payments.refund", effect: "write", key, input: { amount: 1 } }, counter());
  await assert.rejects(
    c.do({ tool: "payments.refund", effect: "write", key, input: { amount: 2 } }, counter()),
    (err) => err instanceof FingerprintMismatchError && err.status === 422,
  );
});

test("do: waits for the attempt holding the key, then replays its result", async () => {
  const c = client();
  const effect = { tool: "payments.refund", effect: "write", input: { order: uid() }, idempotent: true };
  const key = deriveKey(effect.tool, effect.input);
  const held = await c.reserve({ key, executionId: "holder", tool: effect.tool, effect: "write", idempotent: true, inputHash: undefined, leaseMs: 60_000 });
  assert.equal(held.status, "reserved");

  const fn = counter();
  const waiting = c.do({ ...effect, inputHash: undefined, input: undefined, key }, fn);
  await c.commit(key, held.reservation, { outcome: "succeeded", result: { by: "holder" } });
  const got = await waiting;
  assert.equal(fn.runs, 0, "the waiter does not run the effect");
  assert.equal(got.replayed, true);
  assert.deepEqual(got.result, { by: "holder" });
});

test("do: InProgressError once the wait runs out", async () => {
  const c = client({ waitMs: 0, pollIntervalMs: 5 });
  const key = "busy-" + uid();
  await c.reserve({ key, executionId: "holder", tool: "t.busy", effect: "write", leaseMs: 60_000 });
  const err = await c.do({ tool: "t.busy", effect: "write", key, maxWaitMs: 30 }, counter()).catch((e) => e);
  assert.ok(err instanceof InProgressError, String(err));
  assert.equal(err.status, 409);
  assert.ok(err.retryAfterMs > 0, "in_progress carries Retry-After");
  assert.ok(err.details.lease_expires_at > 0);
});

test("errors: typed, with the contract's code and status", async () => {
  const c = client();
  const err = await c.reserve({ key: "gen_" + uid(), executionId: "e", tool: "t", effect: "write" }).catch((e) => e);
  assert.ok(err instanceof InvalidKeyError && err instanceof LedgerError);
  assert.equal(err.code, "invalid_key");
  assert.equal(err.status, 400);
  await assert.rejects(new Client(server.url, { namespace: "no-such-ns" }).head(), (e) => e instanceof UnknownNamespaceError && e.status === 404);
  assert.throws(() => new Client(server.url, { namespace: "Payments" }), TypeError);
});

test("namespaces: each is its own chain", async () => {
  const ns = "pay-" + uid().replace(/[^a-z0-9]/g, "");
  // inline like the default namespace, so both derive the same dk_ key
  ledgerctl("namespace", "create", "--db", server.db, ns, "--payloads", "inline");
  const pay = client({ namespace: ns });
  const dflt = client();
  const effect = { tool: "payments.refund", effect: "write", input: { order: uid() } };
  assert.equal((await pay.head()).seq, 0);
  const first = await pay.do(effect, counter());
  const other = await dflt.do(effect, counter());
  assert.equal(other.key, first.key);
  assert.equal(other.replayed, false, "in another namespace it is another effect");
  assert.equal((await pay.head()).seq, 2);
});

test("do: an expired key runs again as a renewed generation (SPEC §12), no waiting on the clock", async () => {
  const { mkdtempSync, writeFileSync } = await import("node:fs");
  const { tmpdir } = await import("node:os");
  const { join } = await import("node:path");
  const clockFile = join(mkdtempSync(join(tmpdir(), "ledger-ts-clock-")), "now");
  const t0 = 1764475200000;
  writeFileSync(clockFile, String(t0));
  const ttl = await startLedgerd({ args: ["--default-key-ttl", "1h"], env: { LEDGERD_TEST_CLOCK_FILE: clockFile } });
  const c = new Client(ttl.url, { backoffBaseMs: 10 });
  const run = counter();
  const effect = { tool: "report.send", effect: "external", input: { day: "2026-12-01" } };
  const first = await c.do(effect, run);
  assert.equal(first.renewed, undefined);
  writeFileSync(clockFile, String(t0 + 3_599_999));
  const within = await c.do(effect, run);
  assert.equal(within.replayed, true, "within the lifetime: replayed");
  writeFileSync(clockFile, String(t0 + 3_600_000 + 10));
  const next = await c.do(effect, run);
  assert.equal(next.replayed, false);
  assert.equal(run.runs, 2, "at the lifetime the effect runs again");
  assert.ok(next.renewed && next.renewed.seq > 0, JSON.stringify(next));
});
