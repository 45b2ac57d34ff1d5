// The client: one do() call wraps a side effect in reserve → run →
// commit, as the Go client's Client.Do and the Python client's
// Ledger.do do.

import { randomBytes } from "node:crypto";
import { deriveKey, deriveKeyWith, fingerprint } from "./canonical.js";
import {
  ApprovalRequiredError,
  approvalPageURL,
  AttemptConflictError,
  CommitError,
  EffectError,
  EffectFailure,
  InProgressError,
  InvalidRequestError,
  NotFoundError,
  LedgerError,
  OutcomeUnknown,
  UnknownOutcomeError,
  UnsafeResumeError,
  type CommitOutcome,
  type CommitRequest,
  type ReceiptRef,
} from "./errors.js";
import { reconcileBody, settleUnsafe, type ReconcileFunction, type Reconciled, type Reconciliation } from "./reconcile.js";
import { sleep, Transport, unsent, type TransportOptions } from "./transport.js";

export { sleep };

/** The class of an effect (contract §1). "none" and "read" skip the ledger. */
export type EffectClass = "none" | "read" | "write" | "destructive" | "external";

/** Options of a Client; every one has a default. */
export interface ClientOptions extends TransportOptions {
  /** The namespace to work in (/v1/ns/{namespace}/…); default "default". */
  namespace?: string;
  /** Longest server-side wait per reserve (wait_ms), default 20 000 ms, at most 60 000. */
  waitMs?: number;
  /** How long do() waits for another attempt holding the key, default 120 000 ms. */
  maxWaitMs?: number;
  /** Polling interval while a key is busy on a ledger that does not wait, default 1 000 ms. */
  pollIntervalMs?: number;
  /** How long do() keeps trying to record an outcome, default 60 000 ms. */
  commitTimeoutMs?: number;
  /**
   * How long do() waits for the answer to a call the namespace's policy
   * sends to approval before throwing ApprovalRequiredError; default 0
   * (at once). Every reserve carries wait_ms, so the ledger may hold such
   * a call up to waitMs for a quick answer even without it.
   */
  approvalWaitMs?: number;
}

/** What a retry of a failed call changed (the reserve's "changed", SPEC §13). */
export interface Changed {
  context_hash?: string;
  component?: string;
  strategy?: string;
}

/** The approval a reservation consumed (SPEC §13): the approval receipt and the ask it answered. */
export interface ApprovalUse {
  seq: number;
  askSeq: number;
}

/**
 * What a namespace derives idempotency keys with (contract §14, GET
 * /v1/derivation-key): the payload mode in force and the namespace's
 * fingerprint key (32 bytes; empty from a ledgerd before v1.4, whose
 * namespaces are all inline).
 */
export interface DerivationKey {
  payloads: "inline" | "committed";
  key: Uint8Array;
}

/** One side effect for do(). */
export interface Effect {
  /** The tool or capability, 1–128 bytes of visible ASCII. */
  tool: string;
  /** Its class: "write", "destructive" or "external" ("none" and "read" run without the ledger). */
  effect: EffectClass;
  /** What the call does, as JSON: fingerprinted locally (only the fingerprint is sent) and, without a key, the source of the derived key. */
  input?: unknown;
  /**
   * The idempotency key; default derived from tool and input: in a
   * namespace that commits its payloads deriveKeyWith(the namespace's
   * derivation key, tool, input) (dk2_, the key fetched once per Client),
   * else deriveKey(tool, input) (dk_). None and read calls, which skip the
   * ledger, get deriveKey's.
   */
  key?: string;
  /** The effect dedupes downstream (it passes the key on): an interrupted attempt may be taken over and a retryable failure retried. */
  idempotent?: boolean;
  /** A fingerprint computed elsewhere ("sha256:…"); default fingerprint(input). */
  inputHash?: string;
  /** The invocation this attempt belongs to (the model's tool-call id); default a fresh one. */
  executionId?: string;
  /** The runtime retry number within executionId, from 1; default 1, or the next one after a conflict. */
  attempt?: number;
  /** How long the reservation is held; default the ledger's (30 s). Make it longer than the effect takes. */
  leaseMs?: number;
  /** How long to wait for another attempt holding the key; default the client's maxWaitMs. */
  maxWaitMs?: number;
  /**
   * Send the input itself instead of its fingerprint: the ledger then
   * fingerprints it, and keeps it off the chain for the approvers when the
   * namespace's policy sends the call to approval, which needs it (SPEC
   * §13). Not with inputHash.
   */
  sendInput?: boolean;
  /** Shown to the approver as the requester's account of the call (at most 1024 bytes). */
  approvalSummary?: string;
  /** What this call changed since the same call failed: a repeat_failure rule refuses an unchanged retry (UnchangedRetryError). */
  changed?: Changed;
  /**
   * Opaque ids of the people the effect concerns (a customer id, a
   * recipient id; never names or addresses themselves), at most 8 strings
   * of 1–128 bytes: an erasure by subject (POST /v1/ns/{ns}/erasures
   * {"subject"}) then removes the recorded values of this key (SPEC §14).
   * The ledger keeps only their HMACs, never on the chain; the first
   * reserve of a key's generation fixes them.
   */
  subjects?: string[];
  /** How long to wait for an approver's answer; default the client's approvalWaitMs. */
  approvalWaitMs?: number;
  /** Aborts the waits and retries, and is passed to the effect function. */
  signal?: AbortSignal;
  /**
   * Called when the reserve answers unsafe_resume (an earlier attempt was
   * interrupted and may have happened): asks the downstream, by the key,
   * whether the effect happened (SPEC §15). "succeeded" is recorded and
   * returned as a replay (reconciled set; fn does not run); "not_applied"
   * is recorded and the key reserved again; reconcile_too_early is waited
   * out within maxWaitMs and signal. A throw, or a reconcile the ledger
   * refuses, leaves the UnsafeResumeError (the refusal as its cause).
   */
  reconcile?: ReconcileFunction;
}

