"""Approvals and the gate's policy (SPEC §13) against a scripted ledger
(httpx.MockTransport) that answers the shapes of docs/design/approvals.md:
the server side is tested with the real ledgerd elsewhere."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Callable, Dict, List, Tuple

import httpx
import pytest

from effect_ledger import (
    AlreadyAnsweredError,
    ApprovalRejectedError,
    ApprovalRequiredError,
    ApprovalUse,
    AsyncLedger,
    Changed,
    Effect,
    LedgerError,
    Ledger,
    ReceiptRef,
    UnchangedRetryError,
    UnknownApprovalError,
)

FAR = 4102444800000  # 2100-01-01 in unix ms

ASK = {
    "status": "approval_required",
    "idempotency_key": "order-1234",
    "key_generated": False,
    "approval": {"seq": 7, "expires_at": FAR, "state": "pending"},
    "receipt": {"seq": 7, "hash": "aa"},
}
APPROVED = {
    "status": "reserved",
    "idempotency_key": "order-1234",
    "key_generated": False,
    "reservation": "rsv_" + "0" * 63 + "1",
    "attempt": 1,
    "lease_expires_at": FAR,
    "approval": {"seq": 8, "ask_seq": 7},
    "receipt": {"seq": 9, "hash": "dd"},
}
REJECTED = {
    "error": {
        "code": "approval_rejected",
        "message": "rejected by token:alice",
        "details": {"approval": {"seq": 8, "ask_seq": 7, "note": "too large", "actor": "token:alice"}},
    }
}
COMMITTED = {"status": "committed", "idempotency_key": "order-1234", "outcome": "succeeded", "late": False,
             "receipt": {"seq": 10, "hash": "ee"}}
PENDING = {
    "seq": 12, "idempotency_key": "k-order-1234", "execution_id": "exec-1", "attempt": 1,
    "tool": "payments.charge", "effect": "external", "idempotent": False, "input_hash": "sha256:ab",
    "summary": "charge 12 EUR", "actor": "token:agent", "asked_at": 1764475200000,
    "expires_at": 1764478800000, "state": "pending", "answer": None, "consumed_by": None,
}


def ask(**approval: Any) -> dict:
    return dict(ASK, approval=dict(ASK["approval"], **approval))


class Script:
    """Answers reserves from a list of (status, body), other requests from
    routes; records every request as (method, path, query, body)."""

    def __init__(self, reserves: List[Tuple[int, dict]], routes: Dict[str, Tuple[int, dict]] = {}) -> None:
        self.reserves = list(reserves)
        self.routes = dict(routes)
        self.requests: List[Tuple[str, str, str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        query = request.url.query.decode() if isinstance(request.url.query, bytes) else str(request.url.query)
        self.requests.append((request.method, request.url.path, query, body))
        if request.url.path.endswith("/effects/reserve"):
            status, answer = self.reserves.pop(0)
        elif request.url.path.endswith("/commit"):
            status, answer = 201, COMMITTED
        else:
            status, answer = self.routes.get(
                request.method + " " + request.url.path,
                (404, {"error": {"code": "not_found", "message": request.url.path}}),
            )
        return httpx.Response(status, json=answer)

    def reserve_bodies(self) -> List[dict]:
        return [b for (_, path, _, b) in self.requests if path.endswith("/effects/reserve")]


def ledger_for(script: Callable, **options: Any) -> Ledger:
    return Ledger("http://ledger.test", client=httpx.Client(transport=httpx.MockTransport(script)), **options)


def charge(**kw: Any) -> Effect:
    return Effect(tool="payments.charge", effect="external", key="order-1234", input={"amount": 1200},
                  approval_summary="charge 12 EUR", **kw)


def test_reserve_raises_approval_required_with_the_ask() -> None:
    script = Script([(202, ASK)])
    with ledger_for(script) as ledger:
        with pytest.raises(ApprovalRequiredError) as err:
            ledger.reserve(charge(changed=Changed(strategy="smaller amount")))
    e = err.value
    assert isinstance(e, LedgerError) and e.code == "approval_required" and e.status == 202
    assert (e.key, e.seq, e.expires_at, e.state, e.expired) == ("order-1234", 7, FAR, "pending", False)
    assert e.receipt == ReceiptRef(seq=7, hash="aa")
    assert e.url == "http://ledger.test/ui/#approvals/7", "the page where a person answers it, as ledger-mcp names it"
    for want in ("ask 7", "expires 2100-01-01T00:00:00Z", "http://ledger.test/ui/#approvals/7",
                 "ledgerctl approvals approve 7 --server http://ledger.test)"):
        assert want in str(e), str(e)
    body = script.reserve_bodies()[0]
    assert body["input"] == {"amount": 1200}
    assert body["approval_summary"] == "charge 12 EUR"
    assert body["changed"] == {"strategy": "smaller amount"}
    assert "wait_ms" not in body


def test_do_does_not_run_a_call_awaiting_approval() -> None:
    calls: List[str] = []
    with ledger_for(Script([(202, ASK)])) as ledger:
        with pytest.raises(ApprovalRequiredError):
            ledger.do(charge(changed={"context_hash": "sha256:ab"}), calls.append)
    assert calls == []


def test_do_waits_for_the_approval_and_runs_once() -> None:
    script = Script([(202, ASK), (202, ASK), (201, APPROVED)])
    calls: List[str] = []
    with ledger_for(script, approval_wait=30) as ledger:
        got = ledger.do(charge(), lambda key: calls.append(key) or {"charged": True})
    assert calls == ["order-1234"]
    assert got.approval == ApprovalUse(seq=8, ask_seq=7)
    assert got.reservation is not None and got.reservation.approval == got.approval
    bodies = script.reserve_bodies()
    assert "wait_ms" not in bodies[0]
    assert all(0 < b["wait_ms"] <= 30_000 for b in bodies[1:]), "the ledger is asked to wait for the answer"


def test_a_rejection_raises_approval_rejected() -> None:
    calls: List[str] = []
    with ledger_for(Script([(202, ASK), (409, REJECTED)])) as ledger:
        with pytest.raises(ApprovalRejectedError) as err:
            ledger.do(charge(), calls.append, approval_wait=30)
    assert calls == []
    assert err.value.approval == {"seq": 8, "ask_seq": 7, "note": "too large", "actor": "token:alice"}


def test_an_expired_ask_ends_the_wait_without_asking_again() -> None:
    script = Script([(202, ask(expires_at=1000))])
    with ledger_for(script) as ledger:
        with pytest.raises(ApprovalRequiredError) as err:
            ledger.reserve(charge(), approval_wait=30)
    assert err.value.expired and err.value.seq == 7
    assert len(script.reserve_bodies()) == 1


def test_a_new_ask_ends_the_wait() -> None:
    with ledger_for(Script([(202, ASK), (202, ask(seq=9))])) as ledger:
        with pytest.raises(ApprovalRequiredError) as err:
            ledger.reserve(charge(), approval_wait=30)
    assert err.value.expired and err.value.seq == 9


def test_the_wait_runs_out() -> None:
    script = Script([(202, ASK)] * 50)
    with ledger_for(script, approval_wait=0.2) as ledger:
        start = time.monotonic()
        with pytest.raises(ApprovalRequiredError) as err:
            ledger.reserve(charge())
    assert not err.value.expired
    assert 0.2 <= time.monotonic() - start < 5


def test_a_ledger_without_wait_ms_is_polled() -> None:
    bad = {"error": {"code": "invalid_request", "message": "unknown field", "details": {"field": "wait_ms"}}}
    script = Script([(202, ASK), (400, bad), (201, APPROVED)])
    with ledger_for(script, approval_wait=30) as ledger:
        res = ledger.reserve(charge())
    assert res.approval == ApprovalUse(seq=8, ask_seq=7)
    assert "wait_ms" not in script.reserve_bodies()[2]


def test_unchanged_retry_is_typed() -> None:
    refused = {"error": {"code": "unchanged_retry", "message": "the same call failed",
                         "details": {"failed": {"idempotency_key": "k1", "seq": 3, "error_code": "DECLINED",
                                                "error_message": "no"}}}}
    with ledger_for(Script([(409, refused)])) as ledger:
        with pytest.raises(UnchangedRetryError) as err:
            ledger.reserve(charge())
    assert err.value.details["failed"]["error_code"] == "DECLINED"


POLICY = {"rules": [{"tool": "payments.*", "approval": "required", "approvers": ["role:approver"]}]}


def approver_script() -> Script:
    answered = dict(PENDING, state="approved", answer={"seq": 13, "decision": "approve", "actor": "token:alice",
                                                       "role": "approver", "note": "ok", "recorded_at": 1764475260000})
    return Script([], {
        "GET /v1/namespaces/default/policy": (200, {"namespace": "default", "policy": {}, "seq": 0}),
        "GET /v1/namespaces/payments/policy": (200, {"namespace": "payments", "policy": POLICY, "seq": 3}),
        "PUT /v1/namespaces/payments/policy": (200, {"namespace": "payments", "policy": POLICY, "seq": 5,
                                                     "changed": True, "receipt": {"seq": 5, "hash": "ee"}}),
        "GET /v1/ns/payments/approvals": (200, {"approvals": [PENDING], "next_after": None}),
        "GET /v1/ns/payments/approvals/12": (200, dict(PENDING, input={"amount": 1200}, input_verified=True)),
        "GET /v1/ns/payments/approvals/13": (404, {"error": {"code": "unknown_approval", "message": "no ask"}}),
        "POST /v1/ns/payments/approvals/12": (201, answered),
        "POST /v1/ns/payments/approvals/14": (409, {"error": {"code": "already_answered", "message": "rejected"}}),
    })


def test_policy_routes() -> None:
    script = approver_script()
    with ledger_for(script) as ledger:
        assert ledger.policy() == {"namespace": "default", "policy": {}, "seq": 0}
    with ledger_for(script, namespace="payments") as ledger:
        assert ledger.policy()["seq"] == 3
        got = ledger.set_policy(POLICY)
        assert got["changed"] is True and got["receipt"] == {"seq": 5, "hash": "ee"}
    assert script.requests[-1] == ("PUT", "/v1/namespaces/payments/policy", "", POLICY)


def test_approvals_list_show_answer() -> None:
    script = approver_script()
    with ledger_for(script, namespace="payments") as ledger:
        page = ledger.approvals(state="pending", after=11, limit=2)
        assert page["approvals"][0]["seq"] == 12 and page["next_after"] is None
        method, path, query, _ = script.requests[-1]
        assert (method, path) == ("GET", "/v1/ns/payments/approvals")
        assert dict(p.split("=") for p in query.split("&")) == {"state": "pending", "after": "11", "limit": "2"}

        shown = ledger.approval(12)
        assert shown["input"] == {"amount": 1200} and shown["input_verified"] is True
        with pytest.raises(UnknownApprovalError):
            ledger.approval(13)

        answered = ledger.approve(12, note="ok")
        assert answered["answer"]["decision"] == "approve"
        assert script.requests[-1][3] == {"decision": "approve", "note": "ok"}
        with pytest.raises(AlreadyAnsweredError):
            ledger.reject(14)
        assert script.requests[-1][3] == {"decision": "reject"}
        with pytest.raises(ValueError):
            ledger.answer(12, "maybe")


def test_async_approvals() -> None:
    async def main() -> None:
        script = Script([(202, ASK), (201, APPROVED)])
        client = httpx.AsyncClient(transport=httpx.MockTransport(script))
        async with AsyncLedger("http://ledger.test", client=client) as ledger:
            with pytest.raises(ApprovalRequiredError):
                await ledger.reserve(charge())
            script.reserves = [(202, ASK), (201, APPROVED)]
            got = await ledger.do(charge(), lambda key: {"ok": True}, approval_wait=30)
            assert got.approval == ApprovalUse(seq=8, ask_seq=7)
        await client.aclose()

        script = approver_script()
        client = httpx.AsyncClient(transport=httpx.MockTransport(script))
        async with AsyncLedger("http://ledger.test", client=client, namespace="payments") as ledger:
            assert (await ledger.policy())["seq"] == 3
            assert (await ledger.approvals())["approvals"][0]["state"] == "pending"
            assert (await ledger.approve(12))["state"] == "approved"
        await client.aclose()

    asyncio.run(main())
