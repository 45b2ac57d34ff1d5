"""Tokens, retries of 429/503, broken connections and servers that predate
wait_ms, against real ledgerd processes (and real sockets)."""

from __future__ import annotations

import asyncio
import http.server
import json
import socket
import threading
import time
from typing import Any, Iterator, List

import httpx
import pytest

from effect_ledger import (
    AsyncLedger,
    BadResponseError,
    ConnectionFailedError,
    Effect,
    ForbiddenError,
    InProgressError,
    Ledger,
    NotFoundError,
    RateLimitedError,
    Reservation,
    UnauthorizedError,
    UnavailableError,
    UnknownNamespaceError,
)


def test_token_auth(start_ledgerd: Any, uid: str) -> None:
    d, tokens = start_ledgerd(tokens=[("writer", "gateway-eu"), ("reader", "auditor")])
    with Ledger(d.url, token=tokens["gateway-eu"]) as gw:
        got = gw.do(Effect(tool="payments.refund", input={"order": uid}), lambda key: {"ok": True})
    with Ledger(d.url, token=tokens["auditor"]) as reader:
        rs = reader.get_effect(got.key)["receipts"]
        assert [r["actor"] for r in rs] == ["gateway-eu", "gateway-eu"]
        with pytest.raises(ForbiddenError) as err:
            reader.do(Effect(tool="payments.refund", input={"order": uid + "x"}), lambda key: None)
        assert err.value.status == 403
    for token in (None, "elt_" + "0" * 64):
        with Ledger(d.url, token=token) as anon:
            with pytest.raises(UnauthorizedError) as err2:
                anon.head()
            assert err2.value.status == 401 and err2.value.code == "unauthorized"


def test_rate_limited_requests_are_retried_after_retry_after(start_ledgerd: Any) -> None:
    d, tokens = start_ledgerd("--rate-limit", "1", "--rate-burst", "1", tokens=[("admin", "ops")])
    with Ledger(d.url, token=tokens["ops"], retries=0) as once:
        once.head()
        with pytest.raises(RateLimitedError) as err:
            once.head()
        assert err.value.status == 429 and err.value.retry_after == 1.0
    time.sleep(1.1)
    with Ledger(d.url, token=tokens["ops"], max_retry_delay=0.5) as impatient:
        impatient.head()
        start = time.monotonic()
        with pytest.raises(RateLimitedError):
            impatient.head()  # Retry-After 1 s is over max_retry_delay: not waited for
        assert time.monotonic() - start < 0.5
    time.sleep(1.1)
    with Ledger(d.url, token=tokens["ops"], backoff=0.01) as patient:
        patient.head()
        start = time.monotonic()
        patient.head()  # 429, then retried after Retry-After
        assert time.monotonic() - start >= 0.9


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_connection_refused_is_retried_then_raised() -> None:
    url = "http://127.0.0.1:%d" % free_port()
    with Ledger(url, retries=2, backoff=0.01) as c:
        with pytest.raises(ConnectionFailedError) as err:
            c.head()
    assert err.value.status is None and isinstance(err.value.__cause__, httpx.TransportError)

    async def main() -> None:
        async with AsyncLedger(url, retries=1, backoff=0.01) as a:
            with pytest.raises(ConnectionFailedError):
                await a.do(Effect(tool="t", key="k-12345678"), lambda key: pytest.fail("must not run"))

    asyncio.run(main())


class Server:
    """A small real HTTP server whose handler is a function."""

    def __init__(self, handle: Any) -> None:
        outer = self
        self.requests: List[dict] = []
        self.paths: List[str] = []

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                outer.paths.append(self.path)
                handle(self, None)

            def do_POST(self) -> None:
                outer.paths.append(self.path)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                outer.requests.append(json.loads(body))
                handle(self, outer.requests[-1])

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def reply(h: http.server.BaseHTTPRequestHandler, status: int, body: bytes, headers: Any = ()) -> None:
    h.send_response(status)
    for k, v in headers:
        h.send_header(k, v)
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