/** What an effect function returns on success. */
export interface Outcome {
  /** Recorded and returned to every later repeat; any JSON, at most 64 KiB. */
  result?: unknown;
  /** The downstream reference: charge id, message id, commit sha. */
  externalRef?: string;
}

/** Runs the effect with its idempotency key (pass it downstream). */
export type EffectFunction = (key: string, ctx: { signal?: AbortSignal; reservation: string }) => Promise<Outcome | void> | Outcome | void;

/** What do() returns for an effect that succeeded, now or before. */
export interface DoResult {
  /** Set when the key had expired and this run began its next generation (SPEC §12). */
  renewed?: Renewal;
  /** Set when the key's last outcome was "not_applied" and this run ran the effect again (SPEC §4.1). */
  afterNotApplied?: NotAppliedRef;
  /** Set when this run consumed an approver's approval (SPEC §13). */
  approval?: ApprovalUse;
  /** The recorded result (null when none). */
  result: unknown;
  /** An earlier attempt's recorded result; the function did not run. */
  replayed: boolean;
  /** A replay of what Effect.reconcile found: the interrupted attempt's effect happened (SPEC §15). */
  reconciled?: boolean;
  key: string;
  /** The commit receipt, or for a replay the replay receipt. */
  receipt: ReceiptRef;
  externalRef: string;
  /** For a replay: the receipt of the recorded outcome. */
  original?: ReceiptRef;
  /**
   * For a replay whose recorded values an erasure removed (SPEC §14):
   * field ("result", "external_ref", …) → the seq of the erase receipt.
   * An erased result is null, an erased externalRef "".
   */
  erased?: Record<string, number>;
  /** A "none" or "read" effect: the function ran without the ledger. */
  notRecorded: boolean;
  /** This run took over an interrupted idempotent attempt. */
  takeover: boolean;
  /** This run retried a retryable failure. */
  retry: boolean;
  /** Committed after the lease had ended. */
  late: boolean;
  /** The ledger refused the result (over 64 KiB): the success was recorded without it. */
  resultDropped?: boolean;
}

/** A reserve call: the wire fields of POST /v1/effects/reserve. */
export interface ReserveRequest {
  key?: string;
  executionId: string;
  attempt?: number;
  tool: string;
  effect: EffectClass;
  idempotent?: boolean;
  inputHash?: string;
  /** The input itself (any JSON), which the ledger fingerprints; not with inputHash. */
  input?: unknown;
  approvalSummary?: string;
  changed?: Changed;
  /** Opaque ids of the people the effect concerns (SPEC §14): at most 8 strings of 1–128 bytes. */
  subjects?: string[];
  leaseMs?: number;
  /** How long the ledger may hold the request while another attempt holds the key, or the call's ask awaits its answer. */
  waitMs?: number;
}

/** The answer to a reserve. */
/** A reserve that started a new generation of an expired key (SPEC §12). */
export interface Renewal {
  /** The key's latest receipt before it, which the new reserve names as ref_seq. */
  seq: number;
  recordedAt: number;
}

/** The "not_applied" outcome a reserve follows (SPEC §4.1): the effect runs again. */
export interface NotAppliedRef {
  /** The receipt of that outcome (a commit or resolve), which the new reserve names as ref_seq. */
  seq: number;
  errorCode: string;
}

/**
 * The state of a key (contract §3, §4.1, §13): "not_applied" when its last
 * outcome applied nothing, so its next reserve runs the effect again;
 * "awaiting_approval" while an ask is pending, "approved" once it is approved
 * and not yet consumed, "approval_expired" when a key that never ran had its
 * only ask end unused, "rejected" after an approver rejected it.
 */
