"""The asyncio client: the same protocol as ``Ledger``, awaited."""

from __future__ import annotations

import asyncio
import functools
import inspect
from typing import Any, Awaitable, Callable, Optional, Tuple, TypeVar, Union

import httpx

from . import _core, _handle
from ._core import _Call, _Core, _Reply, _Request, _Sleep, effect_for_call
from ._types import Committed, DerivationKey, Effect, EffectResult, NotRecorded, ReceiptRef, Reconciled, Replay, Reservation

__all__ = ["AsyncLedger", "AsyncEffectHandle", "AsyncEffectScope"]

F = TypeVar("F", bound=Callable[..., Any])


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class AsyncLedger(_Core["AsyncEffectScope", httpx.AsyncClient]):
    """A client of one ledger for asyncio code; the arguments are those of
    ``Ledger`` (``client`` is an ``httpx.AsyncClient``). Every method is a
    coroutine; ``effect(...)`` gives an ``async with`` context manager and a
    decorator of ``async def`` functions. Use ``async with AsyncLedger(...)``
    or ``await ledger.aclose()``."""

    _new_client = httpx.AsyncClient

    async def aclose(self) -> None:
        """Close the HTTP connections (unless the client was passed in)."""
        if self._own:
            await self._client.aclose()

    async def __aenter__(self) -> "AsyncLedger":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def _run(self, flow: _core.Flow) -> Any:
        step, reply = flow.send, None
        try:
            while True:
                action = step(reply)
                step = flow.send
                if isinstance(action, _Sleep):
                    await asyncio.sleep(action.seconds)
                    reply = None
                elif isinstance(action, _Call):
                    try:
                        reply = await _maybe_await(action.fn(action.key))
                    except Exception as exc:
                        step, reply = flow.throw, exc
                else:
                    reply = await self._send(action)
        except StopIteration as stop:
            return stop.value
        finally:
            flow.close()  # a flow left by a BaseException ends (its finally blocks run)

    async def _send(self, req: _Request) -> Union[_Reply, BaseException]:
        try:
            r = await self._client.request(**self._request_args(req))
        except httpx.TransportError as e:
            return e
        return _Reply(r.status_code, r.headers, r.content)

    # -- the protocol (see Ledger for the details of each) -------------------

    async def reserve(
        self, effect: Effect, *, wait: Optional[float] = None, approval_wait: Optional[float] = None
    ) -> Union[Reservation, Replay, NotRecorded]:
        """Reserve ``effect``'s key; see ``Ledger.reserve``."""
        return await self._run(self._reserve_flow(effect, wait, approval_wait))

    async def succeed(self, reservation: Reservation, result: Any = None, external_ref: str = "") -> Committed:
        """Commit a reservation as succeeded; see ``Ledger.succeed``."""
        return await self._run(self._succeed_flow(reservation, result, external_ref))

    async def fail(
        self, reservation: Reservation, code: str, message: str = "", retryable: bool = False
    ) -> Committed:
        """Commit a reservation as failed; see ``Ledger.fail``."""
        return await self._run(self._fail_flow(reservation, code, message, retryable))

    async def not_applied(self, reservation: Reservation, code: str, message: str = "") -> Committed:
        """Commit a reservation as ``not_applied``; see ``Ledger.not_applied``."""
        return await self._run(self._not_applied_flow(reservation, code, message))

    async def resolve(
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
        """Record an operator's decision about an interrupted key; see ``Ledger.resolve``."""
        return await self._run(
            self._resolve_flow(key, note, outcome, result, external_ref, error_code, error_message, retryable)
        )

    async def reconcile(self, key: str, found: Reconciled) -> dict:
        """Record what a lookup found about the interrupted key; see ``Ledger.reconcile``."""
        return await self._run(self._reconcile_flow(key, found))

    async def get_effect(self, key: str, history: bool = False) -> dict:
        """Return a key's state and receipts; see ``Ledger.get_effect``."""
        return await self._run(self._effect_flow(key, history))

    async def receipts(self, after: int = 0, limit: int = 100, **filters: str) -> dict:
        """Return one page of receipts; see ``Ledger.receipts``."""
        return await self._run(self._receipts_flow(after, limit, filters))

    async def head(self) -> ReceiptRef:
        """Return the chain's latest receipt (seq 0 when empty)."""
        return await self._run(self._head_flow())

    async def derivation_key(self) -> DerivationKey:
        """Return the namespace's ``DerivationKey`` (SPEC §14): its payload
        mode and fingerprint key, with which calls without a key derive
        theirs (``dk2_`` when committed). Asked of the ledger once (a writer
        or admin token) and kept for the client's life."""
        return await self._run(self._derivation_flow())

    # -- policy and approvals (SPEC §13) --------------------------------------

    async def policy(self) -> dict:
        """Return the namespace's policy in force; see ``Ledger.policy``."""
        return await self._run(self._policy_flow())

    async def set_policy(self, policy: Any) -> dict:
        """Set the namespace's policy (an ``admin`` token); see ``Ledger.set_policy``."""
        return await self._run(self._set_policy_flow(policy))

    async def approvals(self, state: Optional[str] = None, after: int = 0, limit: Optional[int] = None) -> dict:
        """Return one page of the namespace's asks; see ``Ledger.approvals``."""
        return await self._run(self._approvals_flow(state, after, limit))

    async def approval(self, seq: int) -> dict:
        """Return the ask at ``seq``; see ``Ledger.approval``."""
        return await self._run(self._approval_flow(seq))

    async def answer(self, seq: int, decision: str, note: Optional[str] = None) -> dict:
        """Answer the ask at ``seq`` with ``"approve"`` or ``"reject"``; see
        ``Ledger.answer``."""
        return await self._run(self._answer_flow(seq, decision, note))

    async def approve(self, seq: int, note: Optional[str] = None) -> dict:
        """``answer(seq, "approve", note)``."""
        return await self.answer(seq, "approve", note)

    async def reject(self, seq: int, note: Optional[str] = None) -> dict:
        """``answer(seq, "reject", note)``."""
        return await self.answer(seq, "reject", note)

    # -- running effects ----------------------------------------------------

    async def do(
        self,
        effect: Effect,
        fn: Callable[[str], Union[Any, Awaitable[Any]]],
        *,
        wait: Optional[float] = None,
        retry_on: Optional[Tuple[type, ...]] = None,
        approval_wait: Optional[float] = None,
        reconcile: Optional[Callable[[str], Union[Reconciled, Awaitable[Reconciled]]]] = None,
    ) -> EffectResult:
        """Run ``fn(key)`` (a coroutine function or a plain one) at most once
        for ``effect`` and record its outcome; see ``Ledger.do`` (and its
        ``reconcile``, here a coroutine function or a plain one). A
        cancellation while ``fn`` runs leaves the reservation to end as
        interrupted."""
        return await self._run(_handle.do_flow(self, effect, fn, wait, retry_on, approval_wait, reconcile))


    def _scope(self, spec: Effect, wait: Optional[float], retry_on: Tuple[type, ...]) -> "AsyncEffectScope":
        return AsyncEffectScope(self, spec, wait, retry_on)


class AsyncEffectHandle(_handle.HandleBase):
    """The running effect inside ``async with ledger.effect(...) as eff``;
    ``succeed``, ``fail`` and ``not_applied`` are coroutines. See ``HandleBase``."""

    def __init__(self, ledger: AsyncLedger, spec: Effect, retry_on: Tuple[type, ...]) -> None:
        super().__init__(spec, retry_on)
        self._ledger = ledger

    async def succeed(self, result: Any = None, external_ref: str = "") -> Optional[Committed]:
        """Commit the effect as succeeded (now); see ``EffectHandle.succeed``."""
        return await self._ledger._run(self._succeed_flow(self._ledger, result, external_ref))

    async def fail(self, code: str, message: str = "", retryable: bool = False) -> Optional[Committed]:
        """Commit the effect as failed (now); see ``EffectHandle.fail``."""
        return await self._ledger._run(self._failure_flow(self._ledger, "failed", code, message, retryable))

    async def not_applied(self, code: str, message: str = "") -> Optional[Committed]:
        """Commit the effect as ``not_applied`` (now); see ``EffectHandle.not_applied``."""
        return await self._ledger._run(self._failure_flow(self._ledger, "not_applied", code, message))


class AsyncEffectScope:
    """What ``AsyncLedger.effect(...)`` returns: an async context manager
    (one ``async with`` at a time) and a decorator."""

    def __init__(
        self, ledger: AsyncLedger, spec: Effect, wait: Optional[float], retry_on: Tuple[type, ...]
    ) -> None:
        self._ledger = ledger
        self._spec = spec
        self._wait = wait
        self._retry_on = retry_on
        self._handle: Optional[AsyncEffectHandle] = None

    async def __aenter__(self) -> AsyncEffectHandle:
        if self._handle is not None:
            raise RuntimeError("this effect(...) is already in use; call ledger.effect(...) for each with-block")
        h = AsyncEffectHandle(self._ledger, self._spec, self._retry_on)
        self._handle = h
        try:
            if self._spec.recorded:
                h._started(await self._ledger.reserve(self._spec, wait=self._wait))
            else:
                h.key = _handle.local_key(self._spec)
        except BaseException:
            self._handle = None
            raise
        return h

    async def __aexit__(self, exc_type: Any, exc: Optional[BaseException], tb: Any) -> None:
        h, self._handle = self._handle, None
        if h is None:
            return
        try:
            await self._ledger._run(_handle.exit_flow(self._ledger, h, exc))
        finally:
            h._release()

    def __call__(self, fn: F) -> F:
        spec, input_fn, key_fn = _handle.decorator_spec(self._spec, self._spec.input, self._spec.key)
        ledger, wait, retry_on = self._ledger, self._wait, self._retry_on

        @functools.wraps(fn)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not spec.recorded:
                return await _maybe_await(fn(*args, **kwargs))
            eff = effect_for_call(spec, fn, args, kwargs, input_fn, key_fn)
            result = await ledger.do(eff, lambda _key: fn(*args, **kwargs), wait=wait, retry_on=retry_on)
            return result.result

        return wrapper  # type: ignore[return-value]
