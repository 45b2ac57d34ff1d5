"""State shared by the sync and async effect handles and scopes."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from contextvars import Token
from typing import Any, Callable, Iterator, Optional, Tuple

from ._core import Flow, _Call, _Core, _current, check_code, check_result, outcome_of
from ._types import (
    Committed,
    Effect,
    EffectResult,
    NotAppliedRef,
    NotRecorded,
    Outcome,
    ReceiptRef,
    Replay,
    Reservation,
)
from .errors import LedgerError, NotInterruptedError, UnsafeResumeError

log = logging.getLogger("effect_ledger")

_NOT_RECORDED_NOTE = (
    "effect_ledger: the effect ran but its outcome was not recorded; the key stays reserved until "
    "its lease ends and is then interrupted (taken over if idempotent, else a person resolves it)"
)


def add_note(exc: BaseException, note: str) -> None:
    """Attach note to exc where Python supports notes (3.11+)."""
    add = getattr(exc, "add_note", None)
    if add is not None:
        add(note)


def local_key(effect: Effect) -> str:
    """The key shown for a ``none``/``read`` call, which is not recorded."""
    try:
        return effect.resolved_key()
    except (ValueError, TypeError):
        return effect.key or ""


def replay_result(res: Replay) -> EffectResult:
    return EffectResult(
        key=res.key,
        result=res.result,
        external_ref=res.external_ref,
        replayed=True,
        recorded=True,
        receipt=res.receipt,
        original=res.original,
        erased=dict(res.erased),
    )


def recorded_result(res: Reservation, out: Outcome, committed: Committed) -> EffectResult:
    """The EffectResult of an effect run under res whose outcome out was
    committed."""
    return EffectResult(
        key=res.key,
        result=out.result,
        external_ref=out.external_ref,
        replayed=False,
        recorded=True,
        receipt=committed.receipt,
        reservation=res,
    )


def as_outcome(value: Any) -> Outcome:
    return value if isinstance(value, Outcome) else Outcome(result=value)


class ResultNotRecordedError(TypeError):
    """The effect succeeded but its result could not be stored (not JSON,
    or over 64 KiB): it was recorded as a success without a result, so it is
    never run again. ``key`` names it; ``reason`` says what was wrong."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__("effect %s succeeded and was recorded without its result: %s" % (key, reason))
        self.key = key
        self.reason = reason


