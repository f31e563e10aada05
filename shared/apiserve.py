"""Plumbing: the server side of the request-reply API, shared by every service that
answers `muster.api.*` — decode the typed request, run it, and wrap the result or the
refusal in one `Envelope`."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import msgspec

from shared.api import ApiError, Envelope
from shared.logs import kv
from shared.transient import is_transient

log = logging.getLogger(__name__)

R = TypeVar("R", bound=msgspec.Struct)
UNAVAILABLE = ApiError(
    error="the control plane cannot reach its database or bus just now; try again shortly",
    code="unavailable",
)
Route = Callable[[bytes], Awaitable[msgspec.Struct]]


class Refused(Exception):
    """A request a service will not carry out; the message says what to change."""

    def __init__(self, message: str, code: str = "invalid", details: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.error = ApiError(error=message, code=code, details=details)


def typed(kind: type[R], fn: Callable[[R], Awaitable[msgspec.Struct]]) -> Route:
    """A route that decodes its request as `kind` (refusing a malformed one) first."""

    async def call(payload: bytes) -> msgspec.Struct:
        try:
            req = msgspec.json.decode(payload, type=kind)
        except (msgspec.DecodeError, msgspec.ValidationError) as err:
            raise Refused(f"malformed request: {err}", "malformed") from err
        return await fn(req)

    return call


def enveloped(route: Route) -> Callable[[bytes, str], Awaitable[bytes]]:
    """The bus handler of a route: its result or its refusal, as an `Envelope`."""

    async def handler(payload: bytes, subject: str) -> bytes:
        try:
            result = await route(payload)
        except Refused as err:
            return msgspec.json.encode(Envelope(error=err.error))
        except Exception as err:
            if is_transient(err):
                # Almost always nothing was done (a connection lost in the very commit is
                # the exception), so say "try again" rather than "internal error".
                log.warning("request met an outage", extra=kv(subject=subject, error=repr(err)))
                return msgspec.json.encode(Envelope(error=UNAVAILABLE))
            log.exception("request failed", extra=kv(subject=subject))
            error = ApiError(error=f"internal error: {type(err).__name__}: {err}", code="internal")
            return msgspec.json.encode(Envelope(error=error))
        return msgspec.json.encode(Envelope(ok=msgspec.Raw(msgspec.json.encode(result))))

    return handler
