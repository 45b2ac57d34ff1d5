"""RFC 8785 canonicalization, fingerprints and derived keys (no server)."""

from __future__ import annotations

import hashlib
import struct

import pytest

from effect_ledger import canonical_json, derive_key, fingerprint
from effect_ledger.canonical import _number


def f64(bits: int) -> float:
    return struct.unpack(">d", bits.to_bytes(8, "big"))[0]


# RFC 8785 Appendix B: IEEE 754 bit patterns and their canonical text.
@pytest.mark.parametrize(
    "bits,want",
    [
        (0x0000000000000000, "0"),
        (0x8000000000000000, "0"),
        (0x0000000000000001, "5e-324"),
        (0x8000000000000001, "-5e-324"),
        (0x7FEFFFFFFFFFFFFF, "1.7976931348623157e+308"),
        (0xFFEFFFFFFFFFFFFF, "-1.7976931348623157e+308"),
        (0x4340000000000000, "9007199254740992"),
        (0xC340000000000000, "-9007199254740992"),
        (0x4430000000000000, "295147905179352830000"),
        (0x44B52D02C7E14AF5, "9.999999999999997e+22"),
        (0x44B52D02C7E14AF6, "1e+23"),
        (0x44B52D02C7E14AF7, "1.0000000000000001e+23"),
        (0x444B1AE4D6E2EF4E, "999999999999999700000"),
        (0x444B1AE4D6E2EF4F, "999999999999999900000"),
        (0x444B1AE4D6E2EF50, "1e+21"),
        (0x3EB0C6F7A0B5ED8C, "9.999999999999997e-7"),
        (0x3EB0C6F7A0B5ED8D, "0.000001"),
        (0x41B3DE4355555553, "333333333.3333332"),
        (0x41B3DE4355555554, "333333333.33333325"),
        (0x41B3DE4355555555, "333333333.3333333"),
        (0x41B3DE4355555556, "333333333.3333334"),
        (0x41B3DE4355555557, "333333333.33333343"),
        (0xBECBF647612F3696, "-0.0000033333333333333333"),
        (0x43143FF3C1CB0959, "1424953923781206.2"),
    ],
)
def test_number(bits: int, want: str) -> None:
    assert _number(f64(bits)) == want


def test_canonical_json() -> None:
    # RFC 8785 §3.2.3's sorting example: names compared as UTF-16 code units.
    value = {
        "\u20ac": "Euro Sign",
        "\r": "Carriage Return",
        "\ufb33": "Hebrew Letter Dalet With Dagesh",
        "1": "One",
        "\U0001f600": "Emoji: Grinning Face",
        "\x80": "Control",
        "\u00f6": "Latin Small Letter O With Diaeresis",
    }
    want = (
        '{"\\r":"Carriage Return","1":"One","\x80":"Control","\u00f6":"Latin Small Letter O With Diaeresis",'
        '"\u20ac":"Euro Sign","\U0001f600":"Emoji: Grinning Face","\ufb33":"Hebrew Letter Dalet With Dagesh"}'
    )
    assert canonical_json(value) == want.encode("utf-8")
    assert canonical_json({"b": [1, 2.5, True, None], "a": "x\n\u0001\"\\/"}) == (
        b'{"a":"x\\n\\u0001\\"\\\\/","b":[1,2.5,true,null]}'
    )
    assert canonical_json((1, 10**21, 2**53 + 1)) == b"[1,1e+21,9007199254740992]"


@pytest.mark.parametrize(
    "value,exc",
    [
        (float("nan"), ValueError),
        (float("inf"), ValueError),
        (10**400, ValueError),
        ("\ud800", ValueError),
        ({1: "x"}, TypeError),
        ({"x": object()}, TypeError),
        ({"x"}, TypeError),
    ],
)
def test_canonical_json_rejects(value: object, exc: type) -> None:
    with pytest.raises(exc):
        canonical_json(value)


def test_fingerprint_and_derived_key() -> None:
    assert fingerprint("x") == "sha256:" + hashlib.sha256(b'"x"').hexdigest()
    a = derive_key("payments.refund", {"order": 1234, "amount": 1200})
    b = derive_key("payments.refund", {"amount": 1200.0, "order": 1234})
    assert a == b
    want = hashlib.sha256(b'payments.refund\x00{"amount":1200,"order":1234}').hexdigest()
    assert a == "dk_" + want
    assert derive_key("payments.charge", {"order": 1234, "amount": 1200}) != a
    assert derive_key("payments.refund", {"order": 1234, "amount": 1201}) != a
    assert derive_key("t") == "dk_" + hashlib.sha256(b"t\x00null").hexdigest()
    assert all(0x21 <= ord(c) <= 0x7E for c in a) and len(a) == 67
    with pytest.raises(ValueError):
        derive_key("", {})


# The derivation vector pinned by the Go (client/key_test.go), Python and
# TypeScript (clients/typescript/test/canonical.test.mjs) suites alike.
CROSS_TOOL = "crm.contact.upsert"
CROSS_INPUT = {
    "name": "Zoë Ünal",
    "emails": ["zoe@example.com"],
    "age": 41,
    "score": 0.1,
    "big": 1e21,
    "small": 1e-7,
    "neg": -0.0,
    "ok": True,
    "none": None,
    "€": "euro",
    "é": "e-acute",
    "a\nb": "tab\t\u0001",
}


def test_derived_key_same_as_go_and_typescript() -> None:
    assert derive_key(CROSS_TOOL, CROSS_INPUT) == "dk_469d84d0f62eb0da9f12f4e7322f1679998e36bc1fa682f55edb5e6c5457724a"
    assert fingerprint(CROSS_INPUT) == "sha256:849fddd7ea461d28838de74ba790297d074cc85558d3ee82c3050320ec388b44"


# The dk2_ vector (SPEC §14) pinned alike: a derivation key of bytes 0x00 ... 0x1f.
CROSS_DERIVATION_KEY = bytes(range(32))


def test_derived_key2_same_as_go_and_typescript() -> None:
    k = CROSS_DERIVATION_KEY
    assert derive_key(CROSS_TOOL, CROSS_INPUT, k) == "dk2_1eb893d57b5576d26f89a6673c6f2fafae5af686fdf85712bf1f729206e3dd17"
    # printf 'payments.refund\0{"amount":1200,"order":1234}' | openssl dgst -sha256 -mac HMAC -macopt hexkey:0001...1f
    assert (
        derive_key("payments.refund", {"order": 1234, "amount": 1200}, k)
        == "dk2_0a9d3f77240a6a4953cce53ebbe391bc1175c9d02f0e90a28852fdf59524370c"
    )
    assert derive_key("t", None, k) == "dk2_ba5650b624f400768aeca378e635bd33868970589c2564363a5483287279ff18"
    assert derive_key("t", None, bytes(32)) != derive_key("t", None, k), "another namespace, another key"
    with pytest.raises(ValueError):
        derive_key("t", None, b"")


def test_replay_with_a_damaged_result_is_an_error():
    from effect_ledger._types import Replay
    from effect_ledger.errors import BadResponseError

    with pytest.raises(BadResponseError) as e:
        Replay._from({"status": "replayed", "idempotency_key": "k-12345678", "outcome": "succeeded",
                      "result": "not json", "result_encoding": "text"})
    assert "damaged" in str(e.value)
