// Approvals and the gate's policy (SPEC §13) against a scripted ledger
// (options.fetch) that answers the shapes of docs/design/approvals.md;
// the server side is tested with the real ledgerd elsewhere.

import { test } from "node:test";
import assert from "node:assert/strict";
import {
  AlreadyAnsweredError,
  ApprovalRejectedError,
  ApprovalRequiredError,
  Client,
  DeniedByPolicyError,
  LedgerError,
  UnknownApprovalError,
} from "../dist/index.js";

const FAR = 4102444800000; // 2100-01-01 in unix ms
const ASK = {
  status: "approval_required",
  idempotency_key: "order-1234",
  key_generated: false,
  approval: { seq: 7, expires_at: FAR, state: "pending" },
  receipt: { seq: 7, hash: "aa" },
};
const ask = (approval) => ({ ...ASK, approval: { ...ASK.approval, ...approval } });
const APPROVED = {
  status: "reserved",
  idempotency_key: "order-1234",
  key_generated: false,
  reservation: "rsv_" + "0".repeat(63) + "1",
  attempt: 1,
  lease_expires_at: FAR,
  approval: { seq: 8, ask_seq: 7 },
  receipt: { seq: 9, hash: "dd" },
};
const REJECTED = {
  error: {
    code: "approval_rejected",
    message: "rejected by token:alice",
    details: { approval: { seq: 8, ask_seq: 7, note: "too large", actor: "token:alice" } },
  },
};
const COMMITTED = { status: "committed", idempotency_key: "order-1234", outcome: "succeeded", late: false, receipt: { seq: 10, hash: "ee" } };
const PENDING = {
  seq: 12, idempotency_key: "k-order-1234", execution_id: "exec-1", attempt: 1, tool: "payments.charge",
  effect: "external", idempotent: false, input_hash: "sha256:ab", summary: "charge 12 EUR", actor: "token:agent",
  asked_at: 1764475200000, expires_at: 1764478800000, state: "pending", answer: null, consumed_by: null,
};

/**
 * A fetch that answers reserves from a script of [status, body] and other
 * requests from routes ("METHOD /path?query"); it records every request.
 */
function scripted(reserves, routes = {}) {
  const requests = [];
  const fetch = async (url, init) => {
    const u = new URL(url);
    const body = init.body ? JSON.parse(init.body) : undefined;
    requests.push({ method: init.method, path: u.pathname, query: u.search, body });
    let status, answer;
    if (u.pathname.endsWith("/effects/reserve")) [status, answer] = reserves.shift();
    else if (u.pathname.endsWith("/commit")) [status, answer] = [201, COMMITTED];
    else [status, answer] = routes[`${init.method} ${u.pathname}${u.search}`] ?? [404, { error: { code: "not_found", message: u.pathname } }];
    return new Response(JSON.stringify(answer), { status, headers: { "content-type": "application/json" } });
  };
  return { fetch, requests, reserveBodies: () => requests.filter((r) => r.path.endsWith("/effects/reserve")).map((r) => r.body) };
}

const charge = (extra = {}) => ({
  tool: "payments.charge", effect: "external", key: "order-1234", input: { amount: 1200 }, sendInput: true,
  approvalSummary: "charge 12 EUR", ...extra,
});

