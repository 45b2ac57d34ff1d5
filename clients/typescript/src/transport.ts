// HTTP transport: one request with the contract's error shape decoded,
// retried with jittered backoff on the answers that record nothing.

import { ledgerError, LedgerError } from "./errors.js";

/** Options of the HTTP transport. */
export interface TransportOptions {
  /** Bearer token (ledgerctl token create); none for an open ledger. */
  token?: string;
  /** The fetch to use; default the global fetch (Node ≥ 18). */
  fetch?: typeof fetch;
  /** Retries of one call on 503, 429 and transport errors, default 8. */
  maxRetries?: number;
  /** First backoff, default 100 ms; it doubles up to backoffMaxMs (default 5 000 ms). */
  backoffBaseMs?: number;
  backoffMaxMs?: number;
  /** A W3C traceparent sent with every request, so the ledger's spans join the caller's trace. */
  traceparent?: string | (() => string | undefined);
}

/** A decoded 2xx answer. */
export interface Response {
  status: number;
  headers: Headers;
  body: any;
}

/** Sends requests to one ledger. */
export class Transport {
  readonly base: string;
  private readonly prefix: string;
  private readonly fetch: typeof fetch;
  private readonly token: string;
  /** Retries of one call on 503, 429 and transport errors. */
  readonly maxRetries: number;
  private readonly backoffBaseMs: number;
  private readonly backoffMaxMs: number;
  private readonly traceparent: TransportOptions["traceparent"];

  constructor(baseURL: string, prefix: string, o: TransportOptions) {
    if (!/^[a-z][a-z0-9+.-]*:\/\//i.test(baseURL)) baseURL = "http://" + baseURL;
    const u = new URL(baseURL);
    if (u.search || u.hash) throw new TypeError(`client: base URL ${baseURL} must not have a query or fragment`);
    this.base = u.toString().replace(/\/+$/, "");
    this.prefix = prefix;
    this.fetch = o.fetch ?? globalThis.fetch;
    if (typeof this.fetch !== "function") throw new TypeError("client: no global fetch (Node ≥ 18), pass options.fetch");
    this.token = o.token ?? "";
    this.maxRetries = o.maxRetries ?? 8;
    this.backoffBaseMs = o.backoffBaseMs ?? 100;
    this.backoffMaxMs = o.backoffMaxMs ?? 5_000;
    this.traceparent = o.traceparent;
    if (this.maxRetries < 0 || this.backoffBaseMs <= 0 || this.backoffMaxMs < this.backoffBaseMs) {
      throw new RangeError("client: retries need maxRetries ≥ 0 and 0 < backoffBaseMs ≤ backoffMaxMs");
    }
  }

  /**
   * Sends one request, retried on 503 and 429 (after Retry-After) and on
   * transport errors: all of them when retrySent (the call is idempotent,
   * a commit; then also 502 and 504), else only those that happened
   * before the request was sent (a refused connection).
   */
  async send(method: string, path: string, body: unknown, o: { signal?: AbortSignal; retrySent: boolean; unprefixed?: boolean }): Promise<Response> {
    for (let n = 0; ; n++) {
      try {
        return await this.once(method, path, body, o.signal, o.unprefixed);
      } catch (err) {
        if (n >= this.maxRetries || !this.retryable(err, o.retrySent) || o.signal?.aborted) throw err;
        await pause(this.backoff(n, err), o.signal, err);
      }
    }
  }

  // once sends one request; the namespace's prefix goes before a /v1/
  // path unless unprefixed (/v1/namespaces/{ns}/policy).
  private async once(method: string, path: string, body: unknown, signal?: AbortSignal, unprefixed = false): Promise<Response> {
    const headers: Record<string, string> = { Accept: "application/json" };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    if (this.token) headers.Authorization = "Bearer " + this.token;
    const tp = typeof this.traceparent === "function" ? this.traceparent() : this.traceparent;
    if (tp) headers.traceparent = tp;
    const url = this.base + (this.prefix && !unprefixed && path.startsWith("/v1/") ? this.prefix + path.slice(3) : path);
    const res = await this.fetch(url, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      signal,
    });
    const text = await res.text();
    if (res.status >= 400) throw decodeError(res, text);
    return { status: res.status, headers: res.headers, body: text ? JSON.parse(text) : null };
  }

  private retryable(err: unknown, retrySent: boolean): boolean {
    if (err instanceof LedgerError) {
      return err.status === 503 || err.status === 429 || (retrySent && (err.status === 502 || err.status === 504));
    }
    if (err instanceof Error && (err.name === "AbortError" || err.name === "TimeoutError")) return false;
    return retrySent || unsent(err);
  }

  /** Waits before retry n (0-based) after err; rejects with err when signal aborts. */
  pause(n: number, err: unknown, signal?: AbortSignal): Promise<void> {
    return pause(this.backoff(n, err), signal, err);
  }

  // backoff is the server's Retry-After plus up to 20 % jitter, so that
  // clients told the same time do not return together, else full-jitter
  // exponential backoff.
  private backoff(n: number, err: unknown): number {
    if (err instanceof LedgerError && err.retryAfterMs > 0) {
      return err.retryAfterMs + Math.random() * (err.retryAfterMs / 5 + 1);
    }
    const d = Math.min(this.backoffBaseMs * 2 ** Math.min(n, 30), this.backoffMaxMs);
    return d / 2 + Math.random() * (d / 2);
  }
}

// decodeError turns an error answer into a LedgerError. A body that is
// not the contract's shape (a proxy's page) keeps the status and gets a
// code from it.
function decodeError(res: globalThis.Response, text: string): LedgerError {
  const retryAfterMs = parseRetryAfter(res.headers.get("Retry-After"));
  try {
    const e = JSON.parse(text)?.error;
    if (e && typeof e.code === "string" && e.code) {
      return ledgerError(res.status, e.code, String(e.message ?? ""), e.details ?? {}, retryAfterMs);
    }
  } catch {
    // not JSON: a proxy's page
  }
  const code = [502, 503, 504].includes(res.status) ? "unavailable" : res.status === 429 ? "rate_limited" : res.status === 404 ? "not_found" : "internal";
  return ledgerError(res.status, code, text.trim().slice(0, 200) || `${res.status} ${res.statusText}`, {}, retryAfterMs);
}

/** Reads Retry-After (delay-seconds or an HTTP date) in milliseconds; 0 when absent or malformed. */
export function parseRetryAfter(v: string | null, now = Date.now()): number {
  if (!v) return 0;
  v = v.trim();
  if (/^\d+$/.test(v)) return Math.min(Number(v), 86_400) * 1000;
  const t = Date.parse(v);
  return Number.isNaN(t) || t <= now ? 0 : t - now;
}

// unsent reports whether a fetch failed before the request could reach
// the server (nothing can have been recorded).
export function unsent(err: unknown): boolean {
  const code = (err as { cause?: { code?: string } })?.cause?.code;
  return code === "ECONNREFUSED" || code === "ENOTFOUND" || code === "EAI_AGAIN";
}

/** Sleeps ms milliseconds, or rejects when signal aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const t = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(t);
      reject(signal!.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** Sleeps ms milliseconds before a retry; rejects with err when signal aborts. */
async function pause(ms: number, signal: AbortSignal | undefined, err: unknown): Promise<void> {
  await sleep(ms, signal).catch(() => {
    throw err;
  });
}
