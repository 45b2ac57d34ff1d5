"""The sync client against a real ledgerd."""

from __future__ import annotations

import threading
import time
from typing import Any, List

import httpx
import pytest

from effect_ledger import (
    AttemptConflictError,
    Effect,
    EffectFailed,
    FingerprintMismatchError,
    InProgressError,
    InvalidKeyError,
    Ledger,
    LedgerError,
    Outcome,
    Reservation,
    ResultNotRecordedError,
    RetryNotAllowedError,
    StaleReservationError,
    UnknownKeyError,
    UnsafeResumeError,
    current_reservation,
    derive_key,
    execution,
    fingerprint,
)


def kinds(ledger: Ledger, key: str) -> List[str]:
    return [r["kind"] for r in ledger.get_effect(key)["receipts"]]


class Calls:
    """A function that counts its calls and returns what it is given."""

    def __init__(self, value: Any = None) -> None:
        self.n = 0
        self.keys: List[str] = []
        self.value = value

    def __call__(self, key: str) -> Any:
        self.n += 1
        self.keys.append(key)
        return self.value


def test_do_reserves_runs_and_commits(ledger: Ledger, uid: str) -> None:
    eff = Effect(tool="payments.refund", idempotent=True, input={"order": uid, "amount": 1200})
    fn = Calls(Outcome(result={"amount": 1200, "currency": "eur"}, external_ref="re_" + uid))
    got = ledger.do(eff, fn)
    assert fn.n == 1
    assert fn.keys == [derive_key("payments.refund", {"order": uid, "amount": 1200})]
    assert (got.replayed, got.recorded, got.result, got.external_ref) == (
        False,
        True,
        {"amount": 1200, "currency": "eur"},
        "re_" + uid,
    )
    assert got.receipt is not None and got.receipt.seq > 0 and len(got.receipt.hash) == 64
    state = ledger.get_effect(got.key)
    assert state["state"] == "succeeded"
    assert state["input_hash"] == fingerprint({"amount": 1200, "order": uid})
    commit = state["receipts"][-1]
    assert (commit["kind"], commit["outcome"], commit["external_ref"], commit["result"]) == (
        "commit",
        "succeeded",
        "re_" + uid,
        {"amount": 1200, "currency": "eur"},
    )


def test_do_replay_does_not_run_again(ledger: Ledger, uid: str) -> None:
    eff = Effect(tool="email.send", effect="external", input={"to": uid})
    first = ledger.do(eff, Calls({"id": "m1"}))
    again = Calls({"id": "m2"})
    got = ledger.do(eff, again)  # a new execution of the same call
    assert again.n == 0
    assert got.replayed and got.result == {"id": "m1"} and got.key == first.key
    assert got.original == first.receipt
    assert got.receipt is not None and got.receipt.seq > first.receipt.seq  # type: ignore[union-attr]
    assert kinds(ledger, got.key) == ["reserve", "commit", "replay"]


def test_fingerprint_matches_server_for_tricky_input(ledger: Ledger, uid: str) -> None:
    # Member order, UTF-16 sorting, number spelling and escapes must agree
    # with the ledger's RFC 8785 implementation.
    value = {
        "z": [1.0, 1e21, 1e-7, -0.0, 0.1, 123456789012345680000, 5e-324, 333333333.33333325],
        "\u20ac": "euro",
        "\U0001f600": "emoji sorts by UTF-16",
        "\ufb01": "after the surrogate pair",
        "a": {"ctl": "\x00\x1f\t\n\"\\/\u2028\x7f", "t": True, "n": None},
        "id": uid,
    }
    got = ledger.do(Effect(tool="canon.check", input=value), Calls())
    assert ledger.get_effect(got.key)["input_hash"] == fingerprint(value)