test("reserve: a 202 is an ApprovalRequiredError carrying the ask", async () => {
  const s = scripted([[202, ASK]]);
  const c = new Client("http://ledger.test", { fetch: s.fetch });
  const err = await c.reserve({ key: "order-1234", executionId: "e1", tool: "payments.charge", effect: "external",
    input: { amount: 1200 }, approvalSummary: "charge 12 EUR", changed: { strategy: "smaller amount" } }).catch((e) => e);
  assert.ok(err instanceof ApprovalRequiredError, String(err));
  assert.ok(err instanceof LedgerError);
  assert.equal(err.code, "approval_required");
  assert.equal(err.status, 202);
  assert.deepEqual([err.key, err.seq, err.expiresAt, err.state, err.expired], ["order-1234", 7, FAR, "pending", false]);
  assert.deepEqual(err.receipt, { seq: 7, hash: "aa" });
  assert.equal(err.url, "http://ledger.test/ui/#approvals/7", "the page where a person answers it, as ledger-mcp names it");
  for (const want of ["ask 7", "expires 2100-01-01T00:00:00Z", "http://ledger.test/ui/#approvals/7", "ledgerctl approvals approve 7 --server http://ledger.test)"]) {
    assert.ok(err.message.includes(want), err.message);
  }
  const [body] = s.reserveBodies();
  assert.deepEqual(body.input, { amount: 1200 });
  assert.equal(body.input_hash, undefined);
  assert.equal(body.approval_summary, "charge 12 EUR");
  assert.deepEqual(body.changed, { strategy: "smaller amount" });
});

test("do: a call awaiting approval does not run", async () => {
  const s = scripted([[202, ASK]]);
  const c = new Client("http://ledger.test", { fetch: s.fetch });
  let runs = 0;
  await assert.rejects(c.do(charge(), () => { runs++; }), (e) => e instanceof ApprovalRequiredError && e.seq === 7);
  assert.equal(runs, 0);
  const [body] = s.reserveBodies();
  assert.deepEqual(body.input, { amount: 1200 }, "sendInput sends the input, not its fingerprint");
  assert.equal(body.input_hash, undefined);
});

test("do: approvalWaitMs waits for the approval, then runs once", async () => {
  const s = scripted([[202, ASK], [202, ASK], [201, APPROVED]]);
  const c = new Client("http://ledger.test", { fetch: s.fetch, approvalWaitMs: 30_000, pollIntervalMs: 5 });
  let runs = 0;
  const got = await c.do(charge(), () => { runs++; return { result: { charged: true } }; });
  assert.equal(runs, 1);
  assert.deepEqual(got.approval, { seq: 8, askSeq: 7 });
  const bodies = s.reserveBodies();
  assert.equal(bodies.length, 3);
  for (const b of bodies) assert.ok(b.wait_ms > 0 && b.wait_ms <= 20_000, "the ledger is asked to wait for the answer");
});

test("do: a rejection is ApprovalRejectedError with the answer", async () => {
  const s = scripted([[202, ASK], [409, REJECTED]]);
  const c = new Client("http://ledger.test", { fetch: s.fetch, pollIntervalMs: 5 });
  const err = await c.do(charge({ approvalWaitMs: 30_000 }), () => assert.fail("ran")).catch((e) => e);
  assert.ok(err instanceof ApprovalRejectedError, String(err));
  assert.deepEqual(err.approval, { seq: 8, ask_seq: 7, note: "too large", actor: "token:alice" });
});

test("do: an expired ask ends the wait without asking again", async () => {
  const s = scripted([[202, ask({ expires_at: 1000 })]]);
  const c = new Client("http://ledger.test", { fetch: s.fetch, approvalWaitMs: 30_000 });
  const err = await c.do(charge(), () => assert.fail("ran")).catch((e) => e);
  assert.ok(err instanceof ApprovalRequiredError && err.expired, String(err));
  assert.equal(s.reserveBodies().length, 1);
});

test("do: a new ask ends the wait", async () => {
  const s = scripted([[202, ASK], [202, ask({ seq: 9 })]]);
  const c = new Client("http://ledger.test", { fetch: s.fetch, approvalWaitMs: 30_000, pollIntervalMs: 5 });
  const err = await c.do(charge(), () => assert.fail("ran")).catch((e) => e);
  assert.ok(err instanceof ApprovalRequiredError && err.expired && err.seq === 9, String(err));
});

test("do: the approval wait runs out", async () => {
  const s = scripted(Array.from({ length: 100 }, () => [202, ASK]));
  const c = new Client("http://ledger.test", { fetch: s.fetch, approvalWaitMs: 100, pollIntervalMs: 20, waitMs: 0 });
  const err = await c.do(charge(), () => assert.fail("ran")).catch((e) => e);
  assert.ok(err instanceof ApprovalRequiredError && !err.expired, String(err));
  assert.ok(s.reserveBodies().length >= 2);
});

