"""Namespaces (SPEC §7) against a real ledgerd: each is a chain of its own."""

from __future__ import annotations

import asyncio
from typing import Any, List

import pytest
from conftest import ledgerctl

from effect_ledger import AsyncLedger, Effect, ForbiddenError, Ledger, UnknownNamespaceError


def test_namespace_is_its_own_chain(server: Any, bins: Any, uid: str) -> None:
    ns = "pay-" + uid
    # beside the running ledgerd; inline like its default namespace, so that
    # both derive the same dk_ key (a committed one keys its own, §14)
    ledgerctl(bins, "namespace", "create", "--db", str(server.db), ns, "--payloads", "inline")
    runs: List[str] = []
    effect = Effect(tool="payments.refund", input={"order": uid})
    with Ledger(server.url, namespace=ns) as pay, Ledger(server.url, namespace="default") as dflt:
        assert pay.head().seq == 0
        first = pay.do(effect, lambda key: runs.append("pay") or {"refunded": 1})
        again = pay.do(effect, lambda key: runs.append("again"))
        assert again.replayed and again.key == first.key
        other = dflt.do(effect, lambda key: runs.append("default") or {"refunded": 2})
        assert other.key == first.key, "the same key"
        assert not other.replayed, "in another namespace it is another effect"
        assert runs == ["pay", "default"]
        assert pay.head().seq == 3  # reserve, commit, replay
        assert pay.get_effect(first.key)["state"] == "succeeded"
        assert [r["seq"] for r in pay.get_effect(first.key)["receipts"]] == [1, 2, 3]

    async def run() -> None:
        async with AsyncLedger(server.url, namespace=ns) as c:
            assert (await c.head()).seq == 3
            got = await c.do(effect, lambda key: runs.append("async"))
            assert got.replayed

    asyncio.run(run())
    assert runs == ["pay", "default"]


def test_unknown_and_invalid_namespace(server: Any) -> None:
    with Ledger(server.url, namespace="no-such-ns") as c:
        with pytest.raises(UnknownNamespaceError) as err:
            c.head()
        assert err.value.status == 404
    for bad in ("Payments", "a/b", "", "x" * 65):
        with pytest.raises(ValueError):
            Ledger(server.url, namespace=bad)


def test_token_limited_to_a_namespace(start_ledgerd: Any, bins: Any, uid: str) -> None:
    d, _ = start_ledgerd(tokens=[("admin", "ops")])
    ledgerctl(bins, "namespace", "create", "--db", str(d.db), "pay")
    token = ledgerctl(
        bins, "token", "create", "--db", str(d.db), "--role", "writer", "--name", "pay-gw", "--namespace", "pay"
    ).strip()
    effect = Effect(tool="payments.refund", input={"order": uid})
    with Ledger(d.url, token=token, namespace="pay") as pay:
        assert pay.do(effect, lambda key: {"ok": True}).recorded
    with Ledger(d.url, token=token) as dflt:
        with pytest.raises(ForbiddenError) as err:
            dflt.do(effect, lambda key: pytest.fail("must not run"))
        assert err.value.status == 403
