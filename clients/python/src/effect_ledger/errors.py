"""Typed errors: one exception class per contract error code.

Every error the ledger answers with (``{"error": {"code", "message",
"details"}}``) is raised as the subclass of ``LedgerError`` registered for
its code, so callers branch with ``except`` instead of comparing strings::

    try:
        ledger.do(effect, run)
    except FingerprintMismatchError as err:
        log.error("key reused for another call: %s", err.details)

A code this client does not know is raised as ``LedgerError`` itself.
``EffectFailed`` is different: it is raised by *your* code to report a
failed effect with a chosen error code, and is committed as a failure;
its subclass ``EffectNotApplied`` reports a failure known to have applied
nothing, committed as ``not_applied``.
"""

from __future__ import annotations

import datetime
import re
from typing import Any, Mapping, Optional

__all__ = [
    "LedgerError",
    "InvalidJSONError",
    "InvalidRequestError",
    "InvalidKeyError",
    "BodyTooLargeError",
    "UnsupportedMediaTypeError",
    "NotFoundError",
    "MethodNotAllowedError",
    "UnavailableError",
    "UnauthorizedError",
    "ForbiddenError",
    "RateLimitedError",
    "InternalError",
    "FingerprintMismatchError",
    "InProgressError",
    "UnsafeResumeError",
    "RetryNotAllowedError",
    "AttemptConflictError",
    "UnknownKeyError",
    "StaleReservationError",
    "AlreadyFinalizedError",
    "NotInterruptedError",
    "UnknownReceiptError",
    "UnknownNamespaceError",
    "NamespaceExistsError",
    "NamespaceLimitError",
    "NotCheckpointedError",
    "KeyRequiredError",
    "EffectClassMismatchError",
    "DeniedByPolicyError",
    "ApprovalRejectedError",
    "UnchangedRetryError",
    "AlreadyAnsweredError",
    "ApprovalExpiredError",
    "SelfApprovalError",
    "UnknownApprovalError",
    "ReconcileNotAllowedError",
    "ReconcileTooEarlyError",
    "ApprovalRequiredError",
    "ConnectionFailedError",
    "BadResponseError",
    "EffectFailed",
    "EffectNotApplied",
    "error_for",
]


class LedgerError(Exception):
    """An error answered by the ledger (or met while talking to it).

    Attributes:
        code: the contract's error code, e.g. ``"fingerprint_mismatch"``;
            ``"connection_failed"`` and ``"bad_response"`` are the client's own.
        message: the server's human-readable message.
        details: the error's ``details`` object (may be empty).
        status: the HTTP status, or ``None`` when no response arrived.
        retry_after: the ``Retry-After`` header in seconds, if any.
    """

    #: The contract error code this class stands for (``None`` on the base).
    code_name: Optional[str] = None

    def __init__(
        self,
        code: str,
        message: str,
        details: Optional[Mapping[str, Any]] = None,
        status: Optional[int] = None,
        retry_after: Optional[float] = None,
    ) -> None:
        super().__init__("%s: %s" % (code, message))
        self.code = code
        self.message = message
        self.details: dict[str, Any] = dict(details or {})
        self.status = status
        self.retry_after = retry_after

    def __repr__(self) -> str:
        return "%s(code=%r, message=%r, status=%r)" % (type(self).__name__, self.code, self.message, self.status)


class InvalidJSONError(LedgerError):
    """400: the request body is not valid JSON."""

    code_name = "invalid_json"


class InvalidRequestError(LedgerError):
    """400: a field is missing, of the wrong type, out of range or unknown; details name the field."""

    code_name = "invalid_request"


class InvalidKeyError(LedgerError):
    """400: the idempotency key is not 8-255 bytes of 0x21-0x7E, or starts with gen_."""

    code_name = "invalid_key"


class BodyTooLargeError(LedgerError):
    """413: the request body is over 1 MiB."""

    code_name = "body_too_large"


class UnsupportedMediaTypeError(LedgerError):
    """415: the request body is not JSON."""

    code_name = "unsupported_media_type"


class NotFoundError(LedgerError):
    """404: no such route."""

    code_name = "not_found"


class MethodNotAllowedError(LedgerError):
    """405: the route does not take this method."""

    code_name = "method_not_allowed"


class UnavailableError(LedgerError):
    """503: the ledger cannot record now (overloaded, disk trouble); retry after retry_after."""

    code_name = "unavailable"


class UnauthorizedError(LedgerError):
    """401: the bearer token is missing or not valid."""

    code_name = "unauthorized"


class ForbiddenError(LedgerError):
    """403: the token's role or namespaces do not allow this."""

    code_name = "forbidden"


class RateLimitedError(LedgerError):
    """429: the token is over its request rate; retry after retry_after."""

    code_name = "rate_limited"


class InternalError(LedgerError):
    """500: the ledger failed internally."""

    code_name = "internal"


class FingerprintMismatchError(LedgerError):
    """422: the key was first reserved for another tool, effect or input; details carry the stored
    ``tool``, ``effect`` and ``input_hash``."""

    code_name = "fingerprint_mismatch"


