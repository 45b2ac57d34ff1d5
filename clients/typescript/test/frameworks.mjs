// Shared by the agent-framework tests: a ledgerd whose policy sends
// payments.charge to a person, and counting tool bodies.

import { writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { before } from "node:test";
import { ledgerctl, startLedgerd } from "./ledgerd.mjs";

/** The ledgerd a test file shares, with payments.charge gated: {url, db, …}. */
export function gatedLedgerd() {
  const server = {};
  before(async () => {
    Object.assign(server, await startLedgerd());
    const policy = join(dirname(server.db), "policy.json");
    writeFileSync(policy, '{"rules": [{"tool": "payments.charge*", "approval": "required", "expires_in_ms": 600000}]}');
    ledgerctl("policy", "set", "--server", server.url, "default", policy);
  });
  return server;
}

/** The state of key in the ledger at url. */
export async function keyState(url, key) {
  const r = await fetch(`${url}/v1/effects/${encodeURIComponent(key)}`);
  return r.status === 404 ? "unknown" : (await r.json()).state;
}

/** The ledger's pending asks. */
export async function pendingAsks(url) {
  return (await (await fetch(`${url}/v1/approvals?state=pending`)).json()).approvals;
}
