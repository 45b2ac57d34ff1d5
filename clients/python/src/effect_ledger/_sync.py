"""The synchronous client."""

from __future__ import annotations

import functools
import inspect
import time
from typing import Any, Callable, Optional, Tuple, TypeVar, Union

import httpx

from . import _core, _handle
from ._core import _Call, _Core, _Reply, _Request, _Sleep, effect_for_call
from ._types import Committed, DerivationKey, Effect, EffectResult, NotRecorded, ReceiptRef, Reconciled, Replay, Reservation

__all__ = ["Ledger", "EffectHandle", "EffectScope"]

F = TypeVar("F", bound=Callable[..., Any])


class Ledger(_Core["EffectScope", httpx.Client]):
    """A client of one ledger (``ledgerd``), for synchronous code.

    Args:
        base_url: e.g. ``"http://127.0.0.1:8080"``.
        token: an API bearer token (``elt_...``) when the ledger has tokens;
            a gateway needs the ``writer`` role.
        namespace: serve effects of this namespace (``/v1/ns/{ns}/...``,
            SPEC §7) instead of ``default``.
        timeout: seconds for one HTTP request (a waiting reserve gets its
            ``wait_ms`` on top).
        wait: seconds a reserve waits for another reservation of the same
            key to end (``in_progress``) before raising ``InProgressError``;
            0 does not wait. Per call: ``wait=``.
        retries: how often a request answered 429, 502, 503 or 504, or whose
            connection failed, is retried (backoff honouring Retry-After).
        commit_retries: the same for commits, which are safe to repeat.
        backoff: the first retry's backoff in seconds (doubling, jittered).
        max_retry_delay: a Retry-After longer than this is not waited for:
            the error is raised (with ``retry_after``) instead.
        lease_ms: default lease of reservations (the ledger's is 30 s).
        retry_on: exception types whose failures are recorded retryable.
        approval_wait: seconds a reserve waits for the answer to a call the
            namespace's policy sends to approval before raising
            ``ApprovalRequiredError`` (default 0: at once). Per call:
            ``approval_wait=``.
        client: an ``httpx.Client`` to use (e.g. for custom TLS); it is not
            closed by ``close``.
        verify: TLS verification for the client this creates (``True``, a CA
            bundle path or an ``ssl.SSLContext``).

    Use it as a context manager, or call ``close`` when done.
    """

    _new_client = httpx.Client

    def close(self) -> None:
        """Close the HTTP connections (unless the client was passed in)."""
        if self._own:
            self._client.close()

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _run(self, flow: _core.Flow) -> Any:
        step, reply = flow.send, None
        try:
            while True:
                action = step(reply)
                step = flow.send
                if isinstance(action, _Sleep):
                    time.sleep(action.seconds)
                    reply = None
                elif isinstance(action, _Call):
                    try:
                        reply = action.fn(action.key)
                    except Exception as exc:
                        step, reply = flow.throw, exc
                else:
                    reply = self._send(action)
        except StopIteration as stop:
            return stop.value
        finally:
            flow.close()  # a flow left by a BaseException ends (its finally blocks run)

    def _send(self, req: _Request) -> Union[_Reply, BaseException]:
        try:
            r = self._client.request(**self._request_args(req))
        except httpx.TransportError as e:
            return e
        return _Reply(r.status_code, r.headers, r.content)

    # -- the protocol -------------------------------------------------------

    def reserve(
        self, effect: Effect, *, wait: Optional[float] = None, approval_wait: Optional[float] = None
    ) -> Union[Reservation, Replay, NotRecorded]:
        """Reserve ``effect``'s key, waiting up to ``wait`` seconds (default:
        the client's) while another reservation holds it.

        A call the namespace's policy sends to approval raises
        ``ApprovalRequiredError`` (nothing ran), after waiting up to
        ``approval_wait`` seconds (default: the client's, 0) for the answer:
        an approval returns the ``Reservation`` (``.approval`` set), a
        rejection raises ``ApprovalRejectedError``.

        Returns a ``Reservation`` (run the effect, then ``succeed``/``fail``),
        a ``Replay`` (it already succeeded: do not run it) or ``NotRecorded``
        (``none``/``read``). Raises ``FingerprintMismatchError``,
        ``InProgressError``, ``UnsafeResumeError``, ``RetryNotAllowedError``,
        ``AttemptConflictError`` and the other ``LedgerError``s.
        """
        return self._run(self._reserve_flow(effect, wait, approval_wait))

    def succeed(self, reservation: Reservation, result: Any = None, external_ref: str = "") -> Committed:
        """Commit a reservation as succeeded with its result (any JSON) and
        downstream reference. Raises ``StaleReservationError`` (another
        reservation took over), ``AlreadyFinalizedError``, ..."""
        return self._run(self._succeed_flow(reservation, result, external_ref))

    def fail(self, reservation: Reservation, code: str, message: str = "", retryable: bool = False) -> Committed:
        """Commit a reservation as failed with an error ``code`` (``A-Z0-9_``,
        1-64 characters). ``retryable`` with an idempotent handler lets the
        key be reserved again (``retry``)."""
        return self._run(self._fail_flow(reservation, code, message, retryable))

    def not_applied(self, reservation: Reservation, code: str, message: str = "") -> Committed:
        """Commit a reservation as ``not_applied`` (SPEC §4.1): the effect
        failed and is known to have applied nothing (invalid input, not
        found, declined), with an error ``code`` (``A-Z0-9_``, 1-64
        characters). The key may then be reserved again by any call, which
        runs the effect again."""
        return self._run(self._not_applied_flow(reservation, code, message))

    def resolve(
        self,
        key: str,
        note: str,
        *,
        outcome: str = "succeeded",
        result: Any = None,
        external_ref: str = "",
        error_code: Optional[str] = None,
        error_message: str = "",
        retryable: bool = False,
    ) -> dict:
        """Record an operator's decision about an interrupted key (needs an
        ``admin`` token): ``outcome`` is ``succeeded``, ``failed`` or
        ``not_applied`` ("I checked: nothing happened"; needs
        ``error_code``), after which the key may be reserved again. An admin
        may also resolve a ``failed`` key as ``not_applied``, correcting it.
        Raises ``NotInterruptedError``, ``UnknownKeyError``."""
        return self._run(
            self._resolve_flow(key, note, outcome, result, external_ref, error_code, error_message, retryable)
        )

    def reconcile(self, key: str, found: Reconciled) -> dict:
        """Record what a lookup of the downstream found about the interrupted
        key (SPEC §15): the caller must be the actor of the interrupted
        reserve (or an admin), and a rule of the namespace's policy must
        allow it for the tool. A ``not_applied`` before the lease's end plus
        the rule's ``settle_ms`` is refused with ``ReconcileTooEarlyError``
        (its ``retry_after`` says when): the original call may still land,
        so ask the downstream again then, never send an earlier answer. Returns ``{"status": "reconciled", "state",
        "receipt", ...}``. Raises ``ReconcileNotAllowedError``,
        ``NotInterruptedError``, ``ReconcileTooEarlyError``,
        ``InvalidRequestError``, ``UnknownKeyError``."""
        return self._run(self._reconcile_flow(key, found))

    def get_effect(self, key: str, history: bool = False) -> dict:
        """Return a key's state and receipts (``GET /v1/effects/{key}``).

        In a namespace with a key lifetime, a succeeded or failed key has
        ``expires_at`` (unix ms): a reserve from then on starts a new
        generation of the key. ``receipts`` are the current generation's,
        or every generation's with ``history=True``."""
        return self._run(self._effect_flow(key, history))

    def receipts(self, after: int = 0, limit: int = 100, **filters: str) -> dict:
        """Return one page of receipts: ``{"receipts": [...], "next_after"}``.
        Filters: ``key``, ``execution_id``, ``tool``, ``kind``."""
        return self._run(self._receipts_flow(after, limit, filters))

    def head(self) -> ReceiptRef:
        """Return the chain's latest receipt (seq 0 when empty)."""
        return self._run(self._head_flow())

    def derivation_key(self) -> DerivationKey:
        """Return the namespace's ``DerivationKey`` (SPEC §14): its payload
        mode and fingerprint key, with which calls without a key derive
        theirs (``dk2_`` when committed). Asked of the ledger once (a writer
        or admin token) and kept for the client's life."""
        return self._run(self._derivation_flow())

    # -- policy and approvals (SPEC §13) --------------------------------------

    def policy(self) -> dict:
        """Return the namespace's policy in force: ``{"namespace", "policy",
        "seq"}`` (``policy`` ``{}`` and ``seq`` 0 when none)."""
        return self._run(self._policy_flow())

    def set_policy(self, policy: Any) -> dict:
        """Set the namespace's policy (an ``admin`` token): ``policy`` is the
        policy's JSON object (``{"rules": [...], "self_approval": ...}``).
        Returns ``{"namespace", "policy", "seq", "changed", "receipt"}``; a
        policy equal to the one in force appends nothing (``changed`` False).
        Raises ``InvalidRequestError`` (``details["field"]``) for a bad one."""
        return self._run(self._set_policy_flow(policy))

    def approvals(self, state: Optional[str] = None, after: int = 0, limit: Optional[int] = None) -> dict:
        """Return one page of the namespace's asks, by seq:
        ``{"approvals": [...], "next_after"}``; ``state`` is ``pending``,
        ``approved``, ``rejected``, ``expired`` or ``consumed``."""
        return self._run(self._approvals_flow(state, after, limit))

    def approval(self, seq: int) -> dict:
        """Return the ask at ``seq``; for approver and admin tokens with the
        asked ``input`` and ``input_verified``. Raises ``UnknownApprovalError``."""
        return self._run(self._approval_flow(seq))

    def answer(self, seq: int, decision: str, note: Optional[str] = None) -> dict:
        """Answer the ask at ``seq`` with ``"approve"`` or ``"reject"`` and an
        optional note (an ``approver`` or ``admin`` token the rule lists);
        returns the ask with its ``answer``. The same decision again returns
        the recorded one. Raises ``AlreadyAnsweredError``,
        ``ApprovalExpiredError``, ``SelfApprovalError``, ``ForbiddenError``,
        ``UnknownApprovalError``."""
        return self._run(self._answer_flow(seq, decision, note))

    def approve(self, seq: int, note: Optional[str] = None) -> dict:
        """``answer(seq, "approve", note)``."""
        return self.answer(seq, "approve", note)

    def reject(self, seq: int, note: Optional[str] = None) -> dict:
        """``answer(seq, "reject", note)``."""
        return self.answer(seq, "reject", note)

    # -- running effects ----------------------------------------------------

    def do(
        self,
        effect: Effect,
        fn: Callable[[str], Any],
        *,
        wait: Optional[float] = None,
        retry_on: Optional[Tuple[type, ...]] = None,
        approval_wait: Optional[float] = None,
        reconcile: Optional[Callable[[str], Reconciled]] = None,
    ) -> EffectResult:
        """Run ``fn(key)`` at most once for ``effect`` and record its outcome.

        Reserves the key; on a replay returns the recorded outcome without
        calling ``fn``. Otherwise calls ``fn`` with the idempotency key (pass
        it downstream), commits its return value as the result (return an
        ``Outcome`` to add an external reference) and returns it. An
        exception from ``fn`` is committed as a failure (see ``EffectFailed``;
        retryable when the exception has ``retryable = True`` or is one of
        ``retry_on``), or as ``not_applied`` for ``EffectNotApplied`` (the
        next call runs ``fn`` again), and re-raised. A call the namespace's
        policy sends to approval raises ``ApprovalRequiredError`` without
        calling ``fn`` (after waiting ``approval_wait`` seconds for the
        answer), a rejected one ``ApprovalRejectedError``. ``none``/``read`` effects run ``fn``
        without the ledger. A ``KeyboardInterrupt`` or other non-``Exception``
        leaves the reservation to end as interrupted.

        ``reconcile(key)``, when given, is called when the reserve answers
        ``unsafe_resume`` (an earlier attempt was interrupted and may have
        happened): it asks the downstream, by the key, whether the effect
        happened and returns a ``Reconciled`` (SPEC §15). ``succeeded`` is
        recorded and returned as a replay (``reconciled`` set; ``fn`` does
        not run); ``not_applied`` is recorded and the key reserved again,
        ``reconcile_too_early`` waited out within ``wait``, then the downstream
        asked again. An exception
        from it, or a reconcile the ledger refuses, raises the
        ``UnsafeResumeError`` (with the refusal as its ``__cause__``).
        """
        return self._run(_handle.do_flow(self, effect, fn, wait, retry_on, approval_wait, reconcile))


    def _scope(self, spec: Effect, wait: Optional[float], retry_on: Tuple[type, ...]) -> "EffectScope":
        return EffectScope(self, spec, wait, retry_on)