def test_context_manager(ledger: Ledger, uid: str) -> None:
    with ledger.effect(tool="payments.charge", idempotent=True, input={"cart": uid}) as eff:
        assert not eff.replayed and eff.reservation is not None
        assert current_reservation() == eff.reservation
        c = eff.succeed(result={"charge": "ch_1"}, external_ref="ch_1")
        assert c is not None and not c.replayed and c.outcome == "succeeded"
    assert current_reservation() is None
    with ledger.effect(tool="payments.charge", idempotent=True, input={"cart": uid}) as eff2:
        assert eff2.replayed
        assert (eff2.result, eff2.external_ref, eff2.outcome) == ({"charge": "ch_1"}, "ch_1", "succeeded")
        assert eff2.reservation is None and eff2.replay is not None
        with pytest.raises(RuntimeError, match="replayed"):
            eff2.succeed(result=1)
    assert kinds(ledger, eff.key) == ["reserve", "commit", "replay"]


def test_context_manager_leaving_block_commits_success(ledger: Ledger, uid: str) -> None:
    with ledger.effect(tool="repo.push", input={"sha": uid}) as eff:
        pass
    state = ledger.get_effect(eff.key)
    assert state["state"] == "succeeded" and state["receipts"][-1]["result"] is None
    assert eff.committed is not None and eff.outcome == "succeeded"


def test_context_manager_exception_commits_failure(ledger: Ledger, uid: str) -> None:
    with pytest.raises(TimeoutError):
        with ledger.effect(tool="repo.push", idempotent=True, input={"sha": uid}) as eff:
            raise TimeoutError("remote hung up")
    commit = ledger.get_effect(eff.key)["receipts"][-1]
    assert (commit["outcome"], commit["error_code"], commit["error_message"], commit["retryable"]) == (
        "failed",
        "TIMEOUT_ERROR",
        "TimeoutError: remote hung up",
        False,
    )


def test_context_manager_fail(ledger: Ledger, uid: str) -> None:
    with ledger.effect(tool="email.send", effect="external", input={"to": uid}) as eff:
        eff.fail("MAILBOX_FULL", "452 mailbox full", retryable=True)
        with pytest.raises(RuntimeError, match="already called"):
            eff.succeed()
    state = ledger.get_effect(eff.key)
    assert state["state"] == "failed" and state["receipts"][-1]["error_code"] == "MAILBOX_FULL"
    with pytest.raises(ValueError):
        with ledger.effect(tool="email.send", effect="external", input={"to": uid, "n": 2}) as eff:
            eff.fail("lower case")
    # A bad code is refused before anything is committed; the block's
    # ValueError is then committed as the failure.
    assert ledger.get_effect(eff.key)["receipts"][-1]["error_code"] == "VALUE_ERROR"


def test_keyboard_interrupt_leaves_the_key_reserved(ledger: Ledger, uid: str) -> None:
    with pytest.raises(KeyboardInterrupt):
        with ledger.effect(tool="payments.charge", input={"cart": uid}) as eff:
            raise KeyboardInterrupt
    # Whether the charge happened is unknown: nothing is committed, the
    # lease ends and the key becomes interrupted.
    assert ledger.get_effect(eff.key)["state"] == "reserved"


def test_decorator(ledger: Ledger, uid: str) -> None:
    calls: List[tuple] = []

    @ledger.effect(tool="payments.refund", effect="write", idempotent=True)
    def refund(order_id: str, amount: int, currency: str = "eur") -> dict:
        calls.append((order_id, amount, currency))
        k = current_reservation()
        assert k is not None
        return {"refund": "re_" + order_id, "amount": amount, "key": k.key}

    assert refund.__name__ == "refund"
    first = refund(uid, 1200)
    # The same call spelled differently is the same effect: replayed.
    assert refund(amount=1200, order_id=uid) == first
    assert refund(uid, 1200, "eur") == first
    assert calls == [(uid, 1200, "eur")]
    key = derive_key("payments.refund", {"order_id": uid, "amount": 1200, "currency": "eur"})
    assert first["key"] == key
    assert kinds(ledger, key) == ["reserve", "commit", "replay", "replay"]
    refund(uid, 1300)  # another input, another effect
    assert len(calls) == 2


