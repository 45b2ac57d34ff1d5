// RFC 8785 JSON canonicalization, input fingerprints and derived keys:
// the same bytes, fingerprints and keys as the Go client (client/key.go)
// and the Python client (effect_ledger.canonical).

import { createHash, webcrypto } from "node:crypto";

/** Prefix of every key made by {@link deriveKey}. */
export const DERIVED_KEY_PREFIX = "dk_";

/** Prefix of every key made by {@link deriveKeyWith}: a key derived in a namespace that commits its payloads. */
export const DERIVED_KEY2_PREFIX = "dk2_";

/**
 * Returns the RFC 8785 (JSON Canonicalization Scheme) text of a JSON
 * value: object members sorted by the UTF-16 code units of their names,
 * numbers as ECMAScript writes them, strings with the minimal escapes.
 *
 * `undefined` members are left out (as JSON.stringify does) and objects
 * with a `toJSON` method (Date) are replaced by its value. Throws a
 * TypeError for `undefined`, functions, symbols and bigints elsewhere,
 * and a RangeError for NaN, infinities and strings with lone surrogates.
 */
export function canonicalJSON(value: unknown): string {
  const out: string[] = [];
  write(value, out, "");
  return out.join("");
}

/** Returns the ledger's fingerprint of an input: "sha256:" + hex SHA-256 of its canonical JSON. */
export function fingerprint(input: unknown): string {
  return "sha256:" + createHash("sha256").update(canonicalJSON(input), "utf8").digest("hex");
}

/**
 * Returns a stable idempotency key for a call of `tool` with `input`:
 *
 *     "dk_" + hex(SHA-256(tool ‖ 0x00 ‖ JCS(input)))
 *
 * A missing input is `null`. The same tool and input — whatever the
 * order of members or the spelling of numbers — give the same key, in
 * this client, the Go client's DeriveKey and the Python client's
 * derive_key, so gateways in any of the three languages share keys.
 */
export function deriveKey(tool: string, input?: unknown): string {
  if (typeof tool !== "string" || tool === "") {
    throw new TypeError("deriveKey: tool is required");
  }
  const h = createHash("sha256");
  h.update(tool, "utf8");
  h.update(new Uint8Array([0]));
  h.update(canonicalJSON(input === undefined ? null : input), "utf8");
  return DERIVED_KEY_PREFIX + h.digest("hex");
}

/**
 * Returns the derived key of a call of `tool` with `input` in a namespace
 * that commits its payloads (contract §14), whose derivation key is `key`
 * (Client.derivationKey()):
 *
 *     "dk2_" + hex(HMAC-SHA-256(key, tool ‖ 0x00 ‖ JCS(input)))
 *
 * computed with Web Crypto. The same as the Go client's DeriveKeyWith and
 * the Python client's derive_key(tool, input, key). The namespace's
 * writers know the key, a reader of the chain does not: a dk2_ key does
 * not let a reader confirm a guessed input, as a dk_ key does.
 */
export async function deriveKeyWith(key: Uint8Array, tool: string, input?: unknown): Promise<string> {
  if (!(key instanceof Uint8Array) || key.length === 0) {
    throw new TypeError("deriveKeyWith: the derivation key is required");
  }
  if (typeof tool !== "string" || tool === "") {
    throw new TypeError("deriveKeyWith: tool is required");
  }
  const enc = new TextEncoder();
  const t = enc.encode(tool);
  const c = enc.encode(canonicalJSON(input === undefined ? null : input));
  const msg = new Uint8Array(t.length + 1 + c.length);
  msg.set(t, 0);
  msg.set(c, t.length + 1);
  const subtle = webcrypto.subtle;
  const k = await subtle.importKey("raw", key, { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
  const mac = new Uint8Array(await subtle.sign("HMAC", k, msg));
  return DERIVED_KEY2_PREFIX + Buffer.from(mac).toString("hex");
}

function write(v: unknown, out: string[], path: string): void {
  if (v !== null && typeof v === "object" && typeof (v as { toJSON?: unknown }).toJSON === "function") {
    v = (v as { toJSON: (key: string) => unknown }).toJSON(path);
  }
  switch (typeof v) {
    case "boolean":
      out.push(v ? "true" : "false");
      return;
    case "number":
      if (!Number.isFinite(v)) {
        throw new RangeError(`${path || "input"}: ${v} is not a JSON number`);
      }
      out.push(JSON.stringify(v)); // ECMAScript Number::toString, as RFC 8785 §3.2.2.3 asks; -0 is "0"
      return;
    case "string":
      out.push(quote(v, path));
      return;
    case "object":
      break;
    default:
      throw new TypeError(`${path || "input"}: a ${typeof v} is not a JSON value`);
  }
  if (v === null) {
    out.push("null");
    return;
  }
  if (Array.isArray(v)) {
    out.push("[");
    v.forEach((item, i) => {
      if (i > 0) out.push(",");
      write(item, out, `${path}[${i}]`);
    });
    out.push("]");
    return;
  }
  const obj = v as Record<string, unknown>;
  // The default sort compares UTF-16 code units, which is RFC 8785's order.
  const keys = Object.keys(obj).filter((k) => obj[k] !== undefined).sort();
  out.push("{");
  keys.forEach((k, i) => {
    if (i > 0) out.push(",");
    out.push(quote(k, path), ":");
    write(obj[k], out, path ? `${path}.${k}` : k);
  });
  out.push("}");
}

// quote writes s as a JSON string. JSON.stringify's escapes are RFC
// 8785's (\" \\ \b \f \n \r \t, \u00xx in lowercase hex for the other
// control characters); a lone surrogate, which it would escape, is not
// Unicode text and is refused as the Go and Python clients refuse it.
function quote(s: string, path: string): string {
  if (!isWellFormed(s)) {
    throw new RangeError(`${path || "input"}: string is not valid Unicode (lone surrogate)`);
  }
  return JSON.stringify(s);
}

function isWellFormed(s: string): boolean {
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c >= 0xd800 && c <= 0xdbff) {
      const d = s.charCodeAt(i + 1);
      if (!(d >= 0xdc00 && d <= 0xdfff)) return false;
      i++;
    } else if (c >= 0xdc00 && c <= 0xdfff) {
      return false;
    }
  }
  return true;
}