class HandleBase:
    """What the context manager yields, shared by the sync and async kinds.

    Attributes:
        key: the idempotency key (also for a ``none``/``read`` call).
        recorded: False for ``none``/``read`` effects, which skip the ledger.
        replayed: the key already succeeded: the body must not run the
            effect; ``result`` and ``external_ref`` hold the recorded outcome.
        reservation: the granted reservation (None on a replay or when not
            recorded); see also ``takeover``, ``retry`` and ``attempt``.
        replay: the ledger's replay answer (None unless ``replayed``).
        committed: the commit, once ``succeed``/``fail``/``not_applied`` (or
            leaving the block) recorded it.
        outcome: ``"succeeded"``/``"failed"``/``"not_applied"`` once known
            (replays: succeeded).
        result, external_ref: the recorded (replay) or committed outcome.
    """

    def __init__(self, spec: Effect, retry_on: Tuple[type, ...]) -> None:
        self.spec = spec
        self.retry_on = retry_on
        self.key: str = ""
        self.recorded = spec.recorded
        self.replayed = False
        self.reservation: Optional[Reservation] = None
        self.replay: Optional[Replay] = None
        self.committed: Optional[Committed] = None
        self.outcome: Optional[str] = None
        self.result: Any = None
        self.external_ref: str = ""
        self._finishing = False  # succeed/fail/not_applied was called (even if it raised)
        self._token: Optional[Token] = None

    @property
    def takeover(self) -> bool:
        """The reservation took over an interrupted run of the same key:
        check downstream whether that run's effect happened."""
        return bool(self.reservation and self.reservation.takeover)

    @property
    def retry(self) -> bool:
        """The reservation retries a retryable failure of the same key."""
        return bool(self.reservation and self.reservation.retry)

    @property
    def after_not_applied(self) -> Optional[NotAppliedRef]:
        """The key's last outcome was ``not_applied`` (it applied nothing)
        and this reservation runs the effect again; names that outcome."""
        return self.reservation.after_not_applied if self.reservation else None

    @property
    def attempt(self) -> int:
        """The attempt number the reservation was recorded with."""
        return self.reservation.attempt if self.reservation else 0

    def _started(self, res: Any) -> None:
        if isinstance(res, Replay):
            self.key, self.replayed, self.replay = res.key, True, res
            self.outcome, self.result, self.external_ref = "succeeded", res.result, res.external_ref
        elif isinstance(res, NotRecorded):
            self.key, self.recorded = res.key, False
        else:
            self.key, self.reservation = res.key, res
            self._token = _current.set(res)

    def _release(self) -> None:
        if self._token is not None:
            _current.reset(self._token)
            self._token = None

    def _begin_commit(self, what: str) -> Optional[Reservation]:
        """Check that a commit may be made now and return the reservation
        (None for an unrecorded effect, where commits do nothing)."""
        if self.replayed:
            raise RuntimeError(
                "effect %s was replayed: its recorded outcome is in .result; there is nothing to %s" % (self.key, what)
            )
        if self._finishing:
            raise RuntimeError("effect %s: succeed(), fail() or not_applied() was already called" % self.key)
        self._finishing = True
        return self.reservation

    def _begin_failure(self, what: str, code: str, outcome: str) -> Optional[Reservation]:
        """``_begin_commit`` for ``fail`` and ``not_applied``: check the
        error code and set the outcome."""
        check_code(code)
        res = self._begin_commit(what)
        self.outcome = outcome
        return res

    def _succeed_flow(self, ledger: _Core, result: Any, external_ref: str) -> Flow:
        """``succeed``: commit the effect as succeeded with result (None for
        an unrecorded effect)."""
        res = self._begin_commit("succeed")
        self.outcome, self.result, self.external_ref = "succeeded", result, external_ref
        if res is None:
            return None
        self.committed = yield from success_flow(ledger, res, result, external_ref)
        return self.committed

    def _failure_flow(self, ledger: _Core, outcome: str, code: str, message: str, retryable: bool = False) -> Flow:
        """``fail`` (outcome ``failed``) and ``not_applied``: commit the
        effect with the error code (None for an unrecorded effect)."""
        res = self._begin_failure("fail" if outcome == "failed" else outcome, code, outcome)
        if res is None:
            return None
        with noting_outcome_not_recorded():
            if outcome == "failed":
                self.committed = yield from ledger._fail_flow(res, code, message, retryable)
            else:
                self.committed = yield from ledger._not_applied_flow(res, code, message)
        return self.committed

    def _commit_on_exit(self, exc: Optional[BaseException]) -> Optional[Reservation]:
        """Leaving the block: the reservation to commit (see
        ``_must_commit_on_exit``) with the outcome set, or None."""
        if not self._must_commit_on_exit(exc):
            return None
        self._finishing = True
        assert self.reservation is not None
        self.outcome = "succeeded" if exc is None else outcome_of(exc)
        return self.reservation

    def _must_commit_on_exit(self, exc: Optional[BaseException]) -> bool:
        """Leaving the block: commit unless replayed, unrecorded, already
        committed, or left by a BaseException that is not an Exception
        (KeyboardInterrupt, cancellation), whose effect may or may not have
        happened: that key is left reserved, to end as interrupted."""
        if not self.recorded or self.replayed or self._finishing or self.reservation is None:
            return False
        return exc is None or isinstance(exc, Exception)


def result_problem(key: str, result: Any) -> Tuple[Any, Optional[ResultNotRecordedError]]:
    """Return the result to commit and the error to raise after committing
    when the result cannot be stored."""
    reason = check_result(result)
    if reason is None:
        return result, None
    return None, ResultNotRecordedError(key, reason)


def note_failure_not_recorded(exc: BaseException, key: str, err: LedgerError) -> None:
    log.warning("effect_ledger: could not record the failure of effect %s: %s", key, err)
    add_note(exc, "effect_ledger: the failure of effect %s was not recorded: %s" % (key, err))


def note_outcome_not_recorded(err: BaseException) -> None:
    add_note(err, _NOT_RECORDED_NOTE)


@contextlib.contextmanager
def noting_outcome_not_recorded() -> Iterator[None]:
    """Re-raise a ``LedgerError`` raised inside with the note that the
    effect ran but its outcome was not recorded."""
    try:
        yield
    except LedgerError as err:
        note_outcome_not_recorded(err)
        raise


