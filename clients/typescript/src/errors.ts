// Errors: one class per error code of the ledger's contract, and the
// errors of do() that say what happened to the effect.

/** A receipt of the chain: its sequence number and hash. */
export interface ReceiptRef {
  seq: number;
  hash: string;
}

/**
 * An error answer of the ledger, `{"error": {"code", "message", "details"}}`,
 * with its HTTP status. Each contract code has a subclass
 * (`InProgressError`, `UnsafeResumeError`, …); `LedgerError.code` holds
 * the code either way.
 */
export class LedgerError extends Error {
  override name = "LedgerError";
  /** The HTTP status. */
  readonly status: number;
  /** The contract's error code, e.g. "fingerprint_mismatch". */
  readonly code: string;
  /** The answer's details (field, lease_expires_at, recorded_attempt, …). */
  readonly details: Record<string, unknown>;
  /** The answer's Retry-After in milliseconds, 0 when it had none. */
  readonly retryAfterMs: number;

  constructor(status: number, code: string, message: string, details: Record<string, unknown> = {}, retryAfterMs = 0) {
    super(`ledger: ${status} ${code}: ${message}`);
    this.status = status;
    this.code = code;
    this.details = details;
    this.retryAfterMs = retryAfterMs;
  }
}

/** The key was first used with another tool, effect class or input. */
export class FingerprintMismatchError extends LedgerError {
  override name = "FingerprintMismatchError";
}

/** Another attempt holds the key's reservation (also after waiting). */
export class InProgressError extends LedgerError {
  override name = "InProgressError";
}

/** The key was interrupted and the effect is not idempotent: a person must resolve it. */
export class UnsafeResumeError extends LedgerError {
  override name = "UnsafeResumeError";
}

/** The key failed, and the failure was not retryable or the effect is not idempotent. */
export class RetryNotAllowedError extends LedgerError {
  override name = "RetryNotAllowedError";
}

/** The attempt is not after the execution's recorded one (details.recorded_attempt). */
export class AttemptConflictError extends LedgerError {
  override name = "AttemptConflictError";
}

/** No such key. */
export class UnknownKeyError extends LedgerError {
  override name = "UnknownKeyError";
}

/** Another reservation took the key over. */
export class StaleReservationError extends LedgerError {
  override name = "StaleReservationError";
}

/** The key already has an outcome. */
export class AlreadyFinalizedError extends LedgerError {
  override name = "AlreadyFinalizedError";
}

/** The key is not interrupted (resolve). */
export class NotInterruptedError extends LedgerError {
  override name = "NotInterruptedError";
}

/** No rule of the namespace's policy allows reconciling the tool, or the interrupted reserve is another actor's (SPEC §15). */
export class ReconcileNotAllowedError extends LedgerError {
  override name = "ReconcileNotAllowedError";
}

/** A not_applied reconcile before the lease's end plus settle_ms (details.not_before; retryAfterMs says when). */
export class ReconcileTooEarlyError extends LedgerError {
  override name = "ReconcileTooEarlyError";
}

/** No such receipt. */
export class UnknownReceiptError extends LedgerError {
  override name = "UnknownReceiptError";
}

/** The request body is not JSON. */
export class InvalidJSONError extends LedgerError {
  override name = "InvalidJSONError";
}

/** A field is missing or invalid (details.field). */
export class InvalidRequestError extends LedgerError {
  override name = "InvalidRequestError";
}

/** The idempotency key is not 8–255 bytes of visible ASCII, or uses the reserved gen_ prefix. */
export class InvalidKeyError extends LedgerError {
  override name = "InvalidKeyError";
}

/** The request body is too large. */
export class BodyTooLargeError extends LedgerError {
  override name = "BodyTooLargeError";
}

/** The request body is not application/json. */
export class UnsupportedMediaTypeError extends LedgerError {
  override name = "UnsupportedMediaTypeError";
}

/** No such route. */
export class NotFoundError extends LedgerError {
  override name = "NotFoundError";
}

/** The route does not take this method. */
export class MethodNotAllowedError extends LedgerError {
  override name = "MethodNotAllowedError";
}

/** 503: nothing was recorded; do() retries it. */
export class UnavailableError extends LedgerError {
  override name = "UnavailableError";
}