class InProgressError(LedgerError):
    """409: another reservation of the key is running (still, after waiting);
    ``details["lease_expires_at"]`` says until when at most, ``retry_after`` in how many seconds."""

    code_name = "in_progress"


class UnsafeResumeError(LedgerError):
    """409: the key's earlier run was interrupted (its lease ended without a commit) and its handler
    is not idempotent: a person must resolve it; details name the interrupted reservation."""

    code_name = "unsafe_resume"


class RetryNotAllowedError(LedgerError):
    """409: the key failed and may not run again (the failure was not retryable, or the handler is
    not idempotent); details carry the recorded failure."""

    code_name = "retry_not_allowed"


class AttemptConflictError(LedgerError):
    """409: this execution already used this attempt number (or a higher one) on the key."""

    code_name = "attempt_conflict"


class UnknownKeyError(LedgerError):
    """404: no such idempotency key."""

    code_name = "unknown_key"


class StaleReservationError(LedgerError):
    """409: the reservation is not the key's latest one."""

    code_name = "stale_reservation"


class AlreadyFinalizedError(LedgerError):
    """409: the reservation was already committed with other values, or the key was resolved."""

    code_name = "already_finalized"


class NotInterruptedError(LedgerError):
    """409: only an interrupted key can be resolved."""

    code_name = "not_interrupted"


class UnknownReceiptError(LedgerError):
    """404: no receipt with this seq."""

    code_name = "unknown_receipt"


class UnknownNamespaceError(LedgerError):
    """404: no such namespace."""

    code_name = "unknown_namespace"


class NamespaceExistsError(LedgerError):
    """409: the namespace exists already."""

    code_name = "namespace_exists"


class NamespaceLimitError(LedgerError):
    """507: the server holds as many namespaces as it allows."""

    code_name = "namespace_limit"


class NotCheckpointedError(LedgerError):
    """404: no checkpoint covers the receipt yet."""

    code_name = "not_checkpointed"


class KeyRequiredError(LedgerError):
    """400: the namespace's policy gates the tool, and a gated call must bring its own
    idempotency key (a generated one could never be presented again)."""

    code_name = "key_required"


class EffectClassMismatchError(LedgerError):
    """422: the policy gates the tool, but the call declares effect ``none`` or ``read``."""

    code_name = "effect_class_mismatch"


class DeniedByPolicyError(LedgerError):
    """403: a ``deny`` rule of the namespace's policy matches the tool; ``details["rule"]`` is the
    rule's index, ``details["tool"]`` its glob. Nothing ran."""

    code_name = "denied_by_policy"


class ApprovalRejectedError(LedgerError):
    """409: an approver rejected this call (SPEC §13); ``approval`` is the answer
    (``{"seq", "ask_seq", "note", "actor"}``). Nothing ran, and the same call is refused again."""

    code_name = "approval_rejected"

    @property
    def approval(self) -> dict:
        """The rejecting answer: ``seq``, ``ask_seq``, ``note``, ``actor``."""
        a = self.details.get("approval")
        return dict(a) if isinstance(a, dict) else {}


class UnchangedRetryError(LedgerError):
    """409: the same call (tool and input) failed recently and this retry changes nothing; pass
    ``changed=`` to say what differs. ``details["failed"]`` names the failed attempt."""

    code_name = "unchanged_retry"


class AlreadyAnsweredError(LedgerError):
    """409: the ask was answered with the other decision."""

    code_name = "already_answered"


class ApprovalExpiredError(LedgerError):
    """410: the ask expired before it was answered."""

    code_name = "approval_expired"


class SelfApprovalError(LedgerError):
    """403: the approver is who asked, and the policy denies self-approval."""

    code_name = "self_approval"


class UnknownApprovalError(LedgerError):
    """404: no ask at that seq."""

    code_name = "unknown_approval"


class ReconcileNotAllowedError(LedgerError):
    """403: no rule of the namespace's policy allows reconciling the tool, or
    the interrupted reserve is another actor's (SPEC §15)."""

    code_name = "reconcile_not_allowed"


class ReconcileTooEarlyError(LedgerError):
    """409: a ``not_applied`` reconcile before the lease's end plus the
    rule's ``settle_ms`` (the original call may still land);
    ``details["not_before"]`` (unix ms) and ``retry_after`` say when."""

    code_name = "reconcile_too_early"


_BY_CODE: dict[str, type[LedgerError]] = {
    c.code_name: c for c in LedgerError.__subclasses__() if c.code_name is not None
}


class ConnectionFailedError(LedgerError):
    """The ledger could not be reached, or the connection broke before an
    answer arrived (after the client's retries). ``__cause__`` holds the
    transport error. Code ``connection_failed``, status ``None``."""

    code_name = "connection_failed"


class BadResponseError(LedgerError):
    """The answer was not the contract's: not JSON, or an error without the
    ``{"error": {...}}`` shape (e.g. a proxy's HTML page). Code
    ``bad_response``; ``status`` is the HTTP status."""

    code_name = "bad_response"