export type KeyState =
  | "reserved"
  | "interrupted"
  | "succeeded"
  | "failed"
  | "not_applied"
  | "awaiting_approval"
  | "approved"
  | "approval_expired"
  | "rejected";

/** A key as GET /v1/effects/{key} shows it (wire field names). */
export interface EffectView {
  idempotency_key: string;
  state: KeyState;
  tool: string;
  effect: EffectClass;
  idempotent: boolean;
  input_hash: string;
  /** The key's receipts, oldest first, as JSON receipts (contract §2). */
  receipts: Record<string, any>[];
  [field: string]: any;
}

export interface Reservation {
  status: "reserved" | "replayed" | "not_recorded";
  /** Set when the key had expired and this reserve began its next generation. */
  renewed?: Renewal;
  /** Set when the key's last outcome was "not_applied": this reservation runs the effect again. */
  afterNotApplied?: NotAppliedRef;
  /** Set when this reservation consumed an approval (SPEC §13). */
  approval?: ApprovalUse;
  key: string;
  keyGenerated: boolean;
  /** Status "reserved": the secret token that commits. */
  reservation: string;
  attempt: number;
  leaseExpiresAt: number;
  takeover: boolean;
  retry: boolean;
  /** Status "replayed": the recorded outcome. */
  outcome?: string;
  externalRef: string;
  result: unknown;
  resultEncoding?: string;
  original?: ReceiptRef;
  /** Status "replayed": the recorded fields an erasure removed, field → the erase receipt's seq (SPEC §14). */
  erased?: Record<string, number>;
  receipt: ReceiptRef;
}

/** A namespace's gate policy (SPEC §13); each member of a rule comes from the first matching rule that sets it. */
export interface Policy {
  rules?: PolicyRule[];
  /** "deny" (the default) or "allow": whether who asked may answer. */
  self_approval?: "deny" | "allow";
}

/** One rule of a Policy. */
export interface PolicyRule {
  /** A glob: * matches any bytes, ? one. */
  tool: string;
  effect?: EffectClass;
  approval?: "required" | string;
  /** "role:<role>", a token name, or "mcp-client"; none: any approver or admin token. */
  approvers?: string[];
  expires_in_ms?: number;
  deny?: boolean;
  repeat_failure?: "refuse" | string;
  repeat_window_ms?: number;
  /** SPEC §15: the actor of an interrupted reserve may reconcile it; settle_ms (default 60 000) before a not_applied. */
  reconcile?: { allow: boolean; settle_ms?: number };
}

/** A namespace's policy as GET/PUT /v1/namespaces/{ns}/policy answer it. */
export interface PolicyState {
  namespace: string;
  policy: Policy;
  /** The policy receipt that set it; 0 when none. */
  seq: number;
  /** PUT: whether a policy receipt was appended (an equal policy appends nothing). */
  changed?: boolean;
  receipt?: ReceiptRef | null;
}

/** An approver's answer. */
export type Decision = "approve" | "reject";

/** The state of an ask. */
export type ApprovalState = "pending" | "approved" | "rejected" | "expired" | "consumed";

/** An ask and what became of it (wire field names). */
export interface Approval {
  seq: number;
  idempotency_key: string;
  execution_id: string;
  attempt: number;
  tool: string;
  effect: EffectClass;
  idempotent: boolean;
  input_hash: string;
  /** The requester's approval_summary. */
  summary: string;
  actor: string;
  asked_at: number;
  expires_at: number;
  state: ApprovalState;
  answer: { seq: number; decision: Decision; actor: string; role: string; note: string; recorded_at: number } | null;
  consumed_by: { seq: number; execution_id: string; attempt: number } | null;
  /** approval(seq) for approver and admin tokens: the asked input (null once deleted), and whether it matches input_hash. */
  input?: unknown;
  input_verified?: boolean;
  [field: string]: any;
}

/** One page of approvals(). */
export interface ApprovalPage {
  approvals: Approval[];
  next_after: number | null;
}

/** The answer to a commit. */
export interface CommitResult {
  key: string;
  outcome: CommitOutcome;
  late: boolean;
  /** The same commit was recorded before; nothing was appended now. */
  repeat: boolean;
  receipt: ReceiptRef;
}

const DEFAULTS = { waitMs: 20_000, maxWaitMs: 120_000, pollIntervalMs: 1_000, commitTimeoutMs: 60_000, approvalWaitMs: 0 };

/**
 * A client of the effect ledger for tool gateways:
 *
 * ```ts
 * const ledger = new Client("http://127.0.0.1:8080", { token: process.env.LEDGER_TOKEN });
 * const { result, replayed } = await ledger.do(
 *   { tool: "payments.refund", effect: "write", input: { order: 1234, amount: 1200 }, idempotent: true },
 *   async (key) => ({ result: await psp.refund(1234, 1200, key), externalRef: "re_3Pq9" }),
 * );
 * ```
 */