/** 401: no token, or an unknown one. */
export class UnauthorizedError extends LedgerError {
  override name = "UnauthorizedError";
}

/** 403: the token's role or namespaces do not allow the call. */
export class ForbiddenError extends LedgerError {
  override name = "ForbiddenError";
}

/** 429: over the rate limit; do() retries it after Retry-After. */
export class RateLimitedError extends LedgerError {
  override name = "RateLimitedError";
}

/** 500: the ledger failed. */
export class InternalError extends LedgerError {
  override name = "InternalError";
}

/** No such namespace. */
export class UnknownNamespaceError extends LedgerError {
  override name = "UnknownNamespaceError";
}

/** The namespace exists already. */
export class NamespaceExistsError extends LedgerError {
  override name = "NamespaceExistsError";
}

/** 507: the server holds as many namespaces as it allows (ledgerd --max-namespaces). */
export class NamespaceLimitError extends LedgerError {
  override name = "NamespaceLimitError";
}

/** 431: the request's headers are over 64 KiB. */
export class HeadersTooLargeError extends LedgerError {
  override name = "HeadersTooLargeError";
}

/** 501: a transfer encoding the ledger does not support. */
export class NotImplementedError extends LedgerError {
  override name = "NotImplementedError";
}

/** 400: the namespace's policy gates the tool, and a gated call must bring its own idempotency key. */
export class KeyRequiredError extends LedgerError {
  override name = "KeyRequiredError";
}

/** 422: the policy gates the tool, but the call declares effect "none" or "read". */
export class EffectClassMismatchError extends LedgerError {
  override name = "EffectClassMismatchError";
}

/** 403: a deny rule of the namespace's policy matches the tool (details.rule, details.tool); nothing ran. */
export class DeniedByPolicyError extends LedgerError {
  override name = "DeniedByPolicyError";
}

/** 409: an approver rejected the call (SPEC §13); nothing ran, and the same call is refused again. */
export class ApprovalRejectedError extends LedgerError {
  override name = "ApprovalRejectedError";
  /** The rejecting answer: its receipt seq, the ask's seq, the approver's note and actor. */
  get approval(): { seq?: number; ask_seq?: number; note?: string; actor?: string } {
    const a = this.details.approval;
    return a && typeof a === "object" ? (a as Record<string, any>) : {};
  }
}

/** 409: the same call failed recently and this retry changes nothing: say what changed with Effect.changed. */
export class UnchangedRetryError extends LedgerError {
  override name = "UnchangedRetryError";
}

/** 409: the ask was answered with the other decision. */
export class AlreadyAnsweredError extends LedgerError {
  override name = "AlreadyAnsweredError";
}

/** 410: the ask expired before it was answered. */
export class ApprovalExpiredError extends LedgerError {
  override name = "ApprovalExpiredError";
}

/** 403: the approver is who asked, and the policy denies self-approval. */
export class SelfApprovalError extends LedgerError {
  override name = "SelfApprovalError";
}

/** 404: no ask at that seq. */
export class UnknownApprovalError extends LedgerError {
  override name = "UnknownApprovalError";
}

/**
 * The namespace's policy sends the call to a person (202
 * approval_required, SPEC §13): the ledger recorded an ask and nothing
 * ran. An approver answers it (ledgerctl approvals approve SEQ, the web
 * page, Client.answer); the same call made again then runs once, or
 * throws ApprovalRejectedError. With approvalWaitMs, do() waits for the
 * answer first.
 */
export class ApprovalRequiredError extends LedgerError {
  override name = "ApprovalRequiredError";
  constructor(
    /** The idempotency key. */
    readonly key: string,
    /** The ask's receipt seq: what the approver answers. */
    readonly seq: number,
    /** Unix milliseconds when the ask expires unanswered. */
    readonly expiresAt: number,
    /** "pending". */
    readonly state: string,
    /** The ask's receipt. */
    readonly receipt: ReceiptRef,
    /** A wait ended because the ask expired (seq is then the new ask when the ledger asked again). */
    readonly expired = false,
    /**
     * The ledger's web page where a person answers the ask,
     * `<baseURL>/ui/#approvals/<seq>` (as ledger-mcp names it); "" when
     * the base URL is not known.
     */
    readonly url = "",
    /** The ledgerctl command that answers the ask (named in the message beside url). */
    readonly answer = "",
  ) {
    super(202, "approval_required", approvalMessage(key, seq, expiresAt, url, answer, expired), { seq, expires_at: expiresAt, url });
  }

