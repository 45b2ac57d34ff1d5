"""Value types shared by the sync and async clients."""

from __future__ import annotations

import contextlib
import uuid
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, NamedTuple, Optional, Sequence, Tuple

from .canonical import derive_key

__all__ = [
    "EFFECT_CLASSES",
    "ReceiptRef",
    "Effect",
    "Outcome",
    "NotAppliedRef",
    "Changed",
    "ApprovalUse",
    "Reservation",
    "Replay",
    "NotRecorded",
    "Committed",
    "EffectResult",
    "DerivationKey",
    "execution",
    "current_execution",
]

#: The effect classes of the contract. ``none`` and ``read`` are not effects:
#: the high-level calls run them without touching the ledger.
EFFECT_CLASSES = ("none", "read", "write", "destructive", "external")
NOT_EFFECTS = ("none", "read")


class DerivationKey(NamedTuple):
    """What a namespace derives idempotency keys with (SPEC §14), from
    ``GET /v1/derivation-key``: ``payloads``, the payload mode in force
    (``"inline"`` or ``"committed"``), and ``key``, the namespace's
    fingerprint key (32 bytes; empty from a ledgerd before v1.4, whose
    namespaces are all inline). In a committed namespace derived keys are
    ``dk2_`` keys made with it, in an inline one ``dk_`` keys."""

    payloads: str
    key: bytes

    @property
    def committed(self) -> bool:
        return self.payloads == "committed"

    @classmethod
    def _from(cls, d: Any) -> "DerivationKey":
        payloads = d.get("payloads") if isinstance(d, dict) else None
        if payloads not in ("inline", "committed"):
            raise ValueError("derivation key: unknown payload mode %r" % (payloads,))
        try:
            key = bytes.fromhex(str(d.get("key", "")))
        except ValueError:
            key = b""
        if len(key) != 32:
            raise ValueError("derivation key: not 32 hex-encoded bytes")
        return cls(payloads=payloads, key=key)


@dataclass(frozen=True)
class ReceiptRef:
    """A receipt's position and chain hash, ``{"seq", "hash"}`` in the API."""

    seq: int
    hash: str

    @classmethod
    def _from(cls, d: Any) -> Optional["ReceiptRef"]:
        if not isinstance(d, dict):
            return None
        return cls(seq=int(d.get("seq", 0)), hash=str(d.get("hash", "")))


@dataclass(frozen=True)
class Effect:
    """What a call does, for ``Ledger.do`` and ``Ledger.reserve``.

    Attributes:
        tool: the tool or capability name (1-128 visible ASCII).
        effect: ``write``, ``destructive`` or ``external``; ``none`` and
            ``read`` are not recorded.
        idempotent: the handler dedupes downstream, so an interrupted or
            retryably failed run may be run again (takeover, retry).
        input: the call's input, any JSON value; the ledger fingerprints it
            so the key cannot be reused for another call.
        input_hash: instead of ``input``, a fingerprint you computed.
        key: the idempotency key. ``None`` (the default) derives a stable key
            from ``tool`` and ``input`` (see ``derive_key``); ``""`` asks the
            ledger for a unique generated key, which never deduplicates.
        execution_id: the execution (e.g. the model's tool-call id); default:
            the one set with ``execution(...)``, else a fresh random one.
        attempt: the runtime attempt within that execution (>= 1); default:
            the one set with ``execution(...)``, else 1.
        lease_ms: how long the reservation is held (10 .. 86,400,000 ms);
            default: the client's, else the ledger's (30 s).
        approval_summary: shown to the approver when the namespace's policy
            sends the call to approval: the requester's account of the call
            (at most 1024 bytes). A call sent to approval must carry
            ``input`` (the ledger keeps it off the chain for the approvers).
        changed: what this call changed since the same call failed (a
            ``Changed`` or a dict with ``context_hash``, ``component``,
            ``strategy``): a namespace's ``repeat_failure`` rule refuses an
            unchanged retry (``UnchangedRetryError``).
        subjects: opaque ids of the people the effect concerns (a customer
            id, a recipient id; never names or addresses themselves), at
            most 8 strings of 1-128 bytes: an erasure by subject (``POST
            /v1/ns/{ns}/erasures {"subject"}``) then removes the recorded
            values of this key (SPEC §14). The ledger keeps only their
            HMACs, never on the chain; the first reserve of a key's
            generation fixes them.
    """

    tool: str
    effect: str = "write"
    idempotent: bool = False
    input: Any = None
    input_hash: Optional[str] = None
    key: Optional[str] = None
    execution_id: Optional[str] = None
    attempt: Optional[int] = None
    lease_ms: Optional[int] = None
    approval_summary: Optional[str] = None
    changed: Any = None
    subjects: Optional[Sequence[str]] = None

    def resolved_key(self, derivation: Optional[DerivationKey] = None) -> str:
        """Return the key to reserve: ``key``, or the one derived in the
        namespace ``derivation`` describes (``dk2_`` when it commits its
        payloads; ``dk_`` when inline or None)."""
        if self.key is not None:
            return self.key
        if self.input is None:
            raise ValueError(
                "effect %r: pass key= or input= (a key derived from the tool alone would make every call "
                "one effect); pass key='' for a generated key that never deduplicates" % self.tool
            )
        key = derivation.key if derivation is not None and derivation.committed else None
        return derive_key(self.tool, self.input, key)

    @property
    def recorded(self) -> bool:
        """False for ``none`` and ``read``, which skip the ledger."""
        return self.effect not in NOT_EFFECTS