test("errors: the policy's refusals are typed", async () => {
  const s = scripted([[403, { error: { code: "denied_by_policy", message: "denied", details: { rule: 1, tool: "shell.rm*" } } }]]);
  const c = new Client("http://ledger.test", { fetch: s.fetch });
  await assert.rejects(c.do({ tool: "shell.rm", effect: "destructive", key: "rm-12345678" }, () => assert.fail("ran")),
    (e) => e instanceof DeniedByPolicyError && e.details.rule === 1);
  await assert.rejects(c.do({ ...charge(), inputHash: "sha256:00" }, () => {}), /sendInput needs input and no inputHash/);
});

const POLICY = { rules: [{ tool: "payments.*", approval: "required", approvers: ["role:approver"] }] };
const answered = { ...PENDING, state: "approved",
  answer: { seq: 13, decision: "approve", actor: "token:alice", role: "approver", note: "ok", recorded_at: 1764475260000 } };
const approverRoutes = {
  "GET /v1/namespaces/default/policy": [200, { namespace: "default", policy: {}, seq: 0 }],
  "GET /v1/namespaces/payments/policy": [200, { namespace: "payments", policy: POLICY, seq: 3 }],
  "PUT /v1/namespaces/payments/policy": [200, { namespace: "payments", policy: POLICY, seq: 5, changed: true, receipt: { seq: 5, hash: "ee" } }],
  "GET /v1/ns/payments/approvals?state=pending&after=11&limit=2": [200, { approvals: [PENDING], next_after: 12 }],
  "GET /v1/ns/payments/approvals": [200, { approvals: [answered], next_after: null }],
  "GET /v1/ns/payments/approvals/12": [200, { ...PENDING, input: { amount: 1200 }, input_verified: true }],
  "GET /v1/ns/payments/approvals/13": [404, { error: { code: "unknown_approval", message: "no ask" } }],
  "POST /v1/ns/payments/approvals/12": [201, answered],
  "POST /v1/ns/payments/approvals/14": [409, { error: { code: "already_answered", message: "rejected before" } }],
};

test("policy: /v1/namespaces/{ns}/policy, read and set", async () => {
  const s = scripted([], approverRoutes);
  assert.deepEqual(await new Client("http://ledger.test", { fetch: s.fetch }).policy(), { namespace: "default", policy: {}, seq: 0 });
  const c = new Client("http://ledger.test", { fetch: s.fetch, namespace: "payments" });
  assert.equal((await c.policy()).seq, 3);
  const set = await c.setPolicy(POLICY);
  assert.equal(set.changed, true);
  assert.deepEqual(set.receipt, { seq: 5, hash: "ee" });
  assert.deepEqual(s.requests.at(-1), { method: "PUT", path: "/v1/namespaces/payments/policy", query: "", body: POLICY });
});

test("approvals: list, show, answer", async () => {
  const s = scripted([], approverRoutes);
  const c = new Client("http://ledger.test", { fetch: s.fetch, namespace: "payments" });
  const page = await c.approvals({ state: "pending", after: 11, limit: 2 });
  assert.equal(page.next_after, 12);
  assert.equal(page.approvals[0].summary, "charge 12 EUR");
  assert.equal((await c.approvals()).approvals[0].answer.actor, "token:alice");

  const shown = await c.approval(12);
  assert.deepEqual(shown.input, { amount: 1200 });
  assert.equal(shown.input_verified, true);
  await assert.rejects(c.approval(13), UnknownApprovalError);

  assert.equal((await c.approve(12, "ok")).answer.decision, "approve");
  assert.deepEqual(s.requests.at(-1).body, { decision: "approve", note: "ok" });
  await assert.rejects(c.reject(14), AlreadyAnsweredError);
  assert.deepEqual(s.requests.at(-1).body, { decision: "reject" });
  await assert.rejects(c.answer(12, "maybe"), TypeError);
});
