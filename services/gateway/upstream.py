"""Shell: the gateway's side of the NATS API — the same signed `muster.api.<verb>`
requests the CLI sends (shared.api, shared.identity), over one long-lived connection,
signed with the one key the gateway acts with.

A reply is returned as the raw JSON of its result (the gateway relays it), or raised as
`Refusal` carrying the API's own `ApiError`, so an HTTP client reads the very message
the CLI prints."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any, TypeVar

import msgspec
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from shared.api import API_PREFIX, ApiError, Envelope
from shared.identity import Signer

T = TypeVar("T")
# Served by fairshare; every other verb by admission (for the "is it up?" message).
FAIRSHARE_VERBS = frozenset({"share", "acct", "report", "cluster_report", "sizes_report"})
NO_RESPONDERS_WAIT_S = 5.0


class Refusal(Exception):
    """The API refused (or could not be reached); `error` is what it said."""

    def __init__(self, error: ApiError) -> None:
        super().__init__(error.error)
        self.error = error


class Upstream:
    """Signed requests as one user over a connection the gateway owns."""

    def __init__(self, nc: Client, signer: Signer, user: str, timeout_s: float = 15.0) -> None:
        self.nc = nc
        self.signer = signer
        self.user = user
        self.timeout_s = timeout_s

    async def raw(self, verb: str, request: object) -> msgspec.Raw:
        """The raw JSON result of `request` to `muster.api.<verb>`, or `Refusal`."""
        subject = API_PREFIX + verb
        body = msgspec.json.encode(request)
        payload = self.signer.sign(subject, body, now=time.time(), nonce=os.urandom(16))
        data = await self._request(subject, payload, verb)
        try:
            env = msgspec.json.decode(data, type=Envelope)
        except msgspec.DecodeError as err:
            raise Refusal(
                ApiError(error=f"bad reply on {subject}: {err}", code="internal")
            ) from err
        if env.error is not None:
            raise Refusal(env.error)
        return env.ok

    async def call(self, verb: str, request: Any, reply: type[T]) -> T:
        return msgspec.json.decode(await self.raw(verb, request), type=reply)

    async def _request(self, subject: str, payload: bytes, verb: str) -> bytes:
        """Wait out a service still starting (no responders) for a little while."""
        deadline = time.monotonic() + NO_RESPONDERS_WAIT_S
        while True:
            try:
                msg = await self.nc.request(subject, payload, timeout=self.timeout_s)
                return msg.data
            except NoRespondersError as err:
                if time.monotonic() > deadline:
                    service = "fairshare" if verb in FAIRSHARE_VERBS else "admission"
                    raise Refusal(
                        ApiError(
                            error=f"no {service} service answers on {subject}; is the cluster up?",
                            code="unavailable",
                        )
                    ) from err
                await asyncio.sleep(0.2)
            except NatsTimeout as err:
                raise Refusal(
                    ApiError(
                        error=f"no reply on {subject} in {self.timeout_s:g}s; try again",
                        code="unavailable",
                    )
                ) from err
