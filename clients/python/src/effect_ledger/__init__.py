"""Python client of the effect ledger (``ledgerd``).

Reserve an idempotency key before a tool call's side effect, commit its
outcome afterwards, and get the recorded result back instead of running the
effect again when the call repeats::

    from effect_ledger import Ledger

    ledger = Ledger("http://127.0.0.1:8080", token="elt_...")

    @ledger.effect(tool="payments.refund", effect="write", idempotent=True)
    def refund(order_id: int, amount: int) -> dict:
        return psp.refund(order_id, amount)   # runs at most once per (tool, input)

``AsyncLedger`` is the same for asyncio. See the package README for the
context manager, ``do``, waiting, retries and errors.
"""

from ._async import AsyncEffectHandle, AsyncEffectScope, AsyncLedger
from ._core import current_reservation
from ._handle import HandleBase, ResultNotRecordedError
from ._sync import EffectHandle, EffectScope, Ledger
from ._types import (
    EFFECT_CLASSES,
    ApprovalUse,
    Changed,
    Committed,
    DerivationKey,
    Effect,
    EffectResult,
    NotAppliedRef,
    NotRecorded,
    Outcome,
    ReceiptRef,
    Reconciled,
    Renewal,
    Replay,
    Reservation,
    current_execution,
    execution,
)
from .canonical import canonical_json, derive_key, fingerprint
from . import errors as _errors
from .errors import *  # noqa: F401,F403 (the names of errors.__all__)

__version__ = "0.4.0.dev0"

__all__ = [
    "Ledger",
    "AsyncLedger",
    "Effect",
    "Outcome",
    "EffectResult",
    "Reservation",
    "Renewal",
    "NotAppliedRef",
    "Changed",
    "ApprovalUse",
    "Replay",
    "NotRecorded",
    "Committed",
    "DerivationKey",
    "ReceiptRef",
    "Reconciled",
    "EffectHandle",
    "AsyncEffectHandle",
    "EffectScope",
    "AsyncEffectScope",
    "HandleBase",
    "ResultNotRecordedError",
    "EFFECT_CLASSES",
    "execution",
    "current_execution",
    "current_reservation",
    "canonical_json",
    "fingerprint",
    "derive_key",
]
__all__ += _errors.__all__