export class Client {
  readonly namespace: string;
  private readonly http: Transport;
  private readonly opts: typeof DEFAULTS;
  private serverWaits = true;
  /** The namespace's derivation key: being fetched, or fetched (kept for the client's life). */
  private derivation?: Promise<DerivationKey>;

  constructor(baseURL: string, options: ClientOptions = {}) {
    const ns = options.namespace ?? "default";
    if (!/^[a-z0-9._-]{1,64}$/.test(ns)) {
      throw new TypeError(`client: namespace ${JSON.stringify(ns)}: names are 1–64 bytes of a-z 0-9 . _ -`);
    }
    this.namespace = ns;
    const prefix = ns === "default" ? "" : `/v1/ns/${ns}`;
    this.http = new Transport(baseURL, prefix, options);
    this.opts = {
      waitMs: options.waitMs ?? DEFAULTS.waitMs,
      maxWaitMs: options.maxWaitMs ?? DEFAULTS.maxWaitMs,
      pollIntervalMs: options.pollIntervalMs ?? DEFAULTS.pollIntervalMs,
      commitTimeoutMs: options.commitTimeoutMs ?? DEFAULTS.commitTimeoutMs,
      approvalWaitMs: options.approvalWaitMs ?? DEFAULTS.approvalWaitMs,
    };
    if (this.opts.waitMs < 0 || this.opts.waitMs > 60_000) throw new RangeError("client: waitMs is not within 0 … 60000");
  }

  /** The normalized base URL. */
  get baseURL(): string {
    return this.http.base;
  }

  /**
   * Runs `fn` at most once per key across every gateway that uses the
   * same ledger: it reserves the key (derived from tool and input when
   * none is given); if an earlier attempt succeeded it returns the
   * recorded result with `replayed` set, without calling fn; if another
   * attempt holds the key it waits (wait_ms, then Retry-After) up to
   * maxWaitMs; otherwise it calls fn and commits its outcome.
   *
   * Throws a LedgerError subclass for the ledger's refusals
   * (UnsafeResumeError, RetryNotAllowedError, FingerprintMismatchError,
   * InProgressError after the wait, ApprovalRejectedError,
   * DeniedByPolicyError, UnchangedRetryError, …), ApprovalRequiredError
   * without calling fn when the namespace's policy sends the call to
   * approval (after waiting approvalWaitMs for the answer), EffectError when fn failed and the
   * failure was recorded (outcome "not_applied" when fn threw
   * notApplied(): the next call runs fn again), UnknownOutcomeError when fn threw OutcomeUnknown
   * or was aborted, and CommitError when fn ran but its outcome could not
   * be recorded.
   */
  async do(e: Effect, fn: EffectFunction): Promise<DoResult> {
    const req = await this.reserveRequest(e);
    if (e.effect === "none" || e.effect === "read") {
      const o = (await fn(req.key!, { signal: e.signal, reservation: "" })) ?? {};
      return { result: o.result ?? null, replayed: false, key: req.key!, receipt: { seq: 0, hash: "" },
        externalRef: o.externalRef ?? "", notRecorded: true, takeover: false, retry: false, late: false };
    }
    let rsv: Reservation;
    try {
      rsv = await this.reserveWaiting(req, e);
    } catch (err) {
      if (err instanceof UnsafeResumeError && e.reconcile) {
        const until = Date.now() + (e.maxWaitMs ?? this.opts.maxWaitMs);
        const settled = await settleUnsafe(this, req.key!, e.reconcile, err, until, e.signal);
        if (settled?.found.outcome === "succeeded") {
          const { found, receipt } = settled;
          return { result: found.result ?? null, replayed: true, reconciled: true, key: req.key!, receipt,
            externalRef: found.externalRef ?? "", original: receipt, notRecorded: false, takeover: false, retry: false, late: false };
        }
        rsv = await this.reserveWaiting(req, e);
      } else {
        if (!(err instanceof ApprovalRequiredError) || (e.approvalWaitMs ?? this.opts.approvalWaitMs) <= 0) throw err;
        rsv = await this.awaitApproval(req, e, err);
      }
    }
    return this.run(rsv, fn, e.signal);
  }

  /**
   * Records what a lookup of the downstream found about the interrupted
   * key (POST /v1/effects/{key}/reconcile, SPEC §15): the caller must be
   * the actor of the interrupted reserve (or an admin), and a rule of the
   * namespace's policy must allow it for the tool. Throws
   * ReconcileNotAllowedError, NotInterruptedError, ReconcileTooEarlyError
   * (retryAfterMs says when), InvalidRequestError, UnknownKeyError.
   */
  async reconcile(key: string, r: Reconciled, signal?: AbortSignal): Promise<Reconciliation> {
    const b = (await this.http.send("POST", `/v1/effects/${encodeURIComponent(key)}/reconcile`, reconcileBody(r), { signal, retrySent: false })).body;
    return { key: b.idempotency_key, state: b.state, receipt: b.receipt };
  }

