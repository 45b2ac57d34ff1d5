"""The protocol shared by the sync and async clients, without I/O.

Each operation is a generator ("flow") that yields ``_Request``, ``_Sleep``
and ``_Call`` actions and receives the reply of each request (an ``_Reply``,
or the transport exception) and the value of each call. ``Ledger`` runs flows with ``httpx.Client`` and
``time.sleep``, ``AsyncLedger`` with ``httpx.AsyncClient`` and
``asyncio.sleep``, so retries, waiting and error mapping exist once.
"""

from __future__ import annotations

import dataclasses
import email.utils
import inspect
import json
import random
import re
import time
from contextvars import ContextVar
from typing import Any, Callable, Dict, Generator, Generic, Mapping, NamedTuple, Optional, Sequence, Tuple, TypeVar, Union
from urllib.parse import quote

from . import errors
from ._types import (
    EFFECT_CLASSES,
    Changed,
    Committed,
    DerivationKey,
    Effect,
    NotRecorded,
    ReceiptRef,
    Reconciled,
    Replay,
    Reservation,
    _execution_for,
)
#: Largest ``wait_ms`` the ledger accepts (SPEC §8).
MAX_WAIT_MS = 60_000
#: Largest committed result, as compact JSON (SPEC §4).
MAX_RESULT_BYTES = 64 * 1024
MAX_ERROR_MESSAGE = 1024

_RETRY_STATUS = frozenset({429, 502, 503, 504})
_CODE_RE = re.compile(r"^[A-Z0-9_]{1,64}$")


class _Request(NamedTuple):
    method: str
    path: str
    body: Optional[dict]
    params: Optional[dict]
    timeout: float


class _Sleep(NamedTuple):
    seconds: float


class _Call(NamedTuple):
    """Run the effect's function, ``fn(key)`` (awaited by ``AsyncLedger``
    when it returns an awaitable); its exception is thrown into the flow."""

    fn: Callable[[str], Any]
    key: str


class _Reply(NamedTuple):
    status: int
    headers: Mapping[str, str]
    content: bytes


Flow = Generator[Union[_Request, _Sleep, _Call], Any, Any]

#: The reservation (or replay) the current ``do`` call or decorated function
#: runs under; read with ``current_reservation()``.
_current: ContextVar[Optional[Reservation]] = ContextVar("effect_ledger_reservation", default=None)


def current_reservation() -> Optional[Reservation]:
    """Return the reservation the running effect body holds, or None.

    Inside a function run by ``do`` or a decorated function this gives its
    idempotency key (``current_reservation().key``) to pass downstream, e.g.
    as the payment provider's own idempotency key.
    """
    return _current.get()


def encode_json(value: Any) -> bytes:
    """Encode a request body or result as compact UTF-8 JSON (dataclasses as
    objects; NaN and infinities are refused)."""
    return json.dumps(
        value, separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=_json_default
    ).encode("utf-8")


def _json_default(o: Any) -> Any:
    if dataclasses.is_dataclass(o) and not isinstance(o, type):
        return dataclasses.asdict(o)
    raise TypeError("%s is not JSON serializable" % type(o).__name__)


