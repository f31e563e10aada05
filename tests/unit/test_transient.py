"""Table test of the one transient-error list (`shared/transient.py`): what an outage of
PostgreSQL or NATS raises is retried; a bug or bad input is not."""

from __future__ import annotations

import asyncpg
import msgspec
import nats.errors
import nats.js.errors
import pytest

from shared.api import Envelope
from shared.apiserve import UNAVAILABLE, enveloped
from shared.bus import PermanentError
from shared.transient import Backoff, is_transient


def _raised_from(err: BaseException, cause: BaseException) -> BaseException:
    err.__cause__ = cause
    return err


CASES: dict[str, tuple[BaseException, bool]] = {
    "PostgreSQL closed the connection mid-query": (
        asyncpg.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
        True,
    ),
    "PostgreSQL is still starting after a restart": (
        asyncpg.CannotConnectNowError("the database system is starting up"),
        True,
    ),
    "PostgreSQL terminated the session at shutdown": (
        asyncpg.AdminShutdownError("terminating connection due to administrator command"),
        True,
    ),
    "PostgreSQL is out of connection slots": (
        asyncpg.TooManyConnectionsError("sorry, too many clients already"),
        True,
    ),
    "the connect was refused while PostgreSQL is down": (ConnectionRefusedError(111, "x"), True),
    "a pooled connection was closed under us": (
        asyncpg.InterfaceError("cannot call Connection.fetch(): connection is closed"),
        True,
    ),
    "asyncpg had not yet noticed that the server vanished": (
        asyncpg.InternalClientError(
            "cannot switch to state 12; another operation (2) is in progress"
        ),
        True,
    ),
    "the pool detached a connection in use when its server died": (
        asyncpg.InterfaceError(
            "cannot call Connection.fetchval(): connection has been released back to the pool"
        ),
        True,
    ),
    "the pool is closing at shutdown": (asyncpg.InterfaceError("pool is closing"), True),
    "lock_timeout expired": (
        asyncpg.LockNotAvailableError("canceling statement due to lock timeout"),
        True,
    ),
    "statement_timeout expired": (
        asyncpg.QueryCanceledError("canceling statement due to statement timeout"),
        True,
    ),
    "a serializable transaction lost a race": (
        asyncpg.SerializationError("could not serialize access"),
        True,
    ),
    "two transactions deadlocked": (asyncpg.DeadlockDetectedError("deadlock detected"), True),
    "asyncpg's command_timeout expired": (TimeoutError(), True),
    "NATS connection closed": (nats.errors.ConnectionClosedError(), True),
    "no NATS server reachable": (nats.errors.NoServersError(), True),
    "a NATS request timed out during a reconnect": (nats.errors.TimeoutError(), True),
    "JetStream API has no responders during a restart": (nats.errors.NoRespondersError(), True),
    "a stream answers nothing while its cluster elects a new leader": (
        nats.js.errors.NoStreamResponseError(),
        True,
    ),
    "JetStream API answered 503": (nats.js.errors.ServiceUnavailableError(code=503), True),
    "JetStream API answered 408": (nats.js.errors.APIError(code=408), True),
    "a replicated create while a peer is offline": (
        nats.js.errors.BadRequestError(code=400, err_code=10005),
        True,
    ),
    "a service error raised from a lost connection": (
        _raised_from(RuntimeError("cycle failed"), ConnectionResetError()),
        True,
    ),
    "a task group whose every task lost the database": (
        ExceptionGroup("tasks", [ConnectionRefusedError(), asyncpg.CannotConnectNowError("x")]),
        True,
    ),
    "a task group with one bug among outages": (
        ExceptionGroup("tasks", [ConnectionRefusedError(), KeyError("job")]),
        False,
    ),
    "asyncpg misuse is a bug": (
        asyncpg.InterfaceError("cannot perform operation: another operation is in progress"),
        False,
    ),
    "a constraint violation is a bug or a race the code must handle": (
        asyncpg.UniqueViolationError("duplicate key value"),
        False,
    ),
    "a syntax error in SQL is a bug": (asyncpg.PostgresSyntaxError("syntax error"), False),
    "JetStream says the stream does not exist": (nats.js.errors.NotFoundError(code=404), False),
    "a bad request to JetStream": (nats.js.errors.BadRequestError(code=400), False),
    "a stream name in use with another config": (
        nats.js.errors.BadRequestError(code=400, err_code=10058),
        False,
    ),
    "a permanent handler error": (PermanentError("job 7 has no spec"), False),
    "an ordinary bug": (KeyError("node01"), False),
    "a value error from bad input": (ValueError("gpus must be positive"), False),
}


@pytest.mark.parametrize(("err", "want"), CASES.values(), ids=CASES.keys())
def test_is_transient(err: BaseException, want: bool) -> None:
    assert is_transient(err) is want


def test_backoff_doubles_up_to_its_cap_and_starts_over_after_a_reset() -> None:
    backoff = Backoff(first_s=0.1, max_s=0.5)
    assert [backoff.next_s() for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    backoff.reset()
    assert backoff.next_s() == 0.1


async def test_a_request_that_meets_an_outage_is_answered_unavailable_not_internal() -> None:
    async def route(payload: bytes) -> msgspec.Struct:
        raise asyncpg.CannotConnectNowError("the database system is starting up")

    reply = msgspec.json.decode(await enveloped(route)(b"{}", "muster.api.submit"), type=Envelope)

    assert reply.error == UNAVAILABLE
