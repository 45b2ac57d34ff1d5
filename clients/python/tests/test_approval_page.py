"""An approval-required error names the ask, its expiry and the page where
a person answers it, against a real ledgerd whose policy sends the call to
a person (SPEC §13)."""

from __future__ import annotations

import asyncio
import datetime
from pathlib import Path

import pytest

from conftest import ledgerctl
from effect_ledger import ApprovalRequiredError, AsyncLedger, Effect, Ledger

POLICY = '{"rules": [{"tool": "payments.*", "approval": "required", "expires_in_ms": 600000}]}'


@pytest.fixture(scope="module")
def gated(bins: Path, start_ledgerd, tmp_path_factory: pytest.TempPathFactory):
    d, _ = start_ledgerd()
    policy = tmp_path_factory.mktemp("policy") / "policy.json"
    policy.write_text(POLICY)
    ledgerctl(bins, "policy", "set", "--server", d.url, "default", str(policy))
    return d


def check(e: ApprovalRequiredError, base: str, key: str) -> None:
    assert e.key == key and e.seq > 0 and e.state == "pending"
    assert e.expires_at > 0
    page = "%s/ui/#approvals/%d" % (base, e.seq)
    assert e.url == page
    utc = datetime.timezone.utc
    expires = datetime.datetime.fromtimestamp(e.expires_at // 1000, tz=utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    for want in ("ask %d" % e.seq, "expires " + expires, page):
        assert want in str(e), str(e)


def test_sync_error_names_the_page(gated, uid: str) -> None:
    key = "charge-" + uid
    with Ledger(gated.url + "/") as ledger:
        with pytest.raises(ApprovalRequiredError) as err:
            ledger.reserve(Effect(tool="payments.charge", effect="external", key=key, input={"amount": 1200}))
    check(err.value, gated.url, key)


def test_async_error_names_the_page(gated, uid: str) -> None:
    key = "refund-" + uid

    async def run() -> ApprovalRequiredError:
        async with AsyncLedger(gated.url) as ledger:
            try:
                await ledger.reserve(Effect(tool="payments.refund", effect="external", key=key, input={"amount": 5}))
            except ApprovalRequiredError as e:
                return e
        raise AssertionError("no approval required")

    check(asyncio.run(run()), gated.url, key)