  /** This ask, marked expired. */
  asExpired(): ApprovalRequiredError {
    return new ApprovalRequiredError(this.key, this.seq, this.expiresAt, this.state, this.receipt, true, this.url, this.answer);
  }
}

/** The page of the ledger at baseURL where a person answers the ask at seq: the URL ledger-mcp names. */
export function approvalPageURL(baseURL: string, seq: number): string {
  return `${baseURL.replace(/\/+$/, "")}/ui/#approvals/${seq}`;
}

/** An ApprovalRequiredError's message: the ask, its expiry and the page. */
function approvalMessage(key: string, seq: number, expiresAt: number, url: string, answer: string, expired: boolean): string {
  let msg = `effect ${key} awaits approval: ask ${seq}`;
  if (expiresAt > 0) msg += `, expires ${new Date(Math.floor(expiresAt / 1000) * 1000).toISOString().replace(".000Z", "Z")}`;
  if (url) msg += `; a person approves or rejects it at ${url}${answer ? ` (or: ${answer})` : ""}`;
  if (expired) msg += " (the awaited ask expired)";
  return msg;
}

const errorClasses = new Map<string, typeof LedgerError>([
  ["fingerprint_mismatch", FingerprintMismatchError],
  ["in_progress", InProgressError],
  ["unsafe_resume", UnsafeResumeError],
  ["retry_not_allowed", RetryNotAllowedError],
  ["attempt_conflict", AttemptConflictError],
  ["unknown_key", UnknownKeyError],
  ["stale_reservation", StaleReservationError],
  ["already_finalized", AlreadyFinalizedError],
  ["not_interrupted", NotInterruptedError],
  ["unknown_receipt", UnknownReceiptError],
  ["invalid_json", InvalidJSONError],
  ["invalid_request", InvalidRequestError],
  ["invalid_key", InvalidKeyError],
  ["body_too_large", BodyTooLargeError],
  ["unsupported_media_type", UnsupportedMediaTypeError],
  ["not_found", NotFoundError],
  ["method_not_allowed", MethodNotAllowedError],
  ["unavailable", UnavailableError],
  ["unauthorized", UnauthorizedError],
  ["forbidden", ForbiddenError],
  ["rate_limited", RateLimitedError],
  ["internal", InternalError],
  ["unknown_namespace", UnknownNamespaceError],
  ["namespace_exists", NamespaceExistsError],
  ["namespace_limit", NamespaceLimitError],
  ["headers_too_large", HeadersTooLargeError],
  ["not_implemented", NotImplementedError],
  ["key_required", KeyRequiredError],
  ["effect_class_mismatch", EffectClassMismatchError],
  ["denied_by_policy", DeniedByPolicyError],
  ["approval_rejected", ApprovalRejectedError],
  ["unchanged_retry", UnchangedRetryError],
  ["already_answered", AlreadyAnsweredError],
  ["approval_expired", ApprovalExpiredError],
  ["self_approval", SelfApprovalError],
  ["unknown_approval", UnknownApprovalError],
  ["reconcile_not_allowed", ReconcileNotAllowedError],
  ["reconcile_too_early", ReconcileTooEarlyError],
]);

/** Returns the LedgerError (of the code's class) for an error answer. */
export function ledgerError(status: number, code: string, message: string, details: Record<string, unknown>, retryAfterMs: number): LedgerError {
  const cls = errorClasses.get(code) ?? LedgerError;
  return new cls(status, code, message, details, retryAfterMs);
}

/** An outcome that commit and resolve record (contract §4, §4.1). */
export type CommitOutcome = "succeeded" | "failed" | "not_applied";

/**
 * Thrown by an effect function to record a failure with a code: use
 * {@link retryable}, {@link permanent} and {@link notApplied}. Any other
 * error is recorded as EFFECT_FAILED, not retryable.
 */
