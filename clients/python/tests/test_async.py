"""The asyncio client against a real ledgerd (each test runs its own loop)."""

from __future__ import annotations

import asyncio
import time
from typing import Any, List

import pytest

from effect_ledger import (
    AsyncLedger,
    Effect,
    EffectFailed,
    FingerprintMismatchError,
    InProgressError,
    Outcome,
    Reservation,
    RetryNotAllowedError,
    UnsafeResumeError,
    current_reservation,
    derive_key,
    execution,
)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_async_do_and_replay(server: Any, uid: str) -> None:
    async def main() -> None:
        async with AsyncLedger(server.url) as ledger:
            calls: List[str] = []

            async def refund(key: str) -> Outcome:
                calls.append(key)
                await asyncio.sleep(0)
                return Outcome(result={"amount": 5}, external_ref="re_" + uid)

            eff = Effect(tool="payments.refund", idempotent=True, input={"order": uid})
            first = await ledger.do(eff, refund)
            again = await ledger.do(eff, refund)
            assert calls == [eff.resolved_key()]
            assert not first.replayed and again.replayed
            assert again.result == {"amount": 5} and again.external_ref == "re_" + uid
            assert again.original == first.receipt
            plain = await ledger.do(Effect(tool="t", input={"sync fn": uid}), lambda key: "plain")
            assert plain.result == "plain"
            state = await ledger.get_effect(first.key)
            assert [r["kind"] for r in state["receipts"]] == ["reserve", "commit", "replay"]

    run(main())


def test_async_context_manager(server: Any, uid: str) -> None:
    async def main() -> None:
        async with AsyncLedger(server.url) as ledger:
            async with ledger.effect(tool="email.send", effect="external", input={"to": uid}) as eff:
                assert not eff.replayed and current_reservation() == eff.reservation
                await eff.succeed(result={"id": "m1"}, external_ref="m1")
            async with ledger.effect(tool="email.send", effect="external", input={"to": uid}) as eff2:
                assert eff2.replayed and eff2.result == {"id": "m1"}
            with pytest.raises(ConnectionError):
                async with ledger.effect(tool="email.send", effect="external", input={"to": uid + "2"}) as eff3:
                    raise ConnectionError("smtp closed")
            commit = (await ledger.get_effect(eff3.key))["receipts"][-1]
            assert (commit["outcome"], commit["error_code"]) == ("failed", "CONNECTION_ERROR")

    run(main())


def test_async_decorator(server: Any, uid: str) -> None:
    async def main() -> None:
        async with AsyncLedger(server.url) as ledger:
            runs: List[int] = []

            @ledger.effect(tool="payments.capture", idempotent=True)
            async def capture(order: str, amount: int) -> dict:
                runs.append(amount)
                if len(runs) == 1:
                    raise EffectFailed("PSP_TIMEOUT", retryable=True)
                return {"captured": amount}

            with pytest.raises(EffectFailed):
                await capture(uid, 10)
            assert await capture(uid, 10) == {"captured": 10}
            assert await capture(order=uid, amount=10) == {"captured": 10}
            assert runs == [10, 10]

            @ledger.effect(tool="payments.void")
            async def void(order: str) -> None:
                raise ValueError("no such order")

            with pytest.raises(ValueError):
                await void(uid)
            with pytest.raises(RetryNotAllowedError):
                await void(uid)

            @ledger.effect(tool="payments.refund", key=lambda order: "fixed-" + uid)
            def refund(order: str) -> str:  # a plain function becomes a coroutine function
                return order

            assert await refund("a") == "a"
            with pytest.raises(FingerprintMismatchError):
                await refund("b")

    run(main())


def test_async_concurrent_waiter_gets_the_replay(server: Any, uid: str) -> None:
    async def main() -> None:
        async with AsyncLedger(server.url) as ledger:
            runs: List[str] = []

            @ledger.effect(tool="payments.refund", idempotent=True)
            async def refund(order: str) -> str:
                runs.append(order)
                await asyncio.sleep(0.5)
                return "refunded"

            start = time.monotonic()
            a, b = await asyncio.gather(refund(uid), refund(uid))
            assert (a, b) == ("refunded", "refunded") and runs == [uid]
            assert time.monotonic() - start < 5

    run(main())


def test_async_errors_and_cancellation(server: Any, uid: str) -> None:
    async def main() -> None:
        async with AsyncLedger(server.url) as ledger:
            eff = Effect(tool="payments.charge", input={"cart": uid}, lease_ms=50)
            assert isinstance(await ledger.reserve(eff), Reservation)
            await asyncio.sleep(0.2)
            with pytest.raises(UnsafeResumeError):
                await ledger.do(eff, lambda key: None)

            # A task cancelled while the effect runs commits nothing: the
            # effect may or may not have happened.
            slow = Effect(tool="payments.charge", input={"cart": uid + "slow"}, lease_ms=20_000)
            started = asyncio.Event()

            async def body(key: str) -> None:
                started.set()
                await asyncio.sleep(30)

            task = asyncio.ensure_future(ledger.do(slow, body))
            await started.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert (await ledger.get_effect(slow.resolved_key()))["state"] == "reserved"
            t0 = time.monotonic()
            with pytest.raises(InProgressError):
                await ledger.do(slow, lambda key: None, wait=0.3)
            assert time.monotonic() - t0 >= 0.25

            with execution("call-" + uid, attempt=4):
                got = await ledger.do(Effect(tool="t", input={"e": uid}), lambda key: 1)
            rs = (await ledger.receipts(execution_id="call-" + uid))["receipts"]
            assert [r["attempt"] for r in rs] == [4, 4] and got.key == derive_key("t", {"e": uid})

    run(main())