def parse_retry_after(value: Optional[str]) -> Optional[float]:
    """Parse a Retry-After header: delay seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - time.time())


def decode_reply(reply: _Reply) -> Any:
    """Return the JSON body of a 2xx reply, or raise the typed error."""
    retry_after = parse_retry_after(reply.headers.get("retry-after"))
    try:
        data = json.loads(reply.content) if reply.content else None
    except ValueError:
        data = None
    if 200 <= reply.status < 300:
        if not isinstance(data, dict):
            raise errors.BadResponseError(
                "bad_response", "HTTP %d with a body that is not a JSON object" % reply.status, status=reply.status
            )
        return data
    e = data.get("error") if isinstance(data, dict) else None
    if not isinstance(e, dict) or not isinstance(e.get("code"), str):
        snippet = reply.content[:200].decode("utf-8", "replace")
        raise errors.BadResponseError(
            "bad_response", "HTTP %d: %s" % (reply.status, snippet), status=reply.status, retry_after=retry_after
        )
    details = e.get("details") if isinstance(e.get("details"), dict) else {}
    raise errors.error_for(e["code"], str(e.get("message", "")), details, reply.status, retry_after)


def check_code(code: str) -> None:
    """Raise ValueError unless code is a valid error code (A-Z0-9_, 1-64)."""
    if not _CODE_RE.match(code):
        raise ValueError("error code must be 1-64 characters of A-Z, 0-9 and _, got %r" % code)


def failure_of(exc: BaseException, retry_on: Tuple[type, ...] = ()) -> dict:
    """Return the commit ``error`` object for an exception raised by an
    effect's body: ``EffectFailed`` gives its own code, message and
    retryable flag; any other exception is recorded under its class name in
    upper snake case (``TimeoutError`` -> ``TIMEOUT_ERROR``), retryable when
    it has a true ``retryable`` attribute or is an instance of ``retry_on``."""
    if isinstance(exc, errors.EffectFailed):
        return {"code": exc.code, "message": exc.message[:MAX_ERROR_MESSAGE], "retryable": bool(exc.retryable)}
    name = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", type(exc).__name__).upper()
    code = re.sub(r"[^A-Z0-9_]", "_", name)[:64] or "EXCEPTION"
    msg = str(exc)
    message = ("%s: %s" % (type(exc).__name__, msg) if msg else type(exc).__name__)[:MAX_ERROR_MESSAGE]
    retryable = getattr(exc, "retryable", False) is True or (bool(retry_on) and isinstance(exc, retry_on))
    return {"code": code, "message": message, "retryable": retryable}


def outcome_of(exc: BaseException) -> str:
    """Return the outcome to commit for an exception raised by an effect's
    body: ``not_applied`` for ``EffectNotApplied`` (the effect applied
    nothing, SPEC §4.1), else ``failed``."""
    return "not_applied" if isinstance(exc, errors.EffectNotApplied) else "failed"


def bind_input(fn: Callable, args: tuple, kwargs: dict) -> dict:
    """Return a decorated function's call as a JSON object: each parameter's
    name and value, defaults applied, ``self``/``cls`` left out, ``*args`` as
    a list and ``**kwargs`` as an object under their own names."""
    sig = inspect.signature(fn)
    bound = sig.bind(*args, **kwargs)
    bound.apply_defaults()
    out = {}
    for i, (name, value) in enumerate(bound.arguments.items()):
        if i == 0 and name in ("self", "cls"):
            continue
        out[name] = list(value) if isinstance(value, tuple) else value
    return out


# A namespace name (SPEC §7).
_NAMESPACE = re.compile(r"[a-z0-9._-]{1,64}")


#: What ``effect(...)`` returns: ``EffectScope`` or ``AsyncEffectScope``.
ScopeT = TypeVar("ScopeT")
#: The HTTP client: ``httpx.Client`` or ``httpx.AsyncClient``.
ClientT = TypeVar("ClientT")


class _Core(Generic[ScopeT, ClientT]):
    """Configuration and flows shared by ``Ledger`` and ``AsyncLedger``."""

    #: Makes the HTTP client when none is passed in (``verify=``).
    _new_client: Callable[..., ClientT]

    def __init__(
        self,
        base_url: str,
        token: Optional[str] = None,
        *,
        client: Optional[ClientT] = None,
        verify: Any = True,
        namespace: Optional[str] = None,
        timeout: float = 10.0,
        wait: float = 30.0,
        retries: int = 5,
        commit_retries: int = 10,
        backoff: float = 0.1,
        max_retry_delay: float = 30.0,
        lease_ms: Optional[int] = None,
        retry_on: Tuple[type, ...] = (),
        approval_wait: float = 0.0,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError("base_url must start with http:// or https://, got %r" % base_url)
        if namespace is not None and not _NAMESPACE.fullmatch(namespace):
            raise ValueError("namespace must be 1-64 bytes of a-z 0-9 . _ -, got %r" % (namespace,))
        self.base_url = base_url.rstrip("/")
        self.token = token
        # "default" is what the unprefixed routes serve.
        self.namespace = None if namespace == "default" else namespace
        self.timeout = timeout
        self.wait = wait
        self.retries = retries
        self.commit_retries = commit_retries
        self.backoff = backoff
        self.max_retry_delay = max_retry_delay
        self.lease_ms = lease_ms
        self.retry_on = tuple(retry_on)
        self.approval_wait = approval_wait
        # None: unknown; False: the server rejected wait_ms (it predates
        # SPEC §8), so in_progress is polled using Retry-After instead.
        self.server_waits: Optional[bool] = None
        self._headers = {"Accept": "application/json", "User-Agent": "effect-ledger-python"}
        if token:
            self._headers["Authorization"] = "Bearer " + token
        # The namespace's derivation key, once fetched (_derivation_flow).
        self._derivation: Optional[DerivationKey] = None
        self._own = client is None
        self._client: ClientT = client if client is not None else self._new_client(verify=verify)

    def _path(self, rest: str) -> str:
        if self.namespace:
            return "/v1/ns/" + quote(self.namespace, safe="") + rest
        return "/v1" + rest

    def _policy_path(self) -> str:
        # The policy is served under /v1/namespaces/{ns}, for default too.
        return "/v1/namespaces/" + quote(self.namespace or "default", safe="") + "/policy"

    def _request_args(self, req: _Request) -> Dict[str, Any]:
        """The keyword arguments of the HTTP client's ``request`` for req."""
        headers = dict(self._headers)
        content = None
        if req.body is not None:
            content = encode_json(req.body)
            headers["Content-Type"] = "application/json"
        return {
            "method": req.method,
            "url": self.base_url + req.path,
            "content": content,
            "params": req.params,
            "headers": headers,
            "timeout": req.timeout,
        }

    def _retry_types(self, retry_on: Optional[Tuple[type, ...]]) -> Tuple[type, ...]:
        """The exception types recorded retryable: retry_on, or the client's."""
        return self.retry_on if retry_on is None else tuple(retry_on)

    def effect(
        self,
        tool: str,
        effect: str = "write",
        idempotent: bool = False,
        input: Any = None,
        key: Any = None,
        *,
        input_hash: Optional[str] = None,
        execution_id: Optional[str] = None,
        attempt: Optional[int] = None,
        lease_ms: Optional[int] = None,
        wait: Optional[float] = None,
        retry_on: Optional[Tuple[type, ...]] = None,
        approval_summary: Optional[str] = None,
        changed: Any = None,
        subjects: Optional[Sequence[str]] = None,
    ) -> ScopeT:
        """Describe an effect, to use as a context manager or a decorator.

        As a context manager it reserves on entry and yields an
        ``EffectHandle``::

            with ledger.effect(tool="payments.refund", idempotent=True, input=req) as eff:
                if eff.replayed:
                    return eff.result                  # recorded outcome; not run again
                ref = psp.refund(req, idempotency_key=eff.key)
                eff.succeed(result={"refund": ref.id}, external_ref=ref.id)

        Leaving the block without ``succeed``/``fail``/``not_applied``
        commits a success with no result; an exception escaping it is
        committed as a failure (``EffectNotApplied``: as ``not_applied``).

        As a decorator, each call reserves with a key derived from the tool
        and the call's arguments (or ``key=`` / ``input=`` callables taking
        the same arguments), runs the function, commits its return value,
        and on a replay returns the recorded result without calling it::

            @ledger.effect(tool="payments.refund", effect="write", idempotent=True)
            def refund(order_id: int, amount: int) -> dict: ...

        On an ``AsyncLedger`` it is an ``async with`` context manager that
        yields an ``AsyncEffectHandle``, and decorates ``async def`` (or
        plain) functions::

            async with ledger.effect(tool="email.send", effect="external", input=msg) as eff:
                if not eff.replayed:
                    mid = await mailer.send(msg, idempotency_key=eff.key)
                    await eff.succeed(result={"id": mid}, external_ref=mid)
        """
        spec = Effect(
            tool=tool,
            effect=effect,
            idempotent=idempotent,
            input=input,
            input_hash=input_hash,
            key=key,
            execution_id=execution_id,
            attempt=attempt,
            lease_ms=lease_ms,
            approval_summary=approval_summary,
            changed=changed,
            subjects=subjects,
        )
        return self._scope(spec, wait, self._retry_types(retry_on))

    def _scope(self, spec: Effect, wait: Optional[float], retry_on: Tuple[type, ...]) -> ScopeT:
        """The client's scope of spec (``effect``)."""
        raise NotImplementedError

    # -- requests with retries --------------------------------------------

    def _delay(self, n: int, retry_after: Optional[float]) -> float:
        # Full jitter on an exponential backoff, never less than Retry-After.
        d = random.uniform(0, self.backoff * (2**n))
        if retry_after is not None:
            d = max(d, retry_after)
        return d

    def _call(
        self,
        method: str,
        path: str,
        body: Optional[dict] = None,
        params: Optional[dict] = None,
        *,
        retries: Optional[int] = None,
        extra_timeout: float = 0.0,
        with_reply: bool = False,
    ) -> Flow:
        """Send one request; retry 429, 502, 503, 504 and broken connections
        with backoff honouring Retry-After, at most ``retries`` times and
        never for longer than ``max_retry_delay`` at once."""
        limit = self.retries if retries is None else retries
        n = 0
        while True:
            reply = yield _Request(method, path, body, params, self.timeout + extra_timeout)
            try:
                if isinstance(reply, BaseException):
                    err: errors.LedgerError = errors.ConnectionFailedError(
                        "connection_failed", "%s: %s" % (type(reply).__name__, reply)
                    )
                    err.__cause__ = reply
                    raise err
                data = decode_reply(reply)
                return (data, reply) if with_reply else data
            except errors.LedgerError as e:
                retryable = isinstance(e, errors.ConnectionFailedError) or e.status in _RETRY_STATUS
                if not retryable or n >= limit:
                    raise
                delay = self._delay(n, e.retry_after)
                if delay > self.max_retry_delay:
                    raise
            n += 1
            yield _Sleep(delay)

    # -- reserve -----------------------------------------------------------

    def _derivation_flow(self) -> Flow:
        """Return the namespace's ``DerivationKey``: asked of the ledger the
        first time (``GET /v1/derivation-key``, a writer or admin token) and
        kept for the client's life, so a namespace that switches to
        committed derives ``dk2_`` keys from the client's next start. A
        failure is raised and not kept. A ledgerd before v1.4 (404
        ``not_found``) has inline namespaces only."""
        if self._derivation is None:
            try:
                data = yield from self._call("GET", self._path("/derivation-key"))
                dk = DerivationKey._from(data)
            except errors.NotFoundError:
                dk = DerivationKey(payloads="inline", key=b"")
            except ValueError as e:
                raise errors.BadResponseError("bad_response", str(e)) from e
            self._derivation = dk
        return self._derivation

    def _key_flow(self, effect: Effect) -> Flow:
        """Return the key to reserve for effect: its own, or derived with the
        namespace's derivation key (fetched once) when the ledger records
        the call; a ``none``/``read`` call, which skips the ledger, gets the
        ``dk_`` key without asking."""
        derivation = None
        if effect.key is None and effect.input is not None and effect.recorded:
            derivation = yield from self._derivation_flow()
        return effect.resolved_key(derivation)

    def _reserve_body(self, effect: Effect, key: str) -> Tuple[dict, str]:
        execution_id, attempt = _execution_for(effect)
        body: dict = {
            "idempotency_key": key,
            "execution_id": execution_id,
            "attempt": attempt,
            "tool": effect.tool,
            "effect": effect.effect,
            "idempotent": effect.idempotent,
        }
        if effect.input is not None:
            body["input"] = effect.input
        if effect.input_hash is not None:
            body["input_hash"] = effect.input_hash
        lease = effect.lease_ms if effect.lease_ms is not None else self.lease_ms
        if lease is not None:
            body["lease_ms"] = lease
        if effect.approval_summary is not None:
            body["approval_summary"] = effect.approval_summary
        if effect.changed is not None:
            body["changed"] = effect.changed._json() if isinstance(effect.changed, Changed) else dict(effect.changed)
        if effect.subjects is not None:
            if isinstance(effect.subjects, (str, bytes)):
                raise TypeError("subjects must be a sequence of strings, not a single string")
            body["subjects"] = list(effect.subjects)
        return body, execution_id

    def _reserve_flow(self, effect: Effect, wait: Optional[float], approval_wait: Optional[float] = None) -> Flow:
        """Reserve; while another reservation holds the key, wait for it up
        to ``wait`` seconds: first with the server's ``wait_ms`` (woken by
        the commit or the lease's end), else, on a server without it, by
        polling at growing intervals (at most 1 s, never beyond
        Retry-After). A call the namespace's policy sends to approval raises
        ``ApprovalRequiredError``, after waiting up to ``approval_wait``
        seconds for the answer. Returns a Reservation, Replay or
        NotRecorded."""
        if effect.effect not in EFFECT_CLASSES:
            raise ValueError("effect must be one of %s, got %r" % (", ".join(EFFECT_CLASSES), effect.effect))
        key = yield from self._key_flow(effect)
        body, execution_id = self._reserve_body(effect, key)
        data = yield from self._reserve_loop(body, wait)
        if data.get("status") == "approval_required":
            ask = approval_required(data, self.base_url, self.namespace)
            approval_wait = self.approval_wait if approval_wait is None else approval_wait
            if approval_wait <= 0:
                raise ask
            data = yield from self._await_approval(body, ask, approval_wait)
        status = data.get("status")
        if status == "replayed":
            return Replay._from(data)
        if status == "not_recorded":
            return NotRecorded(key=data.get("idempotency_key", ""), key_generated=bool(data.get("key_generated")))
        return Reservation._from(data, execution_id)

    def _reserve_loop(self, body: dict, wait: Optional[float]) -> Flow:
        """Reserve, waiting while another reservation holds the key (see
        ``_reserve_flow``); return the answer's JSON."""
        wait = self.wait if wait is None else wait
        deadline = time.monotonic() + max(0.0, wait)
        poll = 0.05
        server_wait = False  # the next request asks the server to wait
        while True:
            wait_ms = self._wait_ms(deadline - time.monotonic()) if server_wait else 0
            try:
                data = yield from self._reserve_request(body, wait_ms)
            except errors.InProgressError as e:
                if wait_ms:
                    self.server_waits = True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise
                if not server_wait and self.server_waits is not False:
                    server_wait = True
                    continue
                delay = min(poll, remaining)
                if e.retry_after is not None:
                    delay = min(delay, max(e.retry_after, 0.01))
                poll = min(poll * 2, 1.0)
                yield _Sleep(delay)
                continue
            if data is None:
                continue
            if wait_ms:
                self.server_waits = True
            return data

    def _wait_ms(self, remaining: float) -> int:
        """The ``wait_ms`` to ask the ledger for with ``remaining`` seconds
        left: 0 (none) when too little is left or the ledger does not wait."""
        if self.server_waits is False or remaining < 0.01:
            return 0
        return min(MAX_WAIT_MS, int(remaining * 1000))

    def _reserve_request(self, body: dict, wait_ms: int) -> Flow:
        """Send one reserve of ``body``, asking the ledger to wait up to
        ``wait_ms`` (0: not to wait); return the answer's JSON, or None when
        the ledger refused ``wait_ms`` (it predates SPEC §8 and is not asked
        to wait again)."""
        req = dict(body, wait_ms=wait_ms) if wait_ms else body
        try:
            data = yield from self._call("POST", self._path("/effects/reserve"), req, extra_timeout=wait_ms / 1000)
        except errors.InvalidRequestError as e:
            if wait_ms and e.details.get("field") == "wait_ms":
                self.server_waits = False
                return None
            raise
        return data

    def _await_approval(self, body: dict, ask: errors.ApprovalRequiredError, approval_wait: float) -> Flow:
        """Reserve again until the ask is answered (return the answer's
        JSON; a rejection raises ``ApprovalRejectedError``), or raise the
        ``ApprovalRequiredError`` when the ask expires or ``approval_wait``
        seconds pass. Each reserve asks the ledger to wait for the answer
        (``wait_ms``); a ledger that does not wait is polled."""
        deadline = time.monotonic() + approval_wait
        if ask.expires_at:
            deadline = min(deadline, time.monotonic() + ask.expires_at / 1000 - time.time())
        poll = 0.05
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if ask.expires_at and time.time() * 1000 >= ask.expires_at:
                    raise approval_required(ask, self.base_url, expired=True)
                raise ask
            wait_ms = self._wait_ms(remaining)
            start = time.monotonic()
            data = yield from self._reserve_request(body, wait_ms)
            if data is None:
                continue
            if data.get("status") != "approval_required":
                return data
            nxt = approval_required(data, self.base_url, self.namespace)
            if nxt.seq != ask.seq:  # the ask expired and the ledger asked again
                raise approval_required(nxt, self.base_url, expired=True)
            ask = nxt
            if wait_ms and time.monotonic() - start >= wait_ms / 2000:
                continue  # the ledger waited: ask again at once
            yield _Sleep(max(0.0, min(poll, deadline - time.monotonic())))
            poll = min(poll * 2, 1.0)

    # -- commit, resolve, reads ---------------------------------------------

    def _succeed_flow(self, res: Reservation, result: Any, external_ref: str) -> Flow:
        return self._commit_flow(res.key, self._success_body(res.reservation, result, external_ref))

    def _fail_flow(self, res: Reservation, code: str, message: str, retryable: bool) -> Flow:
        return self._commit_flow(res.key, self._failure_body(res.reservation, code, message, retryable))

    def _not_applied_flow(self, res: Reservation, code: str, message: str) -> Flow:
        return self._commit_flow(res.key, self._not_applied_body(res.reservation, code, message))

    def _commit_flow(self, key: str, body: dict) -> Flow:
        # A commit is safe to repeat: the same values are answered 200
        # with Idempotent-Replayed, so it is retried harder than a reserve.
        path = self._path("/effects/%s/commit" % quote(key, safe=""))
        data, reply = yield from self._call("POST", path, body, retries=self.commit_retries, with_reply=True)
        replayed = reply.headers.get("idempotent-replayed", "").lower() == "true"
        return Committed._from(data, replayed=replayed)

    @staticmethod
    def _success_body(reservation: str, result: Any, external_ref: str) -> dict:
        body: dict = {"reservation": reservation, "outcome": "succeeded"}
        if external_ref:
            body["external_ref"] = external_ref
        if result is not None:
            body["result"] = result
        return body

    @staticmethod
    def _failure_body(reservation: str, code: str, message: str, retryable: bool) -> dict:
        check_code(code)
        return {
            "reservation": reservation,
            "outcome": "failed",
            "error": {"code": code, "message": message[:MAX_ERROR_MESSAGE], "retryable": retryable},
        }

    @staticmethod
    def _not_applied_body(reservation: str, code: str, message: str) -> dict:
        # retryable is ignored by the ledger for not_applied; external_ref
        # is refused (nothing was applied, so there is no reference).
        check_code(code)
        return {
            "reservation": reservation,
            "outcome": "not_applied",
            "error": {"code": code, "message": message[:MAX_ERROR_MESSAGE]},
        }

    def _failure_flow(self, res: Reservation, exc: BaseException, retry_on: Tuple[type, ...]) -> Flow:
        """The commit of the effect run under res that raised exc: as
        ``not_applied`` or as failed, as exc says (``failure_of``)."""
        f = failure_of(exc, retry_on)
        if outcome_of(exc) == "not_applied":
            body = self._not_applied_body(res.reservation, f["code"], f["message"])
        else:
            body = self._failure_body(res.reservation, f["code"], f["message"], f["retryable"])
        return self._commit_flow(res.key, body)

    def _resolve_flow(
        self,
        key: str,
        note: str,
        outcome: str,
        result: Any,
        external_ref: str,
        error_code: Optional[str],
        error_message: str,
        retryable: bool,
    ) -> Flow:
        body: dict = {"outcome": outcome, "note": note}
        if external_ref:
            body["external_ref"] = external_ref
        if result is not None:
            body["result"] = result
        if outcome in ("failed", "not_applied"):
            body["error"] = {"code": error_code or "", "message": error_message, "retryable": retryable}
        data = yield from self._call("POST", self._path("/effects/%s/resolve" % quote(key, safe="")), body)
        return data

    def _reconcile_flow(self, key: str, found: Reconciled, wait: Optional[float] = None,
                        ask: Optional[Callable[[str], Any]] = None) -> Flow:
        """Record what a lookup found about the interrupted key (SPEC §15);
        return the answer's JSON. With ``ask`` (the lookup), a
        ``reconcile_too_early`` is waited out up to ``wait`` seconds
        (default: the client's) and the lookup asked again: an answer from
        before the settle time is never recorded after it. Without it,
        ``ReconcileTooEarlyError`` is raised."""
        deadline = time.monotonic() + max(0.0, self.wait if wait is None else wait)
        path = self._path("/effects/%s/reconcile" % quote(key, safe=""))
        while True:
            if not isinstance(found, Reconciled):
                raise TypeError("reconcile: expected a Reconciled, got %s" % type(found).__name__)
            if found.error_code:
                check_code(found.error_code)
            try:
                data = yield from self._call("POST", path, found._json())
                return data
            except errors.ReconcileTooEarlyError as e:
                delay = e.retry_after if e.retry_after is not None else 1.0
                if ask is None or time.monotonic() + delay > deadline:
                    raise
            yield _Sleep(delay)
            found = yield _Call(ask, key)

    def _get_flow(self, rest: str, params: Optional[dict] = None) -> Flow:
        data = yield from self._call("GET", self._path(rest), params=params)
        return data

    def _effect_flow(self, key: str, history: bool) -> Flow:
        params = {"history": "true"} if history else None
        return self._get_flow("/effects/" + quote(key, safe=""), params)

    def _receipts_flow(self, after: int, limit: int, filters: Dict[str, Optional[str]]) -> Flow:
        params: Dict[str, Any] = {"after": after, "limit": limit}
        params.update({k: v for k, v in filters.items() if v is not None})
        return self._get_flow("/receipts", params)

    def _head_flow(self) -> Flow:
        data = yield from self._get_flow("/head")
        return ReceiptRef(seq=int(data["seq"]), hash=data["hash"])

    # -- policy and approvals (SPEC §13) --------------------------------------

    def _policy_flow(self) -> Flow:
        data = yield from self._call("GET", self._policy_path())
        return data

    def _set_policy_flow(self, policy: Any) -> Flow:
        if policy is None:
            raise ValueError("set_policy: policy is required ({} for the empty one)")
        data = yield from self._call("PUT", self._policy_path(), policy)
        return data

    def _approvals_flow(self, state: Optional[str], after: int, limit: Optional[int]) -> Flow:
        params: Dict[str, Any] = {}
        if state:
            params["state"] = state
        if after:
            params["after"] = after
        if limit:
            params["limit"] = limit
        data = yield from self._call("GET", self._path("/approvals"), params=params or None)
        return data

    def _approval_flow(self, seq: int) -> Flow:
        return self._get_flow("/approvals/%d" % int(seq))

    def _answer_flow(self, seq: int, decision: str, note: Optional[str]) -> Flow:
        if decision not in ("approve", "reject"):
            raise ValueError("decision must be 'approve' or 'reject', got %r" % (decision,))
        body: dict = {"decision": decision}
        if note:
            body["note"] = note
        data = yield from self._call("POST", self._path("/approvals/%d" % int(seq)), body)
        return data


