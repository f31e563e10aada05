"""Plumbing: the one list of transient errors, the ones an outage causes.

A transient error says "the database or the bus is away, or refused this attempt for a
reason that passes" (connection lost, server restarting, lock or statement timeout,
serialization failure, deadlock). Retrying the same work later is right, and such an
error never counts toward a message's poison budget nor ends a service. Everything else
is a bug or bad input. Every retry loop asks `is_transient`; nobody keeps a copy.
"""

from __future__ import annotations

import asyncio
import contextlib

import asyncpg
import nats.errors
import nats.js.errors

# Connection loss, refused or throttled connects, and what the timeouts of
# `shared.db.create_pool` raise (lock_timeout, statement_timeout, idle in transaction).
POSTGRES: tuple[type[BaseException], ...] = (
    asyncpg.PostgresConnectionError,  # includes ConnectionDoesNotExistError (08003)
    asyncpg.CannotConnectNowError,  # 57P03: starting up or shutting down
    asyncpg.AdminShutdownError,  # 57P01: terminated by a restart
    asyncpg.CrashShutdownError,  # 57P02: another backend crashed
    asyncpg.TooManyConnectionsError,  # 53300
    asyncpg.LockNotAvailableError,  # 55P03: lock_timeout
    asyncpg.QueryCanceledError,  # 57014: statement_timeout
    asyncpg.IdleInTransactionSessionTimeoutError,  # 25P03
    asyncpg.SerializationError,  # 40001
    asyncpg.DeadlockDetectedError,  # 40P01
)

# A reconnecting or restarting NATS server; nats.py's TimeoutError is also an OSError.
NATS: tuple[type[BaseException], ...] = (
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.NoServersError,
    nats.errors.NoRespondersError,  # JetStream API not answering during a restart
    nats.errors.StaleConnectionError,
    nats.errors.OutboundBufferLimitError,  # publishes buffered while reconnecting
    nats.errors.TimeoutError,
    nats.js.errors.ServiceUnavailableError,  # 503 from the JetStream API
    nats.js.errors.NoStreamResponseError,  # a replicated stream electing a new leader
)

TRANSIENT: tuple[type[BaseException], ...] = (*POSTGRES, *NATS, OSError, TimeoutError)

# asyncpg raises a bare InterfaceError both for a closed connection (an outage) and for
# misuse (a bug); only the former is transient, and only its message tells them apart.
# "Released back to the pool" is what a connection in use says once its server died:
# the pool detaches it when it sees the close (using one after its `async with` would
# say the same, but that bug fails every time, in every test).
_CLOSED_MARKERS = (
    "connection is closed",
    "connection was closed",
    "pool is clos",
    "released back to the pool",
)

# JetStream API answers that mean "not now": 503 no responders, 408 request timeout.
_RETRY_API_CODES = frozenset({408, 503})
# ... and error codes that do, whatever the status: 10005 "no suitable peers for
# placement, peer offline" is a replicated create while the cluster is still forming
# or one of its servers restarts.
_RETRY_API_ERR_CODES = frozenset({10005})


def is_transient(err: BaseException) -> bool:
    """True if `err` (or what it was raised from) is an outage, worth retrying later.

    An exception group is transient only when every error in it is.
    """
    if isinstance(err, BaseExceptionGroup):
        return all(is_transient(inner) for inner in err.exceptions)
    if isinstance(err, TRANSIENT):
        return True
    if isinstance(err, asyncpg.InterfaceError):
        text = str(err).lower()
        return any(marker in text for marker in _CLOSED_MARKERS)
    if isinstance(err, asyncpg.InternalClientError):
        # Seen once per dying connection when the server vanished mid-protocol and
        # asyncpg has not processed the close yet; the pool replaces the connection.
        return str(err).startswith("cannot switch to state")
    if isinstance(err, nats.js.errors.APIError):
        return err.code in _RETRY_API_CODES or err.err_code in _RETRY_API_ERR_CODES
    cause = err.__cause__
    return cause is not None and is_transient(cause)


# The longest wait between two tries: the end of an outage is noticed within it.
RETRY_MAX_S = 2.0


class Backoff:
    """The waits of one retry loop: exponential from `first_s`, capped at `max_s`.

    No jitter: the loops that use it are few per process and already out of step.
    """

    def __init__(self, first_s: float = 0.1, max_s: float = RETRY_MAX_S) -> None:
        self.first_s = first_s
        self.max_s = max_s
        self.failures = 0

    def next_s(self) -> float:
        """The wait after one more failure."""
        delay = min(self.max_s, self.first_s * 2.0**self.failures)
        self.failures += 1
        return delay

    def reset(self) -> None:
        self.failures = 0

    async def wait(self, stop: asyncio.Event) -> None:
        """Sleep the next wait, or less if `stop` is set meanwhile."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=self.next_s())