  /**
   * Runs fn under a reservation that reserve() returned and commits its
   * outcome, as do() does after its reserve: for status "replayed" it
   * returns the recorded result without calling fn; for "reserved" it
   * calls fn with the key and commits what fn returned, or records its
   * failure (EffectError, as do()). For integrations whose framework
   * asks before it runs (a tool's approval check) and runs later.
   */
  async run(rsv: Reservation, fn: EffectFunction, signal?: AbortSignal): Promise<DoResult> {
    if (rsv.status === "replayed") {
      if (rsv.resultEncoding) {
        throw new Error(`replay of ${rsv.key}: the recorded result is not JSON (result_encoding ${rsv.resultEncoding}); run ledgerctl verify`);
      }
      return { result: rsv.result, replayed: true, key: rsv.key, receipt: rsv.receipt, externalRef: rsv.externalRef,
        original: rsv.original, erased: rsv.erased, notRecorded: false, takeover: false, retry: false, late: false };
    }
    if (rsv.status !== "reserved" || !rsv.reservation) {
      throw new Error(`reserve ${rsv.key}: unexpected status ${JSON.stringify(rsv.status)}`);
    }
    let outcome: Outcome;
    try {
      outcome = (await fn(rsv.key, { signal, reservation: rsv.reservation })) ?? {};
    } catch (err) {
      return this.recordFailure(rsv, err);
    }
    const cm: CommitRequest = { outcome: "succeeded", externalRef: outcome.externalRef, result: outcome.result };
    const cr = await this.commitOrThrow(rsv, cm, undefined);
    return { result: cr.resultDropped ? null : outcome.result ?? null, replayed: false, key: rsv.key, receipt: cr.receipt,
      externalRef: outcome.externalRef ?? "", notRecorded: false, takeover: rsv.takeover, retry: rsv.retry, late: cr.late, renewed: rsv.renewed,
      afterNotApplied: rsv.afterNotApplied, approval: rsv.approval, resultDropped: cr.resultDropped };
  }

  /**
   * Makes one reserve call, retried on 503 and 429 (and transport errors
   * before sending). A call the namespace's policy sends to approval
   * throws ApprovalRequiredError.
   */
  async reserve(r: ReserveRequest, signal?: AbortSignal): Promise<Reservation> {
    const body = {
      idempotency_key: r.key || undefined,
      execution_id: r.executionId,
      attempt: r.attempt ?? 1,
      tool: r.tool,
      effect: r.effect,
      idempotent: r.idempotent ?? false,
      input_hash: r.inputHash || undefined,
      input: r.input,
      approval_summary: r.approvalSummary || undefined,
      changed: r.changed,
      subjects: r.subjects,
      lease_ms: r.leaseMs || undefined,
      wait_ms: r.waitMs || undefined,
    };
    const { status, body: b } = await this.http.send("POST", "/v1/effects/reserve", body, { signal, retrySent: false });
    if (status === 202 || b.status === "approval_required") {
      const a = b.approval ?? {};
      throw new ApprovalRequiredError(b.idempotency_key ?? "", a.seq ?? 0, a.expires_at ?? 0, a.state ?? "pending",
        b.receipt ?? { seq: 0, hash: "" }, false, approvalPageURL(this.baseURL, a.seq ?? 0),
        `ledgerctl approvals approve ${a.seq ?? 0} --server ${this.baseURL}${this.namespace === "default" ? "" : ` -n ${this.namespace}`}`);
    }
    return {
      status: b.status, key: b.idempotency_key, keyGenerated: !!b.key_generated, reservation: b.reservation ?? "",
      attempt: b.attempt ?? 0, leaseExpiresAt: b.lease_expires_at ?? 0, takeover: !!b.takeover, retry: !!b.retry,
      outcome: b.outcome, externalRef: b.external_ref ?? "", result: b.result ?? null, resultEncoding: b.result_encoding,
      original: b.original, receipt: b.receipt ?? { seq: 0, hash: "" },
      erased: b.erased && typeof b.erased === "object" ? b.erased : undefined,
      renewed: b.renewed ? { seq: b.renewed.seq, recordedAt: b.renewed.recorded_at } : undefined,
      afterNotApplied: b.after_not_applied ? { seq: b.after_not_applied.seq, errorCode: b.after_not_applied.error_code ?? "" } : undefined,
      approval: b.approval ? { seq: b.approval.seq, askSeq: b.approval.ask_seq } : undefined,
    };
  }