def test_bad_gateway_pages_and_unavailable() -> None:
    seen = []

    def handle(h: Any, body: Any) -> None:
        seen.append(1)
        if len(seen) == 1:
            reply(h, 502, b"<html>bad gateway</html>", [("Content-Type", "text/html")])
        elif len(seen) == 2:
            err = {"error": {"code": "unavailable", "message": "disk full", "details": {}}}
            reply(h, 503, json.dumps(err).encode(), [("Retry-After", "0")])
        else:
            reply(h, 200, b'{"seq": 7, "hash": "' + b"ab" * 32 + b'"}')

    s = Server(handle)
    try:
        with Ledger(s.url, backoff=0.01) as c:
            assert c.head().seq == 7 and len(seen) == 3
        seen.clear()
        with Ledger(s.url, retries=0) as c:
            with pytest.raises(BadResponseError) as err:
                c.head()
            assert err.value.status == 502 and "bad gateway" in err.value.message
            with pytest.raises(UnavailableError) as err2:
                c.head()
            assert err2.value.retry_after == 0 and err2.value.message == "disk full"
    finally:
        s.close()


class PreWaitMsProxy(Server):
    """A proxy in front of the real ledgerd that answers like a ledger
    predating SPEC §8: wait_ms is an unknown field. ``rejected`` is set
    once it refused a wait_ms."""

    def __init__(self, upstream: str) -> None:
        self.rejected = threading.Event()
        client = self.client = httpx.Client(base_url=upstream)

        def handle(h: Any, body: Any) -> None:
            if body is not None and "wait_ms" in body:
                err = {"error": {"code": "invalid_request", "message": 'unknown field "wait_ms"',
                                 "details": {"field": "wait_ms"}}}
                reply(h, 400, json.dumps(err).encode(), [("Content-Type", "application/json")])
                self.rejected.set()
                return
            r = client.request(h.command, h.path, json=body)
            headers = [(k, v) for k, v in r.headers.items() if k.lower() in ("content-type", "retry-after")]
            reply(h, r.status_code, r.content, headers)

        super().__init__(handle)

    def close(self) -> None:
        super().close()
        self.client.close()


@pytest.fixture
def pre_wait_ms_proxy(server: Any) -> Iterator[PreWaitMsProxy]:
    s = PreWaitMsProxy(server.url)
    yield s
    s.close()


def test_waiting_on_a_server_without_wait_ms(ledger: Ledger, pre_wait_ms_proxy: PreWaitMsProxy, uid: str) -> None:
    eff = Effect(tool="payments.refund", input={"order": uid}, lease_ms=20_000)
    held = ledger.reserve(eff)
    assert isinstance(held, Reservation)

    def commit_later() -> None:
        # Commit only once the client fell back to polling, and a little later.
        assert pre_wait_ms_proxy.rejected.wait(10)
        time.sleep(0.3)
        ledger.succeed(held, result=1)

    t = threading.Thread(target=commit_later)
    t.start()
    with Ledger(pre_wait_ms_proxy.url) as old:
        got = old.do(eff, lambda key: pytest.fail("must not run"), wait=10)
        t.join()
        assert got.replayed and got.result == 1
        assert old.server_waits is False
        # Polling, not a server-side wait, and not beyond the deadline.
        asked = [r for r in pre_wait_ms_proxy.requests if r.get("idempotency_key") == held.key]
        assert sum("wait_ms" in r for r in asked) == 1 and len(asked) >= 4
        other = Effect(tool="payments.refund", input={"order": uid + "b"}, lease_ms=20_000)
        assert isinstance(ledger.reserve(other), Reservation)
        start = time.monotonic()
        with pytest.raises(InProgressError):
            old.do(other, lambda key: None, wait=0.5)
        assert 0.45 < time.monotonic() - start < 2


def test_namespace_routes(server: Any, uid: str) -> None:
    def handle(h: Any, body: Any) -> None:
        if h.path.endswith("/head"):
            reply(h, 200, b'{"seq": 1, "hash": "' + b"00" * 32 + b'"}')
        else:
            reply(h, 200, json.dumps({"status": "replayed", "idempotency_key": body["idempotency_key"],
                                      "outcome": "succeeded", "result": 1}).encode())

    s = Server(handle)
    try:
        with Ledger(s.url, namespace="payments") as c:
            c.head()
            c.do(Effect(tool="t", key="a/b-" + uid), lambda key: None)
        assert s.paths == ["/v1/ns/payments/head", "/v1/ns/payments/effects/reserve"]
    finally:
        s.close()
    # The real ledger answers an unknown namespace (or, before SPEC §7, an
    # unknown route) with a typed error.
    with Ledger(server.url, namespace="no-such-ns") as c:
        with pytest.raises((UnknownNamespaceError, NotFoundError)) as err:
            c.head()
        assert err.value.status == 404
