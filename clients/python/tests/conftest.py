"""Fixtures: build the real ledgerd and ledgerctl from this repository and
start ledgerd on a free loopback port with a temporary SQLite file."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Iterator, List, Optional

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]  # clients/python/tests -> repository root
sys.path.insert(0, str(HERE.parent / "src"))  # test the source tree, installed or not

from effect_ledger import Ledger  # noqa: E402


def _go() -> str:
    go = shutil.which("go") or "/usr/local/go/bin/go"
    if not os.path.exists(go):
        pytest.fail("the Go toolchain is needed to build ledgerd for these tests (go not on PATH)")
    return go


@pytest.fixture(scope="session")
def bins(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory holding freshly built ledgerd (its test build) and ledgerctl."""
    out = tmp_path_factory.mktemp("bin")
    env = dict(os.environ, CGO_ENABLED="1")
    # ledgerd is its test build: the same program, whose clock a test can
    # move through LEDGERD_TEST_CLOCK_FILE (the released binary reads no
    # test variable).
    for cmd, pkg in (("ledgerd", "./test/testdata/ledgerd-test"), ("ledgerctl", "./cmd/ledgerctl")):
        subprocess.run([_go(), "build", "-o", str(out / cmd), pkg], cwd=REPO, env=env, check=True, timeout=600)
    return out


class Ledgerd:
    """A running ledgerd process."""

    def __init__(self, bins: Path, db: Path, *args: str) -> None:
        if "--default-payloads" not in args:
            # Most tests check keys and fingerprints of an inline namespace
            # (dk_, sha256:); a new ledger is committed by default (contract
            # §14), which test_derived_keys and test_subjects start.
            args = ("--default-payloads", "inline") + args
        self.db = db
        self.logs: List[str] = []
        self.proc = subprocess.Popen(
            [str(bins / "ledgerd"), "--db", str(db), "--listen", "127.0.0.1:0", "--log-format", "json", *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        ready = threading.Event()
        self.addr: Optional[str] = None

        def read() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                self.logs.append(line)
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if rec.get("msg") == "ledgerd ready":
                    self.addr = rec.get("addr")
                    ready.set()
            ready.set()  # exited

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()
        if not ready.wait(30) or self.addr is None:
            self.stop()
            raise RuntimeError("ledgerd did not start:\n" + "".join(self.logs))
        self.url = "http://" + self.addr

    def stop(self, graceful: bool = False) -> None:
        if self.proc.poll() is None:
            if graceful:
                self.proc.terminate()  # SIGTERM: checkpoint, release the lock, exit 0
            else:
                self.proc.kill()
        self.proc.wait(timeout=30)
        self._reader.join(timeout=30)
        if self.proc.stderr is not None:
            self.proc.stderr.close()


def ledgerctl(bins: Path, *args: str) -> str:
    """Run ledgerctl and return its stdout."""
    r = subprocess.run([str(bins / "ledgerctl"), *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, "ledgerctl %s: %s" % (" ".join(args), r.stderr)
    return r.stdout


@pytest.fixture(scope="session")
def server(bins: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ledgerd]:
    """One open (no tokens) ledgerd shared by the tests."""
    d = Ledgerd(bins, tmp_path_factory.mktemp("db") / "ledger.db")
    yield d
    d.stop()


@pytest.fixture(scope="session")
def start_ledgerd(bins: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """Start more ledgerd processes (each on its own file); all are killed at the end."""
    started: List[Ledgerd] = []

    def start(*args: str, tokens: Optional[List[tuple]] = None) -> tuple:
        db = tmp_path_factory.mktemp("db") / "ledger.db"
        made = {}
        if tokens:
            # ledgerd creates the file; tokens created before the second
            # start are enforced from its first request on.
            Ledgerd(bins, db).stop(graceful=True)
            for role, name in tokens:
                made[name] = ledgerctl(bins, "token", "create", "--db", str(db), "--role", role, "--name", name).strip()
        d = Ledgerd(bins, db, *args)
        started.append(d)
        return d, made

    yield start
    for d in started:
        d.stop()


@pytest.fixture
def ledger(server: Ledgerd) -> Iterator[Ledger]:
    with Ledger(server.url, backoff=0.01) as c:
        yield c


@pytest.fixture
def uid() -> str:
    """A fresh suffix, so each test's keys and tools are its own."""
    return uuid.uuid4().hex[:12]
