// Transport: tokens, 429/503 retries honouring Retry-After, proxies'
// pages, an unreachable ledger, and the traceparent header.

import { test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import {
  Client,
  ForbiddenError,
  RateLimitedError,
  UnauthorizedError,
  UnavailableError,
  parseRetryAfter,
} from "../dist/index.js";
import { sharedLedgerd, startWithTokens, uid } from "./ledgerd.mjs";

const server = sharedLedgerd();

/**
 * Starts an HTTP proxy before target whose fault(req, res) may answer a
 * request itself (returning true); others are forwarded. Resolves to
 * {url, seen, close()}.
 */
async function front(target, fault) {
  const seen = [];
  const srv = createServer(async (req, res) => {
    seen.push({ method: req.method, url: req.url, headers: req.headers });
    if (fault(req, res, seen.length)) return;
    const chunks = [];
    for await (const c of req) chunks.push(c);
    const body = chunks.length ? Buffer.concat(chunks) : undefined;
    const up = await fetch(target + req.url, { method: req.method, headers: { "content-type": req.headers["content-type"] ?? "" }, body });
    res.writeHead(up.status, Object.fromEntries(up.headers));
    res.end(Buffer.from(await up.arrayBuffer()));
  });
  await new Promise((r) => srv.listen(0, "127.0.0.1", r));
  return { url: `http://127.0.0.1:${srv.address().port}`, seen, close: () => new Promise((r) => srv.close(r)) };
}

test("tokens: a writer acts, a reader may not, no token is 401", async () => {
  const [d, tokens] = await startWithTokens([
    ["writer", "gateway-eu"],
    ["reader", "auditor"],
  ]);
  const gw = new Client(d.url, { token: tokens["gateway-eu"] });
  const got = await gw.do({ tool: "payments.refund", effect: "write", input: { order: uid() } }, () => ({ result: 1 }));
  const reader = new Client(d.url, { token: tokens["auditor"] });
  const rs = (await reader.getEffect(got.key)).receipts;
  assert.deepEqual(rs.map((r) => r.actor), ["gateway-eu", "gateway-eu"]);
  await assert.rejects(
    reader.do({ tool: "payments.refund", effect: "write", input: { order: uid() } }, () => ({})),
    (e) => e instanceof ForbiddenError && e.status === 403,
  );
  for (const token of [undefined, "elt_" + "0".repeat(64)]) {
    await assert.rejects(new Client(d.url, { token }).head(), (e) => e instanceof UnauthorizedError && e.code === "unauthorized");
  }
});

test("429 and 503 are retried after Retry-After; other answers are not", async () => {
  let faults = 2;
  const f = await front(server.url, (req, res) => {
    if (req.url === "/v1/effects/reserve" && faults > 0) {
      const status = faults-- === 2 ? 429 : 503;
      res.writeHead(status, { "content-type": "application/json", "retry-after": "0" });
      res.end(JSON.stringify({ error: { code: status === 429 ? "rate_limited" : "unavailable", message: "later", details: {} } }));
      return true;
    }
    return false;
  });
  try {
    const c = new Client(f.url, { backoffBaseMs: 1, backoffMaxMs: 5 });
    const got = await c.do({ tool: "t.retry", effect: "write", input: { n: uid() } }, () => ({ result: "ok" }));
    assert.equal(got.result, "ok");
    assert.equal(f.seen.filter((s) => s.url === "/v1/effects/reserve").length, 3, "two refusals, then the reserve");

    faults = 2;
    const once = new Client(f.url, { maxRetries: 0 });
    await assert.rejects(once.do({ tool: "t.retry", effect: "write", input: { n: uid() } }, () => ({})), RateLimitedError);
  } finally {
    await f.close();
  }
});

test("a proxy's page keeps its status and gets a code", async () => {
  const f = await front(server.url, (req, res) => {
    res.writeHead(502, { "content-type": "text/html" });
    res.end("<html>bad gateway</html>");
    return true;
  });
  try {
    const err = await new Client(f.url, { maxRetries: 0 }).head().catch((e) => e);
    assert.ok(err instanceof UnavailableError, String(err));
    assert.equal(err.status, 502);
    assert.match(err.message, /bad gateway/);
  } finally {
    await f.close();
  }
});

test("an unreachable ledger: retried, then the transport error", async () => {
  const srv = createServer();
  await new Promise((r) => srv.listen(0, "127.0.0.1", r));
  const url = `http://127.0.0.1:${srv.address().port}`;
  await new Promise((r) => srv.close(r)); // nothing listens there now
  const err = await new Client(url, { maxRetries: 2, backoffBaseMs: 1, backoffMaxMs: 2 })
    .do({ tool: "t", effect: "write", input: 1 }, () => ({}))
    .catch((e) => e);
  assert.equal(err.cause?.code, "ECONNREFUSED", String(err));
});

test("traceparent is sent with every request", async () => {
  const f = await front(server.url, () => false);
  const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  try {
    await new Client(f.url, { traceparent: () => tp }).do({ tool: "t.trace", effect: "write", input: uid() }, () => ({}));
    assert.equal(f.seen.length, 3, "the derivation key (fetched once), the reserve and the commit");
    for (const s of f.seen) assert.equal(s.headers.traceparent, tp);
  } finally {
    await f.close();
  }
});

test("parseRetryAfter: seconds or an HTTP date", () => {
  const now = Date.parse("2026-12-01T00:00:00Z");
  assert.equal(parseRetryAfter("2", now), 2000);
  assert.equal(parseRetryAfter(null, now), 0);
  assert.equal(parseRetryAfter("soon", now), 0);
  assert.equal(parseRetryAfter("Tue, 01 Dec 2026 00:00:03 GMT", now), 3000);
});

test("a reserve whose answer was lost is retried as the next attempt", async () => {
  let cut = 1;
  const f = await front(server.url, (req, res) => {
    if (req.url === "/v1/effects/reserve" && cut > 0) {
      cut--;
      res.socket.destroy(); // the ledger's answer never arrives
      return true;
    }
    return false;
  });
  try {
    const got = await new Client(f.url, { backoffBaseMs: 1, backoffMaxMs: 2 }).do(
      { tool: "t.lost", effect: "write", input: { n: uid() }, executionId: "exec-lost" },
      () => ({ result: "ran" }),
    );
    assert.equal(got.result, "ran");
    const reserves = f.seen.filter((s) => s.url === "/v1/effects/reserve");
    assert.equal(reserves.length, 2);
  } finally {
    await f.close();
  }
});
