"""The not_applied outcome (SPEC §4.1) against a real ledgerd: a failure
known to have applied nothing, after which the key runs again."""

from __future__ import annotations

import asyncio
import time
from typing import Any, List, Optional

import pytest

from effect_ledger import (
    AsyncLedger,
    Committed,
    Effect,
    EffectFailed,
    EffectNotApplied,
    InvalidRequestError,
    Ledger,
    NotAppliedRef,
    Reservation,
    RetryNotAllowedError,
    current_reservation,
    derive_key,
)


def last(ledger: Ledger, key: str) -> dict:
    return ledger.get_effect(key)["receipts"][-1]


def test_exception_commits_not_applied_and_the_next_call_runs_again(ledger: Ledger, uid: str) -> None:
    runs: List[Optional[Reservation]] = []
    orders = set()

    # Not idempotent: a failure would be final, not_applied is not.
    @ledger.effect(tool="payments.refund")
    def refund(order: str) -> dict:
        runs.append(current_reservation())
        if order not in orders:
            raise EffectNotApplied("ORDER_NOT_FOUND", "no order %s" % order)
        return {"refunded": order}

    with pytest.raises(EffectNotApplied) as err:
        refund(uid)
    assert isinstance(err.value, EffectFailed) and err.value.code == "ORDER_NOT_FOUND"
    assert not err.value.retryable and err.value.outcome == "not_applied"
    key = derive_key("payments.refund", {"order": uid})
    view = ledger.get_effect(key)
    assert view["state"] == "not_applied"
    commit = view["receipts"][-1]
    assert (commit["kind"], commit["outcome"], commit["error_code"], commit["error_message"]) == (
        "commit",
        "not_applied",
        "ORDER_NOT_FOUND",
        "no order " + uid,
    )
    assert commit["retryable"] is False and commit["external_ref"] == ""

    # The same call again (another execution) runs the function again.
    orders.add(uid)
    assert refund(uid) == {"refunded": uid}
    assert len(runs) == 2
    second = runs[1]
    assert second is not None and not second.retry and not second.takeover
    assert second.after_not_applied == NotAppliedRef(seq=commit["seq"], error_code="ORDER_NOT_FOUND")
    assert runs[0] is not None and runs[0].after_not_applied is None
    view = ledger.get_effect(key)
    assert view["state"] == "succeeded"
    assert [r["kind"] for r in view["receipts"]] == ["reserve", "commit", "reserve", "commit"]
    assert view["receipts"][2]["ref_seq"] == commit["seq"]

    # Then it is an ordinary success: replayed, not run.
    assert refund(uid) == {"refunded": uid} and len(runs) == 2


def test_do_not_applied_again_and_again(ledger: Ledger, uid: str) -> None:
    eff = Effect(tool="crm.update", input={"customer": uid})
    n = 0

    def update(key: str) -> str:
        nonlocal n
        n += 1
        if n < 3:
            raise EffectNotApplied("VALIDATION_FAILED", "attempt %d" % n)
        return "updated"

    for _ in range(2):
        with pytest.raises(EffectNotApplied):
            ledger.do(eff, update)
        assert ledger.get_effect(eff.resolved_key())["state"] == "not_applied"
    got = ledger.do(eff, update)
    assert (got.result, n, got.replayed) == ("updated", 3, False)
    assert got.after_not_applied is not None and got.after_not_applied.error_code == "VALIDATION_FAILED"
    assert ledger.do(eff, update).replayed and n == 3


def test_a_failure_is_still_final(ledger: Ledger, uid: str) -> None:
    # EffectFailed keeps its meaning: not retryable, so the key is done.
    @ledger.effect(tool="payments.refund")
    def refund(order: str) -> None:
        raise EffectFailed("REFUND_DECLINED", "declined after the transfer started")

    with pytest.raises(EffectFailed):
        refund(uid)
    assert ledger.get_effect(derive_key("payments.refund", {"order": uid}))["state"] == "failed"
    with pytest.raises(RetryNotAllowedError):
        refund(uid)


def test_context_manager_not_applied(ledger: Ledger, uid: str) -> None:
    with ledger.effect(tool="email.send", effect="external", input={"to": uid}) as eff:
        c = eff.not_applied("MAILBOX_UNKNOWN", "550 no such user")
        assert isinstance(c, Committed) and c.receipt is not None
        with pytest.raises(RuntimeError, match="already called"):
            eff.fail("X")
    assert eff.outcome == "not_applied" and eff.committed is c
    assert ledger.get_effect(eff.key)["state"] == "not_applied"
    assert last(ledger, eff.key)["error_code"] == "MAILBOX_UNKNOWN"

    # An EffectNotApplied escaping the block is committed as not_applied.
    with pytest.raises(EffectNotApplied):
        with ledger.effect(tool="email.send", effect="external", input={"to": uid}) as eff2:
            assert eff2.after_not_applied is not None and eff2.after_not_applied.seq == c.receipt.seq
            raise EffectNotApplied("MAILBOX_UNKNOWN", "still no such user")
    assert eff2.outcome == "not_applied"
    assert (last(ledger, eff2.key)["outcome"], last(ledger, eff2.key)["error_message"]) == (
        "not_applied",
        "still no such user",
    )

    with ledger.effect(tool="email.send", effect="external", input={"to": uid}) as eff3:
        assert not eff3.replayed
        eff3.succeed(result={"id": "m1"}, external_ref="m1")
    assert ledger.get_effect(eff3.key)["state"] == "succeeded"


