"""Shell support: `Refused`, the one exception a request handler raises for a request
it will not carry out; it becomes an `ApiError` reply that says what to change."""

from __future__ import annotations

from shared.api import ApiError


class Refused(Exception):
    """A request admission will not carry out; the message says what to change."""

    def __init__(self, message: str, code: str = "invalid", details: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.error = ApiError(error=message, code=code, details=details)
