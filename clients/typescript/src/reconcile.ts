// Reconciling an unknown outcome (SPEC §15): when an interrupted attempt
// answers unsafe_resume, do() asks the effect's lookup whether the effect
// happened and records a definite answer with POST …/reconcile.

import { LedgerError, NotInterruptedError, ReconcileTooEarlyError, type ReceiptRef } from "./errors.js";
import { sleep } from "./transport.js";

/** What a lookup of the downstream found about an interrupted effect: what Client.reconcile records. */
export interface Reconciled {
  /**
   * "succeeded" (the effect happened: externalRef is what the lookup
   * found) or "not_applied" (it did not: error.code says why). Any other
   * answer is no answer: throw from the lookup, and the key waits for a
   * person.
   */
  outcome: "succeeded" | "not_applied";
  /** Required with "succeeded". */
  externalRef?: string;
  /** With "succeeded": what a replay returns (any JSON). */
  result?: unknown;
  /** Required with "not_applied". */
  error?: { code: string; message?: string };
  /** What was asked: a tool or endpoint name. */
  lookup: string;
  /** The lookup's answer, any JSON of at most 16 KiB. */
  answer: unknown;
}

/** The answer to a reconcile. */
export interface Reconciliation {
  key: string;
  /** The key's state now: "succeeded" or "not_applied". */
  state: string;
  receipt: ReceiptRef;
}

/** Asks the downstream, by the idempotency key, whether the effect happened. */
export type ReconcileFunction = (key: string, ctx: { signal?: AbortSignal }) => Promise<Reconciled> | Reconciled;

/** The body of POST /v1/effects/{key}/reconcile for r. */
export function reconcileBody(r: Reconciled): Record<string, unknown> {
  if (!r.lookup || r.answer === undefined) {
    throw new TypeError("reconcile: the evidence, lookup and answer, is required");
  }
  return {
    outcome: r.outcome,
    external_ref: r.externalRef || undefined,
    result: r.result,
    error: r.error,
    evidence: { lookup: r.lookup, answer: r.answer },
  };
}

/** What settleUnsafe needs of the client. */
export interface Settler {
  reconcile(key: string, r: Reconciled, signal?: AbortSignal): Promise<Reconciliation>;
}

/**
 * Settles an unsafe_resume with the lookup: a definite answer is
 * recorded, waiting out reconcile_too_early until `until` (unix ms).
 * Returns the found answer and its reconcile receipt, or null when the
 * key was ended meanwhile (decide again). A lookup that throws, or a
 * reconcile the ledger refuses, throws `unsafe` (the refusal as its
 * cause).
 */
export async function settleUnsafe(
  c: Settler, key: string, lookup: ReconcileFunction, unsafe: LedgerError, until: number, signal?: AbortSignal,
): Promise<{ found: Reconciled; receipt: ReceiptRef } | null> {
  let found: Reconciled;
  try {
    found = await lookup(key, { signal });
  } catch (err) {
    throw withCause(unsafe, err);
  }
  for (;;) {
    try {
      const rec = await c.reconcile(key, found, signal);
      return { found, receipt: rec.receipt };
    } catch (err) {
      if (err instanceof NotInterruptedError) return null;
      const d = err instanceof ReconcileTooEarlyError ? Math.max(err.retryAfterMs, 1) : -1;
      if (d < 0 || Date.now() + d > until) throw withCause(unsafe, err);
      await sleep(d, signal).catch(() => {
        throw withCause(unsafe, err);
      });
      // Ask again: an answer from before the settle time is never recorded after it.
      try {
        found = await lookup(key, { signal });
      } catch (err2) {
        throw withCause(unsafe, err2);
      }
    }
  }
}

function withCause(err: LedgerError, cause: unknown): LedgerError {
  Object.defineProperty(err, "cause", { value: cause, configurable: true, writable: true });
  return err;
}