def test_decorator_custom_key_and_input(ledger: Ledger, uid: str) -> None:
    n = []

    @ledger.effect(
        tool="crm.note",
        input=lambda customer, text, request_id: {"customer": customer, "text": text},
        key=lambda customer, text, request_id: "note-" + request_id,
    )
    def add_note(customer: str, text: str, request_id: str) -> str:
        n.append(1)
        return "ok"

    assert add_note("c1", "hello", uid) == "ok"
    assert add_note("c1", "hello", uid) == "ok"
    assert len(n) == 1
    assert ledger.get_effect("note-" + uid)["input_hash"] == fingerprint({"customer": "c1", "text": "hello"})
    with pytest.raises(FingerprintMismatchError):
        add_note("c1", "other text", uid)
    with pytest.raises(TypeError):
        ledger.effect(tool="x", input={"constant": 1})(lambda: None)


def test_decorator_method_skips_self(ledger: Ledger, uid: str) -> None:
    class Mailer:
        sent = 0

        @ledger.effect(tool="email.send", effect="external")
        def send(self, to: str) -> str:
            Mailer.sent += 1
            return "sent"

    Mailer().send(uid)
    Mailer().send(uid)
    assert Mailer.sent == 1
    assert ledger.get_effect(derive_key("email.send", {"to": uid}))["state"] == "succeeded"


def test_failure_retryable_is_retried(ledger: Ledger, uid: str) -> None:
    runs = []

    @ledger.effect(tool="payments.capture", idempotent=True)
    def capture(order: str) -> str:
        runs.append(current_reservation())
        if len(runs) == 1:
            raise EffectFailed("PSP_TIMEOUT", "no answer in 10s", retryable=True)
        return "captured"

    with pytest.raises(EffectFailed):
        capture(uid)
    assert capture(uid) == "captured"
    assert len(runs) == 2 and runs[1].retry and not runs[0].retry
    assert capture(uid) == "captured" and len(runs) == 2
    key = derive_key("payments.capture", {"order": uid})
    assert kinds(ledger, key) == ["reserve", "commit", "reserve", "commit", "replay"]


@pytest.mark.parametrize(
    "desc,idempotent,exc,retry_on",
    [
        ("not retryable", True, ValueError("bad amount"), ()),
        ("retryable but handler not idempotent", False, EffectFailed("PSP_DOWN", retryable=True), ()),
    ],
)
def test_failure_not_retried(
    ledger: Ledger, uid: str, desc: str, idempotent: bool, exc: Exception, retry_on: tuple
) -> None:
    runs = []

    @ledger.effect(tool="payments.capture", idempotent=idempotent, retry_on=retry_on)
    def capture(order: str) -> None:
        runs.append(1)
        raise exc

    with pytest.raises(type(exc)):
        capture(uid)
    with pytest.raises(RetryNotAllowedError) as err:
        capture(uid)
    assert len(runs) == 1, desc
    assert err.value.status == 409 and err.value.code == "retry_not_allowed"
    assert err.value.details, "details carry the recorded failure"


def test_retryable_exceptions(ledger: Ledger, uid: str) -> None:
    class Transient(Exception):
        retryable = True

    for i, (exc, retry_on) in enumerate([(Transient("flaky"), ()), (ConnectionResetError("reset"), (OSError,))]):
        eff = Effect(tool="queue.publish", idempotent=True, input={"msg": uid, "i": i})

        def boom(key: str, exc: Exception = exc) -> None:
            raise exc

        with pytest.raises(type(exc)):
            ledger.do(eff, boom, retry_on=retry_on)
        commit = ledger.get_effect(eff.resolved_key())["receipts"][-1]
        assert commit["retryable"] is True, commit
    assert ledger.do(eff, Calls("ok")).reservation.retry  # type: ignore[union-attr]


