"""Key lifetime (SPEC §12) against a real ledgerd whose clock is a file the
test moves: a key is remembered until ``key_ttl_ms`` after its outcome,
then a reserve starts a new generation of it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Iterator, List

import pytest
from conftest import Ledgerd

from effect_ledger import AsyncLedger, Effect, Ledger

T0 = 1764475200000
HOUR = 3600 * 1000


class Clock:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.set(T0)

    def set(self, ms: int) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(str(ms))
        tmp.replace(self.path)


@pytest.fixture
def ttl_server(bins: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple]:
    clock = Clock(tmp_path / "clock")
    monkeypatch.setenv("LEDGERD_TEST_CLOCK_FILE", str(clock.path))
    d = Ledgerd(bins, tmp_path / "ledger.db", "--default-key-ttl", "1h")
    yield d, clock
    d.stop()


def test_key_expires_after_its_ttl(ttl_server: Any) -> None:
    server, clock = ttl_server
    runs: List[int] = []
    effect = Effect(tool="reports.send", effect="external", input={"day": 1})
    with Ledger(server.url, backoff=0.01) as c:
        first = c.do(effect, lambda key: runs.append(1) or {"sent": 1})
        assert first.renewed is None
        view = c.get_effect(first.key)
        assert view["expires_at"] == T0 + HOUR

        clock.set(T0 + HOUR - 1)
        again = c.do(effect, lambda key: runs.append(2))
        assert again.replayed, "remembered one millisecond short of the TTL"

        clock.set(T0 + HOUR)
        renewed = c.do(effect, lambda key: runs.append(3) or {"sent": 2})
        assert not renewed.replayed
        assert renewed.renewed is not None, "at the TTL the key starts a new generation"
        assert renewed.renewed.seq == again.receipt.seq
        assert renewed.renewed.recorded_at == T0 + HOUR - 1
        assert runs == [1, 3]
        assert len(c.get_effect(first.key)["receipts"]) == 2
        assert len(c.get_effect(first.key, history=True)["receipts"]) == 5
        assert c.get_effect(first.key)["expires_at"] == T0 + 2 * HOUR

    async def run() -> None:
        async with AsyncLedger(server.url, backoff=0.01) as a:
            view = await a.get_effect(first.key, history=True)
            assert [r["kind"] for r in view["receipts"]] == ["reserve", "commit", "replay", "reserve", "commit"]

    asyncio.run(run())
