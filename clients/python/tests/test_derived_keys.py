"""Derived keys in a committed namespace (SPEC §14) against a real ledgerd:
``dk2_`` with the namespace's derivation key, fetched once per client;
``dk_`` in an inline namespace."""

from __future__ import annotations

import asyncio
from typing import Any, List

import httpx
import pytest

from effect_ledger import AsyncLedger, DerivationKey, Effect, Ledger, derive_key
from effect_ledger.errors import ConnectionFailedError


@pytest.fixture(scope="module")
def committed(start_ledgerd: Any) -> Any:
    """A ledgerd whose default namespace commits its payloads, with an
    inline namespace "plain"."""
    d, _ = start_ledgerd("--default-payloads", "committed")
    r = httpx.post(d.url + "/v1/namespaces", json={"name": "plain", "payloads": "inline"})
    assert r.status_code == 201, r.text
    return d


def served_key(url: str, prefix: str) -> DerivationKey:
    r = httpx.get(url + prefix + "/derivation-key")
    assert r.status_code == 200, r.text
    return DerivationKey(payloads=r.json()["payloads"], key=bytes.fromhex(r.json()["key"]))


def test_committed_namespace_derives_dk2(committed: Any, uid: str) -> None:
    dk = served_key(committed.url, "/v1")
    assert dk.committed
    effect = Effect(tool="crm.contact.upsert", input={"contact": uid, "name": "Zoë"})
    want = derive_key(effect.tool, effect.input, dk.key)
    assert want.startswith("dk2_")
    asked: List[str] = []
    hooks = {"request": [lambda req: asked.append(req.url.path)]}
    runs: List[str] = []
    with httpx.Client(event_hooks=hooks) as hc, Ledger(committed.url, client=hc) as c:
        first = c.do(effect, lambda key: runs.append(key) or {"ok": 1})
        assert first.key == want and runs == [want]
        second = c.do(Effect(tool="crm.contact.upsert", input={"contact": uid, "name": "Zoé"}), lambda key: {"ok": 2})
        assert second.key.startswith("dk2_") and second.key != want
        assert c.derivation_key() == dk
        assert asked.count("/v1/derivation-key") == 1, "fetched once per client"
        # A read skips the ledger: its key is dk_, and nothing is asked.
        with Ledger(committed.url, client=hc) as fresh:
            read = fresh.do(Effect(tool="crm.contact.get", effect="read", input={"contact": uid}), lambda key: key)
            assert read.result == derive_key("crm.contact.get", {"contact": uid})
        assert asked.count("/v1/derivation-key") == 1

    async def again() -> Any:
        async with AsyncLedger(committed.url) as a:
            return await a.do(effect, lambda key: runs.append("again"))

    replay = asyncio.run(again())
    assert replay.replayed and replay.key == want
    assert runs == [want]


def test_decorator_derives_dk2(committed: Any, uid: str) -> None:
    dk = served_key(committed.url, "/v1")
    with Ledger(committed.url) as c:

        @c.effect(tool="mail.send", effect="external")
        def send(to: str) -> dict:
            return {"to": to}

        send(uid)
        want = derive_key("mail.send", {"to": uid}, dk.key)
        assert c.get_effect(want)["state"] == "succeeded"


def test_inline_namespace_derives_dk(committed: Any, uid: str) -> None:
    dk = served_key(committed.url, "/v1/ns/plain")
    assert not dk.committed
    effect = Effect(tool="crm.contact.upsert", input={"contact": uid})
    with Ledger(committed.url, namespace="plain") as c:
        got = c.do(effect, lambda key: {"ok": 1})
        assert got.key == derive_key(effect.tool, effect.input)
        assert got.key.startswith("dk_")


def test_failed_fetch_is_not_kept(committed: Any, uid: str) -> None:
    """A derivation key the ledger could not give fails the call as an
    unreachable ledger does, nothing runs, and the next call asks again."""
    down = {"on": True}
    asked: List[str] = []

    def transport_for(real: httpx.BaseTransport) -> httpx.BaseTransport:
        class Flaky(httpx.BaseTransport):
            def handle_request(self, request: httpx.Request) -> httpx.Response:
                asked.append(request.url.path)
                if down["on"]:
                    raise httpx.ConnectError("refused", request=request)
                return real.handle_request(request)

        return Flaky()

    runs: List[str] = []
    effect = Effect(tool="crm.contact.upsert", input={"contact": "flaky-" + uid})
    with httpx.Client(transport=transport_for(httpx.HTTPTransport())) as hc:
        c = Ledger(committed.url, client=hc, retries=1, backoff=0.001)
        with pytest.raises(ConnectionFailedError):
            c.do(effect, lambda key: runs.append(key))
        assert runs == [] and set(asked) == {"/v1/derivation-key"}, "no reserve without the key"
        down["on"] = False
        got = c.do(effect, lambda key: runs.append(key))
        assert got.key.startswith("dk2_") and runs == [got.key]
        assert asked.count("/v1/derivation-key") == 3, "two tries failed, the next call asked again"