@dataclass(frozen=True)
class Outcome:
    """A successful effect's outcome, to return from the function given to
    ``do`` (or from a decorated function) when it has an external reference.
    Any other return value is recorded as the result itself."""

    result: Any = None
    external_ref: str = ""


@dataclass(frozen=True)
class Renewal:
    """The latest receipt of a key's previous generation: the key's outcome
    had expired (a namespace with a key lifetime, ``key_ttl_ms``), so the
    reserve started a new generation linked to it. ``recorded_at`` is unix
    milliseconds."""

    seq: int
    recorded_at: int

    @classmethod
    def _from(cls, d: Any) -> Optional["Renewal"]:
        if not isinstance(d, dict):
            return None
        return cls(seq=int(d.get("seq", 0)), recorded_at=int(d.get("recorded_at", 0)))


@dataclass(frozen=True)
class NotAppliedRef:
    """The ``not_applied`` outcome a reservation follows (SPEC §4.1): the
    key's last outcome applied nothing, so this reservation runs the effect
    again. ``seq`` is that commit's (or resolve's) receipt, ``error_code``
    its code."""

    seq: int
    error_code: str

    @classmethod
    def _from(cls, d: Any) -> Optional["NotAppliedRef"]:
        if not isinstance(d, dict):
            return None
        return cls(seq=int(d.get("seq", 0)), error_code=str(d.get("error_code", "")))


@dataclass(frozen=True)
class Changed:
    """What a retry of a failed call changed (the reserve's ``changed``,
    SPEC §13); members left ``None`` are not sent."""

    context_hash: Optional[str] = None
    component: Optional[str] = None
    strategy: Optional[str] = None

    def _json(self) -> dict:
        return {k: v for k, v in (("context_hash", self.context_hash), ("component", self.component),
                                   ("strategy", self.strategy)) if v is not None}


@dataclass(frozen=True)
class ApprovalUse:
    """The approval a reservation consumed (SPEC §13): ``seq`` is the
    approval receipt, ``ask_seq`` the ask it answered."""

    seq: int
    ask_seq: int

    @classmethod
    def _from(cls, d: Any) -> Optional["ApprovalUse"]:
        if not isinstance(d, dict) or "ask_seq" not in d:
            return None
        return cls(seq=int(d.get("seq", 0)), ask_seq=int(d.get("ask_seq", 0)))


