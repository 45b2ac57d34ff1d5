// Canonical JSON, fingerprints and derived keys: pinned to the same
// values as the Go (client/key_test.go) and Python
// (clients/python/tests/test_canonical.py) suites.

import { test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { canonicalJSON, deriveKey, deriveKeyWith, fingerprint } from "../dist/index.js";

const sha256 = (s) => createHash("sha256").update(s).digest("hex");

test("deriveKey: the value pinned in all three clients", () => {
  const input = {
    name: "Zoë Ünal",
    emails: ["zoe@example.com"],
    age: 41,
    score: 0.1,
    big: 1e21,
    small: 1e-7,
    neg: -0,
    ok: true,
    none: null,
    "€": "euro",
    "é": "e-acute",
    "a\nb": "tab\t\u0001",
  };
  assert.equal(deriveKey("crm.contact.upsert", input), "dk_469d84d0f62eb0da9f12f4e7322f1679998e36bc1fa682f55edb5e6c5457724a");
  assert.equal(fingerprint(input), "sha256:849fddd7ea461d28838de74ba790297d074cc85558d3ee82c3050320ec388b44");
});

test("deriveKeyWith: the dk2_ values pinned in all three clients", async () => {
  const key = Uint8Array.from({ length: 32 }, (_, i) => i); // 0x00 … 0x1f
  const input = {
    name: "Zoë Ünal", emails: ["zoe@example.com"], age: 41, score: 0.1, big: 1e21, small: 1e-7, neg: -0, ok: true,
    none: null, "€": "euro", "é": "e-acute", "a\nb": "tab\t\u0001",
  };
  assert.equal(await deriveKeyWith(key, "crm.contact.upsert", input), "dk2_1eb893d57b5576d26f89a6673c6f2fafae5af686fdf85712bf1f729206e3dd17");
  // printf 'payments.refund\0{"amount":1200,"order":1234}' | openssl dgst -sha256 -mac HMAC -macopt hexkey:0001…1f
  assert.equal(await deriveKeyWith(key, "payments.refund", { order: 1234, amount: 1200 }),
    "dk2_0a9d3f77240a6a4953cce53ebbe391bc1175c9d02f0e90a28852fdf59524370c");
  assert.equal(await deriveKeyWith(key, "t"), "dk2_ba5650b624f400768aeca378e635bd33868970589c2564363a5483287279ff18");
  assert.notEqual(await deriveKeyWith(new Uint8Array(32), "t"), await deriveKeyWith(key, "t"));
  await assert.rejects(deriveKeyWith(new Uint8Array(), "t"), TypeError);
  await assert.rejects(deriveKeyWith(key, ""), TypeError);
});

test("deriveKey: the Go client's known answers", () => {
  // printf 'payments.refund\0{"amount":1200,"order":1234}' | sha256sum
  assert.equal(deriveKey("payments.refund", { order: 1234, amount: 1200 }), "dk_31e288fb6af29670771000949272b245789abeec76d397b530b10fb4990778eb");
  // printf 't\0null' | sha256sum
  assert.equal(deriveKey("t"), "dk_77413b11a83af4269e0b4368e43556391776fb26d92ea8ba3dfa4eda466f1899");
  assert.equal(deriveKey("t", null), deriveKey("t"));
  assert.equal(fingerprint({ order: 1234, amount: 1200 }), "sha256:75a2e07e97a84fa440d4e0acff1fdcc639894a7a661b58c25ee7cc50266ec7fa");
  assert.equal(deriveKey("payments.refund", { amount: 1200.0, order: 1234 }), deriveKey("payments.refund", { order: 1234, amount: 1200 }));
  assert.notEqual(deriveKey("payments.charge", { order: 1234 }), deriveKey("payments.refund", { order: 1234 }));
});

test("deriveKey: 67 bytes of visible ASCII whatever the tool", () => {
  for (const tool of ["email.send", "send mail\tnow é", "t".repeat(300)]) {
    const k = deriveKey(tool, { x: 1 });
    assert.match(k, /^dk_[0-9a-f]{64}$/);
  }
  assert.throws(() => deriveKey("", {}), TypeError);
});

test("canonicalJSON: RFC 8785", () => {
  const cases = [
    [{ b: [1, 2, { z: null, a: true }], a: "x" }, '{"a":"x","b":[1,2,{"a":true,"z":null}]}'],
    [1e3, "1000"],
    [1.5e-7, "1.5e-7"],
    [123456789012345680000, "123456789012345680000"],
    [1e21, "1e+21"],
    [-0, "0"],
    ["\u00e9\u2028<>&", '"\u00e9\u2028<>&"'],
    ["\u001f\b\f\n\r\t\"\\", '"\\u001f\\b\\f\\n\\r\\t\\"\\\\"'],
    // UTF-16 order: U+E000 sorts before U+1F600 (a surrogate pair, 0xD83D…) only by code point.
    [{ "\u{1F600}": 1, "\uE000": 2, a: 3 }, '{"a":3,"\u{1F600}":1,"\uE000":2}'],
    [{ a: undefined, b: 1 }, '{"b":1}'],
    [new Date(0), '"1970-01-01T00:00:00.000Z"'],
  ];
  for (const [v, want] of cases) assert.equal(canonicalJSON(v), want, JSON.stringify(v));
  assert.equal(fingerprint("x"), "sha256:" + sha256('"x"'));
});

test("canonicalJSON: not JSON", () => {
  for (const v of [NaN, Infinity, 1n, () => 1, Symbol("s"), [undefined], "\ud800"]) {
    assert.throws(() => canonicalJSON(v), (e) => e instanceof TypeError || e instanceof RangeError, String(v?.toString?.()));
  }
});

test("errors: a class for every code of the contract", async () => {
  const m = await import("../dist/index.js");
  const codes = {
    fingerprint_mismatch: "FingerprintMismatchError", in_progress: "InProgressError", unsafe_resume: "UnsafeResumeError",
    retry_not_allowed: "RetryNotAllowedError", attempt_conflict: "AttemptConflictError", unknown_key: "UnknownKeyError",
    stale_reservation: "StaleReservationError", already_finalized: "AlreadyFinalizedError", not_interrupted: "NotInterruptedError",
    unknown_receipt: "UnknownReceiptError", invalid_json: "InvalidJSONError", invalid_request: "InvalidRequestError",
    invalid_key: "InvalidKeyError", body_too_large: "BodyTooLargeError", unsupported_media_type: "UnsupportedMediaTypeError",
    not_found: "NotFoundError", method_not_allowed: "MethodNotAllowedError", unavailable: "UnavailableError",
    unauthorized: "UnauthorizedError", forbidden: "ForbiddenError", rate_limited: "RateLimitedError", internal: "InternalError",
    unknown_namespace: "UnknownNamespaceError", namespace_exists: "NamespaceExistsError",
    headers_too_large: "HeadersTooLargeError", not_implemented: "NotImplementedError",
  };
  for (const [code, name] of Object.entries(codes)) {
    const e = m.ledgerError(400, code, "m", {}, 0);
    assert.ok(e instanceof m[name] && e instanceof m.LedgerError, code);
    assert.equal(e.name, name);
    assert.equal(e.code, code);
  }
  assert.equal(m.ledgerError(418, "new_code", "m", {}, 0).constructor, m.LedgerError, "an unknown code is a LedgerError");
});
