// An approval-required error names the ask, its expiry and the page where
// a person answers it, against a real ledgerd whose policy sends the call
// to a person (contract §13).

import { before, test } from "node:test";
import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { ApprovalRequiredError, Client } from "../dist/index.js";
import { ledgerctl, startLedgerd, uid } from "./ledgerd.mjs";

let server;
before(async () => {
  server = await startLedgerd();
  const policy = join(dirname(server.db), "policy.json");
  writeFileSync(policy, '{"rules": [{"tool": "payments.*", "approval": "required", "expires_in_ms": 600000}]}');
  ledgerctl("policy", "set", "--server", server.url, "default", policy);
});

test("an ApprovalRequiredError names the ask, its expiry and the page", async () => {
  const key = "charge-" + uid();
  const c = new Client(server.url + "/");
  const err = await c.reserve({ key, executionId: "e1", tool: "payments.charge", effect: "external", input: { amount: 1200 } })
    .catch((e) => e);
  assert.ok(err instanceof ApprovalRequiredError, String(err));
  assert.equal(err.key, key);
  assert.ok(err.seq > 0 && err.expiresAt > Date.now(), String(err));
  const page = `${server.url}/ui/#approvals/${err.seq}`;
  assert.equal(err.url, page);
  const expires = new Date(Math.floor(err.expiresAt / 1000) * 1000).toISOString().replace(".000Z", "Z");
  for (const want of [`ask ${err.seq}`, `expires ${expires}`, page]) assert.ok(err.message.includes(want), err.message);
  const ask = await fetch(`${server.url}/v1/approvals/${err.seq}`);
  assert.equal(ask.status, 200, "the seq names the ask");
});