@dataclass(frozen=True)
class Reservation:
    """A granted reservation (201): run the effect, then commit.

    ``reservation`` is the secret token that proves it; ``takeover`` is set
    when an interrupted earlier run was taken over (check downstream whether
    it already happened), ``retry`` when a retryable failure is retried,
    ``renewed`` when the key's earlier outcome had expired and this is a new
    effect under the same key, ``after_not_applied`` when the key's last
    outcome was ``not_applied`` and the effect runs again, ``approval`` when
    it consumed an approver's approval.
    """

    key: str
    key_generated: bool
    reservation: str
    attempt: int
    lease_expires_at: int
    takeover: bool
    retry: bool
    receipt: Optional[ReceiptRef]
    execution_id: str
    renewed: Optional[Renewal] = None
    after_not_applied: Optional[NotAppliedRef] = None
    approval: Optional[ApprovalUse] = None

    @classmethod
    def _from(cls, d: dict, execution_id: str) -> "Reservation":
        return cls(
            key=d["idempotency_key"],
            key_generated=bool(d.get("key_generated")),
            reservation=d["reservation"],
            attempt=int(d.get("attempt", 1)),
            lease_expires_at=int(d.get("lease_expires_at", 0)),
            takeover=bool(d.get("takeover")),
            retry=bool(d.get("retry")),
            receipt=ReceiptRef._from(d.get("receipt")),
            execution_id=execution_id,
            renewed=Renewal._from(d.get("renewed")),
            after_not_applied=NotAppliedRef._from(d.get("after_not_applied")),
            approval=ApprovalUse._from(d.get("approval")),
        )


@dataclass(frozen=True)
class Replay:
    """The key already succeeded (200 ``replayed``): the recorded outcome,
    returned instead of running the effect again. ``original`` is the
    success receipt, ``receipt`` the ``replay`` receipt just appended.
    ``erased`` names the recorded fields an erasure removed (SPEC §14):
    field (``result``, ``external_ref``, ...) -> the erase receipt's seq;
    an erased result is None, an erased external_ref ``""``; empty when
    nothing was erased."""

    key: str
    key_generated: bool
    outcome: str
    external_ref: str
    result: Any
    original: Optional[ReceiptRef]
    receipt: Optional[ReceiptRef]
    erased: Dict[str, int] = field(default_factory=dict)

    @classmethod
    def _from(cls, d: dict) -> "Replay":
        if "result_encoding" in d:
            # The ledger holds a result that is not JSON (a damaged or
            # edited record): never hand the marked text back as a result.
            from .errors import BadResponseError

            raise BadResponseError(
                "bad_response",
                "the recorded result of key %r is not valid JSON in the ledger (result_encoding=%s); "
                "the record is damaged: run ledgerctl verify" % (d.get("idempotency_key"), d.get("result_encoding")),
                details={"idempotency_key": d.get("idempotency_key"), "result_encoding": d.get("result_encoding")},
                status=200,
            )
        return cls(
            key=d["idempotency_key"],
            key_generated=bool(d.get("key_generated")),
            outcome=d.get("outcome", ""),
            external_ref=d.get("external_ref", "") or "",
            result=d.get("result"),
            original=ReceiptRef._from(d.get("original")),
            receipt=ReceiptRef._from(d.get("receipt")),
            erased=_erased(d.get("erased")),
        )


def _erased(v: Any) -> Dict[str, int]:
    """A body's ``erased`` object: field -> the erase receipt's seq."""
    if not isinstance(v, dict):
        return {}
    return {str(k): int(n) for k, n in v.items() if isinstance(n, int) and not isinstance(n, bool)}


@dataclass(frozen=True)
class NotRecorded:
    """The effect class is ``none`` or ``read`` (200 ``not_recorded``)."""

    key: str
    key_generated: bool


@dataclass(frozen=True)
class Committed:
    """An outcome recorded for a reservation. ``replayed`` is set when the
    same commit had already been recorded (a retried commit); ``late`` when
    it arrived after the lease ended."""

    key: str
    outcome: str
    late: bool
    receipt: Optional[ReceiptRef]
    replayed: bool

    @classmethod
    def _from(cls, d: dict, replayed: bool) -> "Committed":
        return cls(
            key=d.get("idempotency_key", ""),
            outcome=d.get("outcome", ""),
            late=bool(d.get("late")),
            receipt=ReceiptRef._from(d.get("receipt")),
            replayed=replayed,
        )


