"""Reconciling an unknown outcome (SPEC §15) against a real ledgerd: ``do``
asks the effect's lookup when an interrupted attempt answers
``unsafe_resume``, and records what it found."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, List

import pytest

from effect_ledger import (
    AsyncLedger,
    Effect,
    InvalidRequestError,
    Ledger,
    NotInterruptedError,
    Reconciled,
    ReconcileNotAllowedError,
    ReconcileTooEarlyError,
    UnsafeResumeError,
)


@pytest.fixture(scope="module")
def rec_server(start_ledgerd: Callable) -> Any:
    """A ledgerd of its own: its policy lets payments.* be reconciled, with
    a settle time of 300 ms."""
    d, _ = start_ledgerd()
    with Ledger(d.url) as c:
        c.set_policy({"rules": [{"tool": "payments.*", "reconcile": {"allow": True, "settle_ms": 300}}]})
    return d


def interrupted(ledger: Ledger, tool: str, order: str) -> Effect:
    """An effect (not idempotent) whose attempt was interrupted."""
    eff = Effect(tool=tool, effect="external", input={"order": order})
    ledger.reserve(Effect(tool=tool, effect="external", input={"order": order}, lease_ms=10))
    time.sleep(0.05)  # the crashed attempt's lease ends
    return eff


def found(key: str) -> Reconciled:
    return Reconciled(outcome="succeeded", external_ref="ch_1", result={"amount": 1200},
                      lookup="payments.find_charge", answer={"applied": True, "key": key})


def nothing(key: str) -> Reconciled:
    return Reconciled(outcome="not_applied", error_code="NOT_FOUND", lookup="payments.find_charge",
                      answer={"applied": False, "key": key})


def test_succeeded_is_replayed_without_running(rec_server: Any, uid: str) -> None:
    with Ledger(rec_server.url, backoff=0.01) as ledger:
        eff = interrupted(ledger, "payments.charge", uid)
        asked: List[str] = []
        runs: List[str] = []

        def lookup(key: str) -> Reconciled:
            asked.append(key)
            return found(key)

        res = ledger.do(eff, lambda key: runs.append(key), reconcile=lookup)
        assert res.replayed and res.reconciled and res.external_ref == "ch_1"
        assert res.result == {"amount": 1200}
        assert runs == [] and asked == [eff.resolved_key()]
        view = ledger.get_effect(eff.resolved_key())
        assert view["state"] == "succeeded"
        rec = view["receipts"][-1]
        assert rec["kind"] == "reconcile" and rec["note"] == (
            '{"answer":{"applied":true,"key":"%s"},"lookup":"payments.find_charge"}' % eff.resolved_key()
        )
        again = ledger.do(eff, lambda key: runs.append(key))
        assert again.replayed and not again.reconciled and runs == []


def test_not_applied_waits_out_the_settle_time_and_runs_once(rec_server: Any, uid: str) -> None:
    with Ledger(rec_server.url, backoff=0.01) as ledger:
        eff = interrupted(ledger, "payments.charge", uid)
        runs: List[str] = []
        start = time.monotonic()
        res = ledger.do(eff, lambda key: runs.append(key) or {"charged": True}, reconcile=nothing)
        assert not res.replayed and res.result == {"charged": True} and len(runs) == 1
        assert res.after_not_applied is not None and res.after_not_applied.error_code == "NOT_FOUND"
        assert time.monotonic() - start >= 0.2, "reconcile_too_early was waited out"
        assert ledger.get_effect(eff.resolved_key())["state"] == "succeeded"


def test_no_answer_leaves_unsafe_resume(rec_server: Any, uid: str) -> None:
    with Ledger(rec_server.url, backoff=0.01) as ledger:
        eff = interrupted(ledger, "payments.charge", uid)

        def lookup(key: str) -> Reconciled:
            raise TimeoutError("the provider did not answer")

        with pytest.raises(UnsafeResumeError) as err:
            ledger.do(eff, lambda key: pytest.fail("must not run"), reconcile=lookup)
        assert isinstance(err.value.__cause__, TimeoutError)
        assert ledger.get_effect(eff.resolved_key())["state"] == "interrupted"


def test_refusals(rec_server: Any, uid: str) -> None:
    with Ledger(rec_server.url, backoff=0.01) as ledger:
        # No rule for the tool: unsafe_resume, the refusal as its cause.
        eff = interrupted(ledger, "email.send", uid)
        with pytest.raises(UnsafeResumeError) as err:
            ledger.do(eff, lambda key: pytest.fail("must not run"), reconcile=found)
        assert isinstance(err.value.__cause__, ReconcileNotAllowedError)
        # Too early, and the wait is shorter than the settle time.
        eff = interrupted(ledger, "payments.charge", uid)
        with pytest.raises(ReconcileTooEarlyError) as early:
            ledger.reconcile(eff.resolved_key(), nothing(eff.resolved_key()))
        assert early.value.retry_after is not None
        with pytest.raises(InvalidRequestError):
            ledger.reconcile(eff.resolved_key(), Reconciled(outcome="failed", error_code="X", lookup="q", answer={}))
        rec = ledger.reconcile(eff.resolved_key(), found(eff.resolved_key()))
        assert rec["status"] == "reconciled" and rec["state"] == "succeeded"
        with pytest.raises(NotInterruptedError):
            ledger.reconcile(eff.resolved_key(), found(eff.resolved_key()))


def test_async_do_with_an_async_lookup(rec_server: Any, uid: str) -> None:
    with Ledger(rec_server.url, backoff=0.01) as sync:
        eff = interrupted(sync, "payments.charge", uid)

    async def main() -> Any:
        async def lookup(key: str) -> Reconciled:
            await asyncio.sleep(0)
            return found(key)

        async with AsyncLedger(rec_server.url, backoff=0.01) as ledger:
            res = await ledger.do(eff, lambda key: pytest.fail("must not run"), reconcile=lookup)
            rec = await ledger.get_effect(eff.resolved_key())
            return res, rec

    res, view = asyncio.run(main())
    assert res.replayed and res.reconciled and res.external_ref == "ch_1"
    assert view["state"] == "succeeded"