def approval_required(
    data: Any, base_url: str, namespace: Optional[str] = None, expired: bool = False
) -> errors.ApprovalRequiredError:
    """Return the ``ApprovalRequiredError`` of a 202 answer of the ledger at
    base_url, in namespace (None: default), or a copy of one such error,
    marked ``expired``."""
    if isinstance(data, errors.ApprovalRequiredError):
        return errors.ApprovalRequiredError(
            data.key, data.seq, data.expires_at, data.state, data.receipt, expired, data.url, data.answer
        )
    a = data.get("approval") if isinstance(data.get("approval"), dict) else {}
    seq = int(a.get("seq", 0))
    answer = "ledgerctl approvals approve %d --server %s" % (seq, base_url)
    if namespace:
        answer += " -n " + namespace
    return errors.ApprovalRequiredError(
        key=str(data.get("idempotency_key", "")),
        seq=seq,
        expires_at=int(a.get("expires_at", 0)),
        state=str(a.get("state", "pending")),
        receipt=ReceiptRef._from(data.get("receipt")),
        expired=expired,
        url=errors.approval_page_url(base_url, seq),
        answer=answer,
    )


def check_result(value: Any) -> Optional[str]:
    """Return why value cannot be committed as a result, or None."""
    try:
        size = len(encode_json(value))
    except (TypeError, ValueError) as e:
        return "the result is not JSON: %s" % e
    if size > MAX_RESULT_BYTES:
        return "the result is %d bytes of JSON, over the ledger's %d" % (size, MAX_RESULT_BYTES)
    return None


def effect_for_call(
    spec: Effect,
    fn: Callable,
    args: tuple,
    kwargs: dict,
    input_fn: Optional[Callable],
    key_fn: Optional[Callable],
) -> Effect:
    """Return the Effect of one call of a decorated function: input from
    ``input_fn`` or the bound arguments, key from ``key_fn`` or derived."""
    value = input_fn(*args, **kwargs) if input_fn is not None else bind_input(fn, args, kwargs)
    key = key_fn(*args, **kwargs) if key_fn is not None else None  # None: derived at the reserve
    return dataclasses.replace(spec, input=value, key=key)