def test_fingerprint_mismatch(ledger: Ledger, uid: str) -> None:
    key = "order-" + uid
    ledger.do(Effect(tool="payments.refund", input={"amount": 1}, key=key), Calls())
    fn = Calls()
    with pytest.raises(FingerprintMismatchError) as err:
        ledger.do(Effect(tool="payments.refund", input={"amount": 2}, key=key), fn)
    assert fn.n == 0
    e = err.value
    assert (e.status, e.code) == (422, "fingerprint_mismatch")
    assert e.details["tool"] == "payments.refund" and e.details["input_hash"] == fingerprint({"amount": 1})
    assert isinstance(e, LedgerError)


def test_unsafe_resume_and_takeover(ledger: Ledger, uid: str) -> None:
    for idempotent in (False, True):
        eff = Effect(tool="payments.charge", idempotent=idempotent, input={"cart": uid, "i": idempotent}, lease_ms=50)
        res = ledger.reserve(eff)
        assert isinstance(res, Reservation)
        time.sleep(0.2)  # the gateway died: the lease ends without a commit
        fn = Calls("charged")
        if not idempotent:
            with pytest.raises(UnsafeResumeError) as err:
                ledger.do(eff, fn)
            assert fn.n == 0 and err.value.status == 409
            continue
        seen = []
        got = ledger.do(eff, lambda key: seen.append(current_reservation()) or "charged")
        assert got.result == "charged" and seen[0].takeover and got.reservation.takeover  # type: ignore[union-attr]
        # The late commit of the first reservation is refused.
        with pytest.raises(StaleReservationError):
            ledger.succeed(res, result="late")


def test_wait_for_in_progress_replay(ledger: Ledger, uid: str) -> None:
    eff = Effect(tool="payments.refund", idempotent=True, input={"order": uid}, lease_ms=20_000)
    held = ledger.reserve(eff)
    assert isinstance(held, Reservation)
    t = threading.Timer(0.5, lambda: ledger.succeed(held, result={"ok": True}))
    t.start()
    fn = Calls()
    start = time.monotonic()
    got = ledger.do(eff, fn, wait=10)
    t.join()
    assert fn.n == 0, "the waiter must not run the effect"
    assert got.replayed and got.result == {"ok": True}
    assert 0.4 < time.monotonic() - start < 5


def test_wait_for_in_progress_failure_then_retry(ledger: Ledger, uid: str) -> None:
    eff = Effect(tool="payments.refund", idempotent=True, input={"order": uid}, lease_ms=20_000)
    held = ledger.reserve(eff)
    assert isinstance(held, Reservation)
    t = threading.Timer(0.3, lambda: ledger.fail(held, "PSP_DOWN", retryable=True))
    t.start()
    got = ledger.do(eff, Calls("done"), wait=10)
    t.join()
    assert not got.replayed and got.result == "done" and got.reservation.retry  # type: ignore[union-attr]


def test_wait_deadline(ledger: Ledger, uid: str) -> None:
    eff = Effect(tool="payments.refund", input={"order": uid}, lease_ms=20_000)
    assert isinstance(ledger.reserve(eff), Reservation)
    start = time.monotonic()
    with pytest.raises(InProgressError) as err:
        ledger.do(eff, Calls(), wait=0.5)
    took = time.monotonic() - start
    assert 0.45 < took < 3, took
    assert err.value.retry_after is not None and 0 < err.value.retry_after <= 20
    assert err.value.details["lease_expires_at"] > 0
    start = time.monotonic()
    with pytest.raises(InProgressError):
        ledger.do(eff, Calls(), wait=0)
    assert time.monotonic() - start < 0.5


def test_wait_uses_wait_ms_when_the_server_has_it(ledger: Ledger, server: Any, uid: str) -> None:
    # Ask the server directly whether it knows wait_ms (SPEC §8) and check
    # the client found out the same while waiting.
    r = httpx.post(
        server.url + "/v1/effects/reserve",
        json={"execution_id": "probe", "tool": "probe", "effect": "write", "wait_ms": 1},
    )
    has_wait = r.status_code != 400
    eff = Effect(tool="probe.wait", input={"id": uid}, lease_ms=20_000)
    assert isinstance(ledger.reserve(eff), Reservation)
    start = time.monotonic()
    with pytest.raises(InProgressError):
        ledger.do(eff, Calls(), wait=0.4)
    assert time.monotonic() - start >= 0.35
    assert ledger.server_waits is has_wait