@dataclass(frozen=True)
class Reconciled:
    """What a lookup of the downstream found about an interrupted effect
    (SPEC §15), returned by ``do``'s ``reconcile`` function and recorded by
    ``reconcile``.

    Attributes:
        outcome: ``"succeeded"`` (the effect happened: ``external_ref`` is
            what the lookup found) or ``"not_applied"`` (it did not:
            ``error_code`` says why). Any other answer is no answer: raise
            from the lookup instead, and the key waits for a person.
        lookup: what was asked (a tool or endpoint name).
        answer: the lookup's answer, any JSON of at most 16 KiB.
        external_ref: required with ``succeeded``.
        result: with ``succeeded``, what a replay returns.
        error_code: required with ``not_applied`` (``A-Z0-9_``).
        error_message: with ``not_applied``.
    """

    outcome: str
    lookup: str
    answer: Any
    external_ref: str = ""
    result: Any = None
    error_code: str = ""
    error_message: str = ""

    def _json(self) -> dict:
        body: dict = {"outcome": self.outcome, "evidence": {"lookup": self.lookup, "answer": self.answer}}
        if self.external_ref:
            body["external_ref"] = self.external_ref
        if self.result is not None:
            body["result"] = self.result
        if self.outcome == "not_applied" or self.error_code:
            body["error"] = {"code": self.error_code, "message": self.error_message}
        return body


@dataclass(frozen=True)
class EffectResult:
    """What ``do`` returns.

    Attributes:
        key: the idempotency key.
        result: the function's return value on a fresh run; the recorded
            result (decoded JSON) on a replay.
        external_ref: the downstream reference.
        replayed: the effect had already succeeded and was not run again.
        recorded: False for ``none``/``read`` effects, which skip the ledger.
        receipt: the commit receipt, or the replay receipt on a replay.
        original: on a replay, the receipt of the recorded success.
        reservation: the reservation the function ran under (None on a replay).
        renewed: the key's earlier outcome had expired and the function ran
            as a new effect under the same key (the reservation's renewal).
        after_not_applied: the key's last outcome was ``not_applied`` and the
            function ran again (the reservation's ``after_not_applied``).
        approval: the approval the run consumed (the reservation's).
        reconciled: a replay of what ``do``'s ``reconcile`` lookup found:
            the interrupted attempt's effect happened (SPEC §15).
        erased: on a replay, the recorded fields an erasure removed (SPEC
            §14): field -> the erase receipt's seq (``result`` None,
            ``external_ref`` ``""``); empty otherwise.
    """

    key: str
    result: Any
    external_ref: str
    replayed: bool
    recorded: bool
    receipt: Optional[ReceiptRef] = None
    original: Optional[ReceiptRef] = None
    reservation: Optional[Reservation] = None
    reconciled: bool = False
    erased: Dict[str, int] = field(default_factory=dict)

    @property
    def renewed(self) -> Optional[Renewal]:
        return self.reservation.renewed if self.reservation is not None else None

    @property
    def after_not_applied(self) -> Optional[NotAppliedRef]:
        return self.reservation.after_not_applied if self.reservation is not None else None

    @property
    def approval(self) -> Optional[ApprovalUse]:
        return self.reservation.approval if self.reservation is not None else None


_execution: ContextVar[Optional[Tuple[str, int]]] = ContextVar("effect_ledger_execution", default=None)


@contextlib.contextmanager
def execution(execution_id: str, attempt: int = 1) -> Iterator[None]:
    """Set the execution id and attempt of every effect reserved inside the
    block (in this thread or task) that does not name its own.

    A gateway wraps each tool call the model makes::

        with execution(tool_call.id, attempt=runtime_attempt):
            refund(order_id=1234, amount=1200)   # a decorated function
    """
    if not execution_id:
        raise ValueError("execution: execution_id is required")
    if attempt < 1:
        raise ValueError("execution: attempt must be >= 1")
    token = _execution.set((execution_id, attempt))
    try:
        yield
    finally:
        _execution.reset(token)


def current_execution() -> Optional[Tuple[str, int]]:
    """Return the ``(execution_id, attempt)`` set by ``execution``, if any."""
    return _execution.get()


def _execution_for(effect: Effect) -> Tuple[str, int]:
    ctx = _execution.get()
    eid = effect.execution_id or (ctx[0] if ctx else "exec_" + uuid.uuid4().hex)
    attempt = effect.attempt if effect.attempt is not None else (ctx[1] if ctx and not effect.execution_id else 1)
    return eid, attempt