export class EffectFailure extends Error {
  override name = "EffectFailure";
  /** The failure's code: 1–64 of A–Z 0–9 _. */
  readonly code: string;
  /** Whether a later attempt of an idempotent effect may run again. */
  readonly retryable: boolean;
  /**
   * What is recorded: "failed", or "not_applied" for a failure known to
   * have applied nothing (see {@link notApplied}).
   */
  readonly outcome: "failed" | "not_applied";

  constructor(code: string, message: string, retryable: boolean, options?: { cause?: unknown; outcome?: "failed" | "not_applied" }) {
    super(message, options);
    this.code = code;
    this.outcome = options?.outcome ?? "failed";
    this.retryable = this.outcome === "failed" && retryable;
  }
}

/** A failure that a later attempt of an idempotent effect may retry. */
export function retryable(code: string, cause?: unknown): EffectFailure {
  return new EffectFailure(code, messageOf(cause, code), true, { cause });
}

/** A failure that no later attempt may retry. */
export function permanent(code: string, cause?: unknown): EffectFailure {
  return new EffectFailure(code, messageOf(cause, code), false, { cause });
}

/**
 * A failure known to have applied nothing — invalid input, "not found", a
 * refusal by the downstream before it acted (contract §4.1). It is
 * recorded as outcome "not_applied", and the next call of the same effect
 * (any execution) runs it again, idempotent or not. Use {@link permanent}
 * or {@link retryable} when the effect may have left something behind.
 * The Go client's `client.NotApplied(code, err)`.
 */
export function notApplied(code: string, cause?: unknown): EffectFailure {
  return new EffectFailure(code, messageOf(cause, code), false, { cause, outcome: "not_applied" });
}

function messageOf(cause: unknown, fallback: string): string {
  if (cause instanceof Error) return cause.message;
  if (typeof cause === "string") return cause;
  return fallback;
}

/**
 * Thrown by an effect function when the effect may have happened (a
 * timeout after sending, say): nothing is recorded and the key becomes
 * interrupted when its lease ends. An AbortError counts the same.
 */
export class OutcomeUnknown extends Error {
  override name = "OutcomeUnknown";
}

/**
 * do() recorded the effect function's failure; `cause` is what it threw.
 * `outcome` is "not_applied" when it threw {@link notApplied}: the next
 * call of the same effect runs it again.
 */
export class EffectError extends Error {
  override name = "EffectError";
  constructor(
    readonly key: string,
    readonly failure: { code: string; message: string; retryable: boolean },
    readonly receipt: ReceiptRef,
    cause: unknown,
    readonly outcome: "failed" | "not_applied" = "failed",
  ) {
    super(`effect ${key} ${outcome === "not_applied" ? "not applied" : "failed"}: ${failure.code}: ${failure.message}`, { cause });
  }
}

/**
 * The effect may have happened but nothing was recorded: the function
 * threw OutcomeUnknown or was aborted. The key becomes interrupted when
 * its lease ends; commit() with `reservation` records the outcome once
 * it is known.
 */
export class UnknownOutcomeError extends Error {
  override name = "UnknownOutcomeError";
  constructor(readonly key: string, readonly reservation: string, cause: unknown) {
    super(`effect ${key}: outcome unknown, nothing recorded`, { cause });
  }
}

/**
 * The effect ran but its outcome could not be recorded (the ledger was
 * unreachable for commitTimeoutMs): hand `key`, `reservation` and
 * `commit` to Client.commit later, from a retry queue.
 */
export class CommitError extends Error {
  override name = "CommitError";
  constructor(
    readonly key: string,
    readonly reservation: string,
    readonly commit: CommitRequest,
    cause: unknown,
  ) {
    super(`effect ${key} ran, but its outcome (${commit.outcome}) was not recorded`, { cause });
  }
}

/**
 * An outcome to record for a reservation. "failed" and "not_applied" need
 * `error.code`; "not_applied" takes no `externalRef` (nothing was
 * applied) and the ledger ignores its `retryable`.
 */
export interface CommitRequest {
  outcome: CommitOutcome;
  externalRef?: string;
  result?: unknown;
  error?: { code: string; message?: string; retryable?: boolean };
}