class EffectHandle(_handle.HandleBase):
    """The running effect inside ``with ledger.effect(...) as eff``.

    See ``HandleBase`` for its attributes (``key``, ``replayed``,
    ``result``, ``reservation``, ``takeover``, ...).
    """

    def __init__(self, ledger: Ledger, spec: Effect, retry_on: Tuple[type, ...]) -> None:
        super().__init__(spec, retry_on)
        self._ledger = ledger

    def succeed(self, result: Any = None, external_ref: str = "") -> Optional[Committed]:
        """Commit the effect as succeeded (now). Returns the commit, or None
        for a ``none``/``read`` effect. Raises ``RuntimeError`` on a replay
        or a second call, and ``ResultNotRecordedError`` (after recording a
        success without result) when the result is not storable JSON."""
        return self._ledger._run(self._succeed_flow(self._ledger, result, external_ref))

    def fail(self, code: str, message: str = "", retryable: bool = False) -> Optional[Committed]:
        """Commit the effect as failed (now) with an error code (``A-Z0-9_``)."""
        return self._ledger._run(self._failure_flow(self._ledger, "failed", code, message, retryable))

    def not_applied(self, code: str, message: str = "") -> Optional[Committed]:
        """Commit the effect as ``not_applied`` (now): it failed and applied
        nothing, so the next call of the same effect runs again (SPEC §4.1)."""
        return self._ledger._run(self._failure_flow(self._ledger, "not_applied", code, message))