  /**
   * Records the outcome of reservation on key. An identical commit is
   * idempotent, so it is retried on 503, 429, 502, 504 and transport
   * errors. Use it for an outcome do() could not record (CommitError,
   * UnknownOutcomeError). Outcome "not_applied" (SPEC §4.1) needs
   * `error.code` and no `externalRef`; the key may then be reserved again.
   */
  async commit(key: string, reservation: string, cm: CommitRequest, signal?: AbortSignal): Promise<CommitResult> {
    const body = { reservation, outcome: cm.outcome, external_ref: cm.externalRef || undefined, result: cm.result, error: cm.error };
    const res = await this.http.send("POST", `/v1/effects/${encodeURIComponent(key)}/commit`, body, { signal, retrySent: true });
    const b = res.body;
    return { key: b.idempotency_key, outcome: b.outcome, late: !!b.late, receipt: b.receipt,
      repeat: res.headers.get("Idempotent-Replayed") === "true" };
  }

  /** Returns a key's state, fingerprint and receipts (GET /v1/effects/{key}). */
  async getEffect(key: string, signal?: AbortSignal): Promise<EffectView> {
    return (await this.http.send("GET", `/v1/effects/${encodeURIComponent(key)}`, undefined, { signal, retrySent: true })).body;
  }

  /** Returns the chain's head (GET /v1/head). */
  async head(signal?: AbortSignal): Promise<ReceiptRef> {
    return (await this.http.send("GET", "/v1/head", undefined, { signal, retrySent: true })).body;
  }

  /** Returns the namespace's policy in force (policy {} and seq 0 when none). */
  async policy(signal?: AbortSignal): Promise<PolicyState> {
    return (await this.http.send("GET", this.policyPath(), undefined, { signal, retrySent: true, unprefixed: true })).body;
  }

  /**
   * Sets the namespace's policy (an admin token). A policy equal to the
   * one in force appends nothing (changed false). A bad one is
   * InvalidRequestError with details.field.
   */
  async setPolicy(policy: Policy | Record<string, unknown>, signal?: AbortSignal): Promise<PolicyState> {
    return (await this.http.send("PUT", this.policyPath(), policy, { signal, retrySent: true, unprefixed: true })).body;
  }

  /** Lists the namespace's asks by seq, one page; state "pending", "approved", "rejected", "expired" or "consumed". */
  async approvals(o: { state?: ApprovalState; after?: number; limit?: number; signal?: AbortSignal } = {}): Promise<ApprovalPage> {
    const q = new URLSearchParams();
    if (o.state) q.set("state", o.state);
    if (o.after) q.set("after", String(o.after));
    if (o.limit) q.set("limit", String(o.limit));
    const qs = q.toString();
    const path = "/v1/approvals" + (qs ? "?" + qs : "");
    return (await this.http.send("GET", path, undefined, { signal: o.signal, retrySent: true })).body;
  }

  /** Returns the ask at seq; for approver and admin tokens with its input and input_verified. Throws UnknownApprovalError. */
  async approval(seq: number, signal?: AbortSignal): Promise<Approval> {
    return (await this.http.send("GET", `/v1/approvals/${seqOf(seq)}`, undefined, { signal, retrySent: true })).body;
  }

  /**
   * Answers the ask at seq (an approver or admin token the rule lists);
   * returns the ask with its answer. The same decision again returns the
   * recorded one. Throws AlreadyAnsweredError, ApprovalExpiredError,
   * SelfApprovalError, ForbiddenError, UnknownApprovalError.
   */
  async answer(seq: number, decision: Decision, note?: string, signal?: AbortSignal): Promise<Approval> {
    if (decision !== "approve" && decision !== "reject") {
      throw new TypeError(`answer: decision ${JSON.stringify(decision)} is not "approve" or "reject"`);
    }
    const body = { decision, note: note || undefined };
    return (await this.http.send("POST", `/v1/approvals/${seqOf(seq)}`, body, { signal, retrySent: true })).body;
  }

  /** answer(seq, "approve", note). */
  approve(seq: number, note?: string, signal?: AbortSignal): Promise<Approval> {
    return this.answer(seq, "approve", note, signal);
  }

  /** answer(seq, "reject", note). */
  reject(seq: number, note?: string, signal?: AbortSignal): Promise<Approval> {
    return this.answer(seq, "reject", note, signal);
  }

  private policyPath(): string {
    return `/v1/namespaces/${encodeURIComponent(this.namespace)}/policy`;
  }