class ApprovalRequiredError(LedgerError):
    """The namespace's policy sends the call to a person (202 ``approval_required``, SPEC §13):
    the ledger recorded an ask and nothing ran. An approver answers it (``ledgerctl approvals
    approve SEQ``, the web page, ``Ledger.answer``); the same call made again then runs once,
    or raises ``ApprovalRejectedError``. With ``approval_wait`` the client waits for the answer
    first.

    Attributes:
        key: the idempotency key.
        seq: the ask's receipt seq: what the approver answers.
        expires_at: unix milliseconds when the ask expires unanswered.
        state: ``"pending"``.
        receipt: the ask's receipt.
        expired: a wait ended because the ask expired (``seq`` is then the
            new ask when the ledger asked again).
        url: the ledger's web page where a person answers the ask,
            ``<base_url>/ui/#approvals/<seq>`` (as ledger-mcp names it);
            ``""`` when the base URL is not known.

    The message names the ask, its expiry and the page.
    """

    code_name = "approval_required"

    def __init__(
        self,
        key: str,
        seq: int,
        expires_at: int,
        state: str = "pending",
        receipt: Any = None,
        expired: bool = False,
        url: str = "",
        answer: str = "",
    ) -> None:
        msg = "effect %s awaits approval: ask %d" % (key, seq)
        if expires_at:
            msg += ", expires " + _rfc3339(expires_at)
        if url:
            msg += "; a person approves or rejects it at " + url
            if answer:
                msg += " (or: %s)" % answer
        if expired:
            msg += " (the awaited ask expired)"
        super().__init__("approval_required", msg, {"seq": seq, "expires_at": expires_at, "url": url}, status=202)
        self.key = key
        self.seq = seq
        self.expires_at = expires_at
        self.state = state
        self.receipt = receipt
        self.expired = expired
        self.url = url
        self.answer = answer  # the ledgerctl command that answers the ask


def approval_page_url(base_url: str, seq: int) -> str:
    """The page of the ledger at base_url where a person answers the ask at
    seq: ``<base_url>/ui/#approvals/<seq>``, the URL ledger-mcp names."""
    return "%s/ui/#approvals/%d" % (base_url.rstrip("/"), seq)


def _rfc3339(ms: int) -> str:
    """Unix milliseconds as an RFC 3339 UTC time to the second."""
    return datetime.datetime.fromtimestamp(ms // 1000, tz=datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def error_for(
    code: str,
    message: str,
    details: Optional[Mapping[str, Any]] = None,
    status: Optional[int] = None,
    retry_after: Optional[float] = None,
) -> LedgerError:
    """Return the typed error for a contract error code (``LedgerError`` for
    an unknown code)."""
    cls = _BY_CODE.get(code, LedgerError)
    return cls(code, message, details, status, retry_after)


_CODE_RE = re.compile(r"^[A-Z0-9_]{1,64}$")


class EffectFailed(Exception):
    """Raise this from an effect's body to record a failure with your own
    error code; the client commits it (``outcome: failed``) and re-raises it.

    Args:
        code: 1-64 characters of ``A-Z``, ``0-9`` and ``_`` (e.g. ``"CARD_DECLINED"``).
        message: up to 1024 characters.
        retryable: the failure is transient; together with an idempotent
            handler it allows a later retry of the same key.
    """

    #: The outcome this exception is committed as.
    outcome = "failed"

    def __init__(self, code: str, message: str = "", retryable: bool = False) -> None:
        if not _CODE_RE.match(code):
            raise ValueError(
                "%s: code must be 1-64 characters of A-Z, 0-9 and _, got %r" % (type(self).__name__, code)
            )
        super().__init__("%s: %s" % (code, message) if message else code)
        self.code = code
        self.message = message
        self.retryable = retryable


class EffectNotApplied(EffectFailed):
    """Raise this from an effect's body when the effect is known to have
    applied *nothing*: the input was invalid, the target was not found, the
    downstream declined before acting (SPEC §4.1). The client commits it as
    ``outcome: not_applied`` with your code and re-raises it.

    Unlike a failure, a ``not_applied`` key may be reserved again by any
    call, so the next call of the same effect runs the body again (with
    corrected data, or once the target exists). Use ``EffectFailed`` when
    the effect may have left something behind. It is a subclass of
    ``EffectFailed``, so ``except EffectFailed`` catches it too; ``retryable``
    is always False (the ledger ignores it for ``not_applied``).

    The Go client's ``client.NotApplied(code, err)``, the TypeScript
    client's ``notApplied(code, cause)``.

    Args:
        code: 1-64 characters of ``A-Z``, ``0-9`` and ``_`` (e.g. ``"ORDER_NOT_FOUND"``).
        message: up to 1024 characters.
    """

    outcome = "not_applied"

    def __init__(self, code: str, message: str = "") -> None:
        super().__init__(code, message, retryable=False)
