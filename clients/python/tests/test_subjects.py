"""Subjects (SPEC §14) against a real ledgerd: ``Effect(subjects=...)`` and
``effect(subjects=...)`` send them on the reserve, sync and async; an
erasure by subject erases the call's result, and a replay carries
``erased``."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from effect_ledger import AsyncLedger, Effect, Ledger


@pytest.fixture(scope="module")
def committed(start_ledgerd: Any) -> Any:
    d, _ = start_ledgerd("--default-payloads", "committed")
    return d


def erase(url: str, subject: str) -> int:
    r = httpx.post(url + "/v1/erasures", json={"subject": subject})
    assert r.status_code == 201, r.text
    return int(r.json()["receipt"]["seq"])


def test_subjects_sync_erased_replay(committed: Any, uid: str) -> None:
    subject = "customer-" + uid
    with Ledger(committed.url) as c:
        first = c.do(Effect(tool="crm.note", key="subj-s-" + uid, input={"n": 1}, subjects=[subject, "team-7"]),
                     lambda key: {"secret": uid})
        assert not first.replayed and first.erased == {}
        seq = erase(committed.url, subject)
        view = httpx.get(committed.url + "/v1/effects/subj-s-" + uid).text
        assert '"erased":{"result":%d}' % seq in view and "secret" not in view
        again = c.do(Effect(tool="crm.note", key="subj-s-" + uid, input={"n": 1}, subjects=[subject]),
                     lambda key: pytest.fail("ran again"))
        assert again.replayed and again.result is None
        assert again.erased == {"result": seq}
        with c.effect(tool="crm.note", key="subj-s-" + uid, input={"n": 1}) as eff:
            assert eff.replayed and eff.replay is not None and eff.replay.erased == {"result": seq}


def test_subjects_async_scope(committed: Any, uid: str) -> None:
    subject = "recipient-" + uid

    async def main() -> None:
        async with AsyncLedger(committed.url) as c:
            async with c.effect(tool="mail.send", effect="external", key="subj-a-" + uid, input={"to": 1},
                                subjects=[subject]) as eff:
                await eff.succeed(result={"secret": uid})
        seq = erase(committed.url, subject)
        async with AsyncLedger(committed.url) as c:
            r = await c.do(Effect(tool="mail.send", effect="external", key="subj-a-" + uid, input={"to": 1}),
                           lambda key: pytest.fail("ran again"))
            assert r.replayed and r.erased == {"result": seq}

    asyncio.run(main())


def test_subjects_refused_without_echo(committed: Any, uid: str) -> None:
    from effect_ledger.errors import InvalidRequestError

    with Ledger(committed.url) as c:
        with pytest.raises(InvalidRequestError) as e:
            c.do(Effect(tool="crm.note", key="subj-bad-" + uid, input={"n": 1}, subjects=["x" * 129]), lambda key: None)
        assert e.value.details.get("field") == "subjects" and "x" * 129 not in str(e.value)
        with pytest.raises(TypeError):
            c.do(Effect(tool="crm.note", key="subj-bad-" + uid, input={"n": 1}, subjects="customer-1"), lambda key: None)