  // awaitApproval reserves req again until ask is answered (an approval
  // returns the reservation, a rejection throws), expires, or the
  // approval wait runs out (both throw the ApprovalRequiredError).
  private async awaitApproval(req: ReserveRequest, e: Effect, ask: ApprovalRequiredError): Promise<Reservation> {
    let until = Date.now() + (e.approvalWaitMs ?? this.opts.approvalWaitMs);
    if (ask.expiresAt > 0) until = Math.min(until, ask.expiresAt);
    let poll = !req.waitMs; // the ledger did not wait for the answer
    for (;;) {
      if (poll) await sleep(Math.max(0, Math.min(this.opts.pollIntervalMs, until - Date.now())), e.signal);
      if (Date.now() >= until) throw ask.expiresAt > 0 && Date.now() >= ask.expiresAt ? ask.asExpired() : ask;
      const start = Date.now();
      try {
        return await this.reserveWaiting(req, { ...e, maxWaitMs: until - Date.now() });
      } catch (err) {
        if (!(err instanceof ApprovalRequiredError)) throw err;
        if (err.seq !== ask.seq) throw err.asExpired(); // the ask expired and the ledger asked again
        ask = err;
        poll = !req.waitMs || Date.now() - start < req.waitMs / 2;
      }
    }
  }

  /**
   * Returns the namespace's derivation key (GET /v1/derivation-key, a
   * writer or admin token): asked of the ledger the first time and kept
   * for the client's life, so a namespace that switches to committed
   * derives dk2_ keys from the client's next start. A failed request is
   * not kept: the next call asks again. A ledgerd before v1.4 (404
   * not_found) has inline namespaces only.
   */
  derivationKey(signal?: AbortSignal): Promise<DerivationKey> {
    if (!this.derivation) {
      this.derivation = this.fetchDerivationKey(signal);
      this.derivation.catch(() => {
        this.derivation = undefined;
      });
    }
    return this.derivation;
  }

  private async fetchDerivationKey(signal?: AbortSignal): Promise<DerivationKey> {
    let b: { payloads?: unknown; key?: unknown };
    try {
      b = (await this.http.send("GET", "/v1/derivation-key", undefined, { signal, retrySent: true })).body ?? {};
    } catch (err) {
      if (err instanceof NotFoundError) return { payloads: "inline", key: new Uint8Array() };
      throw err;
    }
    if (b.payloads !== "inline" && b.payloads !== "committed") {
      throw new Error(`derivation key: unknown payload mode ${JSON.stringify(b.payloads)}`);
    }
    if (typeof b.key !== "string" || !/^[0-9a-f]{64}$/i.test(b.key)) {
      throw new Error("derivation key: not 32 hex-encoded bytes");
    }
    return { payloads: b.payloads, key: new Uint8Array(Buffer.from(b.key, "hex")) };
  }

  /**
   * The reserve request do() makes for e: its key (derived from tool and
   * input when none is given, with the namespace's derivation key for a
   * call the ledger records), fingerprint or input, and a fresh execution
   * id when e has none.
   */
  async reserveRequest(e: Effect): Promise<ReserveRequest> {
    if (!["none", "read", "write", "destructive", "external"].includes(e.effect)) {
      throw new TypeError(`effect ${e.tool}: unknown class ${JSON.stringify(e.effect)}`);
    }
    if (!e.tool) throw new TypeError("effect: empty tool");
    if (e.sendInput && (e.inputHash || e.input === undefined)) {
      throw new TypeError(`effect ${e.tool}: sendInput needs input and no inputHash`);
    }
    let key = e.key;
    if (!key) {
      if (e.input === undefined) {
        // Every call of the tool would be one effect.
        throw new TypeError(`effect ${e.tool}: no key, and no input to derive one from`);
      }
      if (e.effect === "none" || e.effect === "read") {
        key = deriveKey(e.tool, e.input);
      } else {
        const dk = await this.derivationKey(e.signal);
        key = dk.payloads === "committed" ? await deriveKeyWith(dk.key, e.tool, e.input) : deriveKey(e.tool, e.input);
      }
    }
    return {
      key,
      executionId: e.executionId || "exec-" + randomBytes(16).toString("hex"),
      attempt: e.attempt ?? 1,
      tool: e.tool,
      effect: e.effect,
      idempotent: e.idempotent ?? false,
      inputHash: e.sendInput ? undefined : e.inputHash || (e.input === undefined ? undefined : fingerprint(e.input)),
      input: e.sendInput ? e.input : undefined,
      approvalSummary: e.approvalSummary,
      changed: e.changed,
      subjects: e.subjects,
      leaseMs: e.leaseMs,
    };
  }