class EffectScope:
    """What ``Ledger.effect(...)`` returns: a context manager (one ``with``
    at a time) and a decorator."""

    def __init__(self, ledger: Ledger, spec: Effect, wait: Optional[float], retry_on: Tuple[type, ...]) -> None:
        self._ledger = ledger
        self._spec = spec
        self._wait = wait
        self._retry_on = retry_on
        self._handle: Optional[EffectHandle] = None

    def __enter__(self) -> EffectHandle:
        if self._handle is not None:
            raise RuntimeError("this effect(...) is already in use; call ledger.effect(...) for each with-block")
        h = EffectHandle(self._ledger, self._spec, self._retry_on)
        if self._spec.recorded:
            h._started(self._ledger.reserve(self._spec, wait=self._wait))
        else:
            h.key = _handle.local_key(self._spec)
        self._handle = h
        return h

    def __exit__(self, exc_type: Any, exc: Optional[BaseException], tb: Any) -> None:
        h, self._handle = self._handle, None
        if h is None:
            return
        try:
            self._ledger._run(_handle.exit_flow(self._ledger, h, exc))
        finally:
            h._release()

    def __call__(self, fn: F) -> F:
        if inspect.iscoroutinefunction(fn):
            raise TypeError("%s is a coroutine function: decorate it with AsyncLedger.effect" % fn.__qualname__)
        spec, input_fn, key_fn = _handle.decorator_spec(self._spec, self._spec.input, self._spec.key)
        ledger, wait, retry_on = self._ledger, self._wait, self._retry_on

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not spec.recorded:
                return fn(*args, **kwargs)
            eff = effect_for_call(spec, fn, args, kwargs, input_fn, key_fn)
            return ledger.do(eff, lambda _key: fn(*args, **kwargs), wait=wait, retry_on=retry_on).result

        return wrapper  # type: ignore[return-value]
