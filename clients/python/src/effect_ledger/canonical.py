"""RFC 8785 JSON canonicalization, input fingerprints and derived keys.

The ledger fingerprints a reserve's ``input`` as ``sha256:`` + the hex
SHA-256 of its RFC 8785 (JSON Canonicalization Scheme) form; ``fingerprint``
computes the same value on the client. ``derive_key`` turns what a call does
(its tool and canonical input) into a stable idempotency key, for callers
that have none (the decorator uses it): ``dk_`` in an inline namespace,
``dk2_`` with the namespace's derivation key in one that commits its
payloads (SPEC §14).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from typing import Any, Optional

__all__ = ["canonical_json", "fingerprint", "derive_key", "DERIVED_KEY_PREFIX", "DERIVED_KEY2_PREFIX"]

#: Prefix of every key made by ``derive_key`` without a derivation key.
DERIVED_KEY_PREFIX = "dk_"
#: Prefix of every key made by ``derive_key`` with a derivation key.
DERIVED_KEY2_PREFIX = "dk2_"


def canonical_json(value: Any) -> bytes:
    """Return the RFC 8785 canonical UTF-8 form of a JSON value.

    ``value`` is made of ``dict`` (string keys), ``list``/``tuple``, ``str``,
    ``int``, ``float``, ``bool`` and ``None``. Members are sorted by the
    UTF-16 code units of their names, numbers are written as ECMAScript
    writes IEEE 754 doubles (integers beyond 2**53 lose precision, as in
    every RFC 8785 implementation), and strings use the minimal JSON escapes.

    Raises ``TypeError`` for other types or non-string keys and
    ``ValueError`` for NaN, infinities, integers too large for a double and
    strings that are not valid Unicode (lone surrogates).
    """
    out: list[str] = []
    _write(value, out)
    try:
        return "".join(out).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError("string is not valid Unicode: %s" % exc.reason) from exc


def fingerprint(value: Any) -> str:
    """Return the ledger's fingerprint of an input: ``sha256:<hex>``."""
    return "sha256:" + hashlib.sha256(canonical_json(value)).hexdigest()


def derive_key(tool: str, value: Any = None, key: Optional[bytes] = None) -> str:
    """Return a stable idempotency key for calling ``tool`` with ``value``.

    The message is the UTF-8 tool name, one 0x00 byte, and the RFC 8785
    canonical form of the input (``null`` when there is none). Without
    ``key`` the result is ``dk_`` followed by the lowercase hex SHA-256 of
    the message; with ``key``, a namespace's derivation key (the clients
    fetch it once, SPEC §14), it is ``dk2_`` followed by the lowercase hex
    HMAC-SHA-256 of the message under ``key``, so a reader of the chain
    cannot confirm a guessed input from the key. Either is visible ASCII,
    a valid key for any tool, and the same in the Go and TypeScript
    clients. The same tool and the same input (whatever the order of
    object members or the spelling of numbers) give the same key, so a
    repeated call is recognised as the same effect.
    """
    if not tool:
        raise ValueError("derive_key: tool is required")
    message = tool.encode("utf-8") + b"\x00" + canonical_json(value)
    if key is None:
        return DERIVED_KEY_PREFIX + hashlib.sha256(message).hexdigest()
    if not key:
        raise ValueError("derive_key: the derivation key is empty")
    return DERIVED_KEY2_PREFIX + hmac.new(bytes(key), message, hashlib.sha256).hexdigest()


def _write(v: Any, out: list[str]) -> None:
    # bool before int: bool is a subclass of int.
    if v is None:
        out.append("null")
    elif v is True:
        out.append("true")
    elif v is False:
        out.append("false")
    elif isinstance(v, str):
        out.append(_string(v))
    elif isinstance(v, int):
        try:
            f = float(v)
        except OverflowError as exc:
            raise ValueError("integer %d is too large for a JSON number" % v) from exc
        out.append(_number(f))
    elif isinstance(v, float):
        out.append(_number(v))
    elif isinstance(v, dict):
        for k in v:
            if not isinstance(k, str):
                raise TypeError("JSON object keys must be strings, not %s" % type(k).__name__)
        out.append("{")
        for i, k in enumerate(sorted(v, key=_utf16_key)):
            if i:
                out.append(",")
            out.append(_string(k))
            out.append(":")
            _write(v[k], out)
        out.append("}")
    elif isinstance(v, (list, tuple)):
        out.append("[")
        for i, item in enumerate(v):
            if i:
                out.append(",")
            _write(item, out)
        out.append("]")
    else:
        raise TypeError("%s is not a JSON value" % type(v).__name__)


def _utf16_key(s: str) -> bytes:
    # Big-endian UTF-16 bytes compare like the sequence of code units.
    return s.encode("utf-16-be", "surrogatepass")


def _string(s: str) -> str:
    # Python's minimal escapes are RFC 8785's: \" \\ \b \f \n \r \t and
    # \u00xx (lowercase hex) for the other control characters.
    return json.dumps(s, ensure_ascii=False)


def _number(x: float) -> str:
    """Return the ECMAScript ``Number.prototype.toString`` form of ``x``
    (RFC 8785 §3.2.2.3); ``ValueError`` for NaN and infinities."""
    if math.isnan(x) or math.isinf(x):
        raise ValueError("%r is not a JSON number" % x)
    if x == 0:
        return "0"  # also -0
    sign = "-" if x < 0 else ""
    # repr gives the shortest digits that round-trip, as ECMAScript needs.
    mantissa, _, exp = repr(abs(x)).partition("e")
    whole, _, frac = mantissa.partition(".")
    all_digits = whole + frac
    digits = all_digits.lstrip("0")
    # n: the decimal point sits n digits after the first significant one.
    n = len(whole) - (len(all_digits) - len(digits)) + (int(exp) if exp else 0)
    digits = digits.rstrip("0")
    k = len(digits)
    if k <= n <= 21:
        s = digits + "0" * (n - k)
    elif 0 < n <= 21:
        s = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        s = "0." + "0" * (-n) + digits
    else:
        e = n - 1
        s = digits[0] + ("." + digits[1:] if k > 1 else "") + "e" + ("+" if e >= 0 else "-") + str(abs(e))
    return sign + s
