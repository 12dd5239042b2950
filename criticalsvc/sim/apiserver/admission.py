"""Writes through admission, and the warnings the webhooks return.

The webhook calls themselves are the store's (Store.admission calls every RegisteredWebhook whose
rules match, through webhook_client.py); the writer thread lends the store's lock to readers while a
call is out (standin.py). What this module adds is the HTTP side: the warnings a write collected go
back to the client as `Warning` headers, on success and on refusal alike (responses.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from ..store import StatusError
from .context import APIServer

T = TypeVar("T")


async def admitted_write(standin: APIServer, fn: Callable[[], T]) -> tuple[T, list[str]]:
    """Run the write `fn` on the writer thread; return its result and the webhooks' warnings (a
    StatusError it raises carries them in `warnings`)."""
    store = standin.store

    def op() -> tuple[T, list[str]]:
        store.admission_warnings.clear()
        try:
            result = fn()
        except StatusError as exc:
            exc.warnings = list(store.admission_warnings)  # type: ignore[attr-defined]
            raise
        return result, list(store.admission_warnings)

    return await standin.write(op)