def do_flow(
    ledger: _Core,
    effect: Effect,
    fn: Callable[[str], Any],
    wait: Optional[float],
    retry_on: Optional[Tuple[type, ...]],
    approval_wait: Optional[float],
    reconcile: Optional[Callable[[str], Any]] = None,
) -> Flow:
    """``do``: run fn at most once for effect and record its outcome; on
    ``unsafe_resume``, ask ``reconcile`` first (``reconcile_flow``)."""
    retry = ledger._retry_types(retry_on)
    if not effect.recorded:
        return unrecorded_result(effect, (yield _Call(fn, local_key(effect))))
    try:
        res = yield from ledger._reserve_flow(effect, wait, approval_wait)
    except UnsafeResumeError as unsafe:
        if reconcile is None:
            raise
        res = yield from reconcile_flow(ledger, effect, reconcile, unsafe, wait, approval_wait)
    if isinstance(res, EffectResult):
        return res
    if isinstance(res, Replay):
        return replay_result(res)
    if isinstance(res, NotRecorded):
        return unrecorded_result(effect, (yield _Call(fn, res.key)))
    token = _current.set(res)
    try:
        value = yield _Call(fn, res.key)
    except Exception as exc:
        yield from failure_flow(ledger, res, exc, retry)
        raise
    finally:
        _current.reset(token)
    out = as_outcome(value)
    committed = yield from success_flow(ledger, res, out.result, out.external_ref)
    return recorded_result(res, out, committed)


def reconcile_flow(
    ledger: _Core,
    effect: Effect,
    lookup: Callable[[str], Any],
    unsafe: UnsafeResumeError,
    wait: Optional[float],
    approval_wait: Optional[float],
) -> Flow:
    """Settle an ``unsafe_resume`` with the effect's lookup (SPEC §15): a
    definite answer is recorded; ``succeeded`` returns the found outcome as
    a replay (an ``EffectResult``), ``not_applied`` reserves again. A lookup
    that raises, or a reconcile the ledger refuses, re-raises ``unsafe``
    (the refusal as its cause)."""
    key = effect.resolved_key()
    try:
        found = yield _Call(lookup, key)
    except Exception as exc:
        raise unsafe from exc
    try:
        data = yield from ledger._reconcile_flow(key, found, wait, ask=lookup)
    except NotInterruptedError:
        data = None  # ended meanwhile: decide again
    except (LedgerError, TypeError, ValueError) as exc:
        raise unsafe from exc
    if data is not None and found.outcome == "succeeded":
        ref = ReceiptRef._from(data.get("receipt"))
        return EffectResult(key=key, result=found.result, external_ref=found.external_ref, replayed=True,
                            recorded=True, receipt=ref, original=ref, reconciled=True)
    res = yield from ledger._reserve_flow(effect, wait, approval_wait)
    return res


def success_flow(ledger: _Core, res: Reservation, result: Any, external_ref: str) -> Flow:
    """Commit the success of the effect run under res (a result that cannot
    be stored: none, then raise ``ResultNotRecordedError``)."""
    result, problem = result_problem(res.key, result)
    with noting_outcome_not_recorded():
        committed = yield from ledger._succeed_flow(res, result, external_ref)
    if problem is not None:
        raise problem
    return committed


def failure_flow(ledger: _Core, res: Reservation, exc: BaseException, retry_on: Tuple[type, ...]) -> Flow:
    """Commit the failure exc of the effect run under res, or note on exc
    that it was not recorded."""
    try:
        yield from ledger._failure_flow(res, exc, retry_on)
    except LedgerError as err:
        note_failure_not_recorded(exc, res.key, err)


def exit_flow(ledger: _Core, h: HandleBase, exc: Optional[BaseException]) -> Flow:
    """Leaving an effect's block: commit what ``_commit_on_exit`` says."""
    res = h._commit_on_exit(exc)
    if res is None:
        return
    if exc is None:
        h.committed = yield from success_flow(ledger, res, None, "")
    else:
        yield from failure_flow(ledger, res, exc, h.retry_on)


def decorator_spec(
    spec: Effect, input_value: Any, key_value: Any
) -> Tuple[Effect, Optional[Callable], Optional[Callable]]:
    """Split the decorator's input=/key= arguments into callables."""
    if input_value is not None and not callable(input_value):
        raise TypeError(
            "as a decorator, effect(input=...) takes a callable that gets the call's arguments and returns "
            "its JSON input; without it the input is the call's bound arguments"
        )
    key_fn = key_value if callable(key_value) else None
    if key_value is not None and key_fn is None:
        raise TypeError(
            "as a decorator, effect(key=...) takes a callable that gets the call's arguments and returns "
            "the key; without it the key is derived from the tool and the input"
        )
    return dataclasses.replace(spec, input=None, key=None), input_value, key_fn


def unrecorded_result(effect: Effect, value: Any) -> EffectResult:
    """The EffectResult of a ``none``/``read`` call, run without the ledger."""
    out = as_outcome(value)
    return EffectResult(
        key=local_key(effect), result=out.result, external_ref=out.external_ref, replayed=False, recorded=False
    )
