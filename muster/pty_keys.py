"""Client: `srun --pty`'s keys to the agent's relay, none lost while no relay listens.

Keys were published on `<pty>.in` and nothing more: what was typed while no relay
listened was lost. That is while the node agent restarts (the terminal itself outlives
it), and before the relay's first subscribe, so `printf 'make\\n' | srun --pty sh`,
whose stdin is sent at once, often typed nothing. Now each message is a request: the
relay answers once it has written the keys to the terminal (steps_pty.py). "No
responders" means no relay listens now, and the same keys are asked again a moment
later, in order, so nothing typed later overtakes them. A request that gets no answer
was still heard by a relay, so it is not sent twice: a relay from before answers
existed (an agent not yet upgraded) never answers, and from the first such silence on
keys are only published, as they were.
"""

from __future__ import annotations

import asyncio

from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

ANSWER_S = 1.0  # a relay answers within milliseconds; past this it is not one that does
RETRY_S = 0.2  # between asks while no relay listens


class KeySender:
    """Keys (or a window size, in headers) to `subject`, one message at a time."""

    def __init__(self, nc: Client, subject: str) -> None:
        self.nc = nc
        self.subject = subject
        self.answers: bool | None = None  # None: not known yet whether the relay answers

    async def send(self, data: bytes, headers: dict[str, str] | None = None) -> None:
        while self.answers is not False:
            try:
                await self.nc.request(self.subject, data, timeout=ANSWER_S, headers=headers)
            except NoRespondersError:  # no relay listens now: ask again, keep the order
                await asyncio.sleep(RETRY_S)
                continue
            except NatsTimeout:  # heard, not answered: a relay from before answers
                if self.answers is None:
                    self.answers = False
                return
            self.answers = True
            return
        await self.nc.publish(self.subject, data, headers=headers)