def test_bad_code_is_refused_before_sending(ledger: Ledger, uid: str) -> None:
    with pytest.raises(ValueError, match="EffectNotApplied"):
        EffectNotApplied("not found")
    res = ledger.reserve(Effect(tool="t.na", input={"x": uid}))
    assert isinstance(res, Reservation)
    with pytest.raises(ValueError):
        ledger.not_applied(res, "lower")
    assert ledger.get_effect(res.key)["state"] == "reserved"


def test_low_level_commit_and_resolve(ledger: Ledger, uid: str) -> None:
    eff = Effect(tool="repo.push", input={"sha": uid})
    res = ledger.reserve(eff)
    assert isinstance(res, Reservation)
    c = ledger.not_applied(res, "BRANCH_PROTECTED", "push refused before any write")
    assert c.receipt is not None and not c.replayed
    again = ledger.not_applied(res, "BRANCH_PROTECTED", "push refused before any write")
    assert again.replayed and again.receipt == c.receipt  # a repeated commit is answered with the original
    res2 = ledger.reserve(eff)
    assert isinstance(res2, Reservation)
    assert res2.after_not_applied == NotAppliedRef(seq=c.receipt.seq, error_code="BRANCH_PROTECTED")
    ledger.succeed(res2, {"pushed": uid})

    # The ledger refuses an external_ref with not_applied: nothing was applied.
    res3 = ledger.reserve(Effect(tool="repo.push", input={"sha": uid + "ref"}))
    assert isinstance(res3, Reservation)
    body = dict(ledger._not_applied_body(res3.reservation, "X", ""), external_ref="abc")
    with pytest.raises(InvalidRequestError) as err:
        ledger._run(ledger._commit_flow(res3.key, body))
    assert err.value.details.get("field") == "external_ref"

    # Resolve: an interrupted key checked by an operator ("nothing happened").
    lost = Effect(tool="repo.push", input={"sha": uid + "lost"}, lease_ms=20)
    assert isinstance(ledger.reserve(lost), Reservation)
    time.sleep(0.1)
    assert ledger.get_effect(lost.resolved_key())["state"] == "interrupted"
    out = ledger.resolve(
        lost.resolved_key(), "checked the remote: no push", outcome="not_applied", error_code="NOT_PUSHED"
    )
    assert out["state"] == "not_applied"
    r = last(ledger, lost.resolved_key())
    assert (r["kind"], r["outcome"], r["error_code"], r["note"]) == (
        "resolve",
        "not_applied",
        "NOT_PUSHED",
        "checked the remote: no push",
    )
    assert ledger.do(lost, lambda key: "pushed").result == "pushed"

    # And an admin (any caller on a ledger without tokens) may correct a
    # failed key to not_applied.
    failed = Effect(tool="repo.push", input={"sha": uid + "failed"})

    def push(key: str) -> None:
        raise EffectFailed("PUSH_FAILED")

    with pytest.raises(EffectFailed):
        ledger.do(failed, push)
    with pytest.raises(RetryNotAllowedError):
        ledger.do(failed, push)
    ledger.resolve(
        failed.resolved_key(), "the push never reached the remote", outcome="not_applied", error_code="PUSH_FAILED"
    )
    assert ledger.get_effect(failed.resolved_key())["state"] == "not_applied"
    assert ledger.do(failed, lambda key: "pushed").result == "pushed"


def test_async_not_applied(server: Any, uid: str) -> None:
    async def main() -> None:
        async with AsyncLedger(server.url) as ledger:
            runs: List[Optional[Reservation]] = []

            @ledger.effect(tool="payments.capture")
            async def capture(order: str) -> dict:
                runs.append(current_reservation())
                if len(runs) == 1:
                    raise EffectNotApplied("CARD_DECLINED", "declined by the issuer")
                await asyncio.sleep(0)
                return {"captured": order}

            with pytest.raises(EffectNotApplied):
                await capture(uid)
            key = derive_key("payments.capture", {"order": uid})
            view = await ledger.get_effect(key)
            assert view["state"] == "not_applied"
            commit = view["receipts"][-1]
            assert (commit["outcome"], commit["error_code"]) == ("not_applied", "CARD_DECLINED")
            assert await capture(uid) == {"captured": uid}
            assert len(runs) == 2 and runs[1] is not None
            assert runs[1].after_not_applied == NotAppliedRef(seq=commit["seq"], error_code="CARD_DECLINED")
            assert await capture(uid) == {"captured": uid} and len(runs) == 2

            async with ledger.effect(tool="email.send", effect="external", input={"to": uid}) as eff:
                await eff.not_applied("MAILBOX_UNKNOWN")
            assert eff.outcome == "not_applied"
            assert (await ledger.get_effect(eff.key))["state"] == "not_applied"
            with pytest.raises(EffectNotApplied):
                async with ledger.effect(tool="email.send", effect="external", input={"to": uid}) as eff2:
                    raise EffectNotApplied("MAILBOX_UNKNOWN", "again")
            assert eff2.outcome == "not_applied"
            got = await ledger.do(Effect(tool="email.send", effect="external", input={"to": uid}), lambda k: "sent")
            assert got.result == "sent" and got.after_not_applied is not None

            res = await ledger.reserve(Effect(tool="t.na", input={"async": uid}))
            assert isinstance(res, Reservation)
            c = await ledger.not_applied(res, "INVALID_INPUT", "amount < 0")
            assert c.receipt is not None
            assert (await ledger.get_effect(res.key))["state"] == "not_applied"

    asyncio.run(main())