  // reserveWaiting reserves req, waiting while another attempt holds the
  // key: on the server with wait_ms, then by polling no longer apart than
  // Retry-After and pollIntervalMs, until the wait runs out.
  private async reserveWaiting(req: ReserveRequest, e: Effect): Promise<Reservation> {
    const until = Date.now() + (e.maxWaitMs ?? this.opts.maxWaitMs);
    let autoAttempt = e.attempt === undefined;
    let lost = 0; // reserves whose answer was lost
    for (;;) {
      const left = until - Date.now();
      req.waitMs = this.serverWaits ? Math.floor(Math.max(0, Math.min(this.opts.waitMs, left - waitMargin(left)))) : 0;
      const start = Date.now();
      try {
        return await this.reserve(req, e.signal);
      } catch (err) {
        if (err instanceof InProgressError) {
          const remaining = until - Date.now();
          if (remaining <= 0) throw err;
          if (req.waitMs > 0 && Date.now() - start >= req.waitMs / 2) continue; // the server waited: ask again
          const d = Math.min(err.retryAfterMs || this.opts.pollIntervalMs, this.opts.pollIntervalMs, remaining);
          await sleep(d, e.signal).catch(() => {
            throw err;
          });
        } else if (err instanceof InvalidRequestError && err.details.field === "wait_ms" && req.waitMs > 0) {
          this.serverWaits = false; // a ledger without wait_ms (contract §8): poll instead
        } else if (autoAttempt && err instanceof AttemptConflictError && recordedAttempt(err) >= (req.attempt ?? 1)) {
          req.attempt = recordedAttempt(err) + 1;
          autoAttempt = false; // once: a second conflict is a real one
        } else if (!(err instanceof LedgerError) && !isAbort(err) && !unsent(err) && lost < this.http.maxRetries) {
          // The reserve may have been recorded and its answer lost: the
          // same attempt again would conflict with it, so this is the next
          // attempt. If the lost one did reserve, this one waits for its
          // lease to end.
          req.attempt = (req.attempt ?? 1) + 1;
          await this.http.pause(lost++, err, e.signal);
        } else {
          throw err;
        }
      }
    }
  }

  private async recordFailure(rsv: Reservation, err: unknown): Promise<never> {
    if (!(err instanceof EffectFailure) && (err instanceof OutcomeUnknown || isAbort(err))) {
      throw new UnknownOutcomeError(rsv.key, rsv.reservation, err);
    }
    const failure = failureOf(err);
    if (err instanceof EffectFailure && err.outcome === "not_applied") {
      // Nothing was applied (SPEC §4.1): retryable is ignored, and the key
      // may be reserved again by the next call.
      const cr = await this.commitOrThrow(rsv, { outcome: "not_applied", error: { code: failure.code, message: failure.message } }, err);
      throw new EffectError(rsv.key, failure, cr.receipt, err, "not_applied");
    }
    const cr = await this.commitOrThrow(rsv, { outcome: "failed", error: failure }, err);
    throw new EffectError(rsv.key, failure, cr.receipt, err);
  }

  // commitOrThrow records cm, retrying for commitTimeoutMs even when the
  // caller's signal has ended (the effect has happened); a result the
  // ledger refuses (over 64 KiB) is dropped and the success recorded
  // without it.
  private async commitOrThrow(rsv: Reservation, cm: CommitRequest, effectErr: unknown): Promise<CommitResult & { resultDropped: boolean }> {
    const signal = AbortSignal.timeout(this.opts.commitTimeoutMs);
    try {
      try {
        return { ...(await this.commit(rsv.key, rsv.reservation, cm, signal)), resultDropped: false };
      } catch (err) {
        if (err instanceof InvalidRequestError && err.details.field === "result" && cm.result !== undefined) {
          cm = { ...cm, result: undefined };
          return { ...(await this.commit(rsv.key, rsv.reservation, cm, signal)), resultDropped: true };
        }
        throw err;
      }
    } catch (err) {
      if (err instanceof LedgerError && !(err.status >= 500 || err.status === 429)) throw err;
      throw new CommitError(rsv.key, rsv.reservation, cm, effectErr ?? err);
    }
  }
}

function failureOf(err: unknown): { code: string; message: string; retryable: boolean } {
  let code = "EFFECT_FAILED";
  let retryable = false;
  if (err instanceof EffectFailure) {
    retryable = err.retryable;
    if (/^[A-Z0-9_]{1,64}$/.test(err.code)) code = err.code;
  }
  const message = [...(err instanceof Error ? err.message : String(err))].slice(0, 1024).join("");
  return { code, message, retryable };
}

function recordedAttempt(e: LedgerError): number {
  const n = e.details.recorded_attempt;
  return typeof n === "number" && n >= 1 && Number.isSafeInteger(n) ? n : 0;
}

// waitMargin is kept between a server-side wait and the end of the
// caller's wait: a quarter of the time left, from 250 ms to 2 s.
function waitMargin(left: number): number {
  return Math.min(Math.max(left / 4, 250), 2_000);
}

function isAbort(err: unknown): boolean {
  return err instanceof Error && (err.name === "AbortError" || err.name === "TimeoutError");
}

function seqOf(seq: number): number {
  if (!Number.isSafeInteger(seq) || seq < 1) throw new RangeError(`approval seq ${seq} is not a positive integer`);
  return seq;
}