def test_typed_errors(ledger: Ledger, uid: str) -> None:
    with pytest.raises(InvalidKeyError) as err:
        ledger.do(Effect(tool="t", key="has a space " + uid), Calls())
    assert err.value.status == 400
    with pytest.raises(UnknownKeyError):
        ledger.get_effect("no-such-key-" + uid)
    eff = Effect(tool="t", idempotent=True, key="attempts-" + uid, execution_id="exec-" + uid, attempt=2)
    def fail_retryable(key: str) -> None:
        raise EffectFailed("X", retryable=True)

    with pytest.raises(EffectFailed):
        ledger.do(eff, fail_retryable)
    with pytest.raises(AttemptConflictError):
        ledger.do(eff, Calls())  # same execution, same attempt
    with execution("exec-" + uid, attempt=3):
        assert ledger.do(Effect(tool="t", idempotent=True, key="attempts-" + uid), Calls(1)).result == 1
    rs = ledger.get_effect("attempts-" + uid)["receipts"]
    assert [(r["kind"], r["execution_id"], r["attempt"]) for r in rs] == [
        ("reserve", "exec-" + uid, 2),
        ("commit", "exec-" + uid, 2),
        ("reserve", "exec-" + uid, 3),
        ("commit", "exec-" + uid, 3),
    ]


def test_keys_needing_escapes_and_generated_keys(ledger: Ledger, uid: str) -> None:
    key = "a/b%2F?c#d&" + uid
    got = ledger.do(Effect(tool="t", key=key), Calls("x"))
    assert got.key == key and ledger.get_effect(key)["state"] == "succeeded"
    a = ledger.do(Effect(tool="t", key=""), Calls())
    b = ledger.do(Effect(tool="t", key=""), Calls())
    assert a.key.startswith("gen_") and b.key.startswith("gen_") and a.key != b.key
    with pytest.raises(ValueError, match="key= or input="):
        ledger.do(Effect(tool="t"), Calls())


def test_read_effects_skip_the_ledger(ledger: Ledger, uid: str) -> None:
    n = []

    @ledger.effect(tool="search." + uid, effect="read")
    def search(q: object) -> str:
        n.append(1)
        return "hits"

    assert search(object()) == "hits" and search(object()) == "hits"  # input need not be JSON
    assert len(n) == 2
    assert ledger.receipts(tool="search." + uid)["receipts"] == []
    with ledger.effect(tool="search." + uid, effect="none", key="k-" + uid) as eff:
        assert not eff.recorded and eff.key == "k-" + uid and eff.succeed() is None


def test_result_not_json(ledger: Ledger, uid: str) -> None:
    eff = Effect(tool="t", input={"id": uid})
    with pytest.raises(ResultNotRecordedError) as err:
        ledger.do(eff, lambda key: {"when": object()})
    assert err.value.key == eff.resolved_key()
    # Recorded as a success without a result: it is not run again.
    fn = Calls()
    got = ledger.do(eff, fn)
    assert got.replayed and got.result is None and fn.n == 0


def test_execution_context_and_receipts(ledger: Ledger, uid: str) -> None:
    with execution("call_" + uid, attempt=2):
        got = ledger.do(Effect(tool="t", input={"id": uid}), Calls())
    page = ledger.receipts(execution_id="call_" + uid)
    assert [(r["kind"], r["attempt"]) for r in page["receipts"]] == [("reserve", 2), ("commit", 2)]
    assert page["next_after"] is None
    head = ledger.head()
    assert head.seq >= got.receipt.seq  # type: ignore[union-attr]
