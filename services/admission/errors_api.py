"""Shell support: `Refused`, the one exception a request handler raises for a request
it will not carry out; it becomes an `ApiError` reply that says what to change."""

from __future__ import annotations

from shared.apiserve import Refused

__all__ = ["Refused"]
