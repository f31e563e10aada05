"""Plumbing: the one bus adapter over NATS JetStream.

Acknowledgement policy lives here and nowhere else: a handled message is acked; a
`PermanentError` or an undecodable payload is terminated and copied to the dead-letter
stream; a transient error (`shared.transient`: PostgreSQL or NATS away) is retried in
process, the ack deadline extended, so an outage spends no delivery; any other error is
nak'ed with backoff until `max_deliver`, then dead-lettered. A consumer outlives NATS
restarts: it re-binds its durable after a backoff. Every publish carries
`Nats-Msg-Id`, so JetStream drops re-publishes of one event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import msgspec
import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext, api
from nats.js.errors import BadRequestError, NotFoundError
from opentelemetry import trace

from shared.events import AnyEvent, Event, decode, encode, node_mismatch, subject_of, tag_of
from shared.logs import kv
from shared.security import nats_options
from shared.telemetry import extract_context, inject_headers
from shared.transient import Backoff, is_transient
from shared.urls import nats_servers
from shared.waits import cancel_and_wait

log = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

STREAM = "MUSTER"
STREAM_SUBJECTS = [
    "muster.job.>",
    "muster.node.>",
    "muster.gpu.>",
    "muster.worker.>",
    "muster.usage.>",
]
DLQ_STREAM = "MUSTER_DLQ"
DLQ_PREFIX = "muster.dlq."
BACKOFF_S = (0.2, 1.0, 3.0, 10.0, 30.0)
NOT_MINE_DELAY_S = 1.0  # a hand-back to the replica that owns the work
STREAM_MAX_AGE_S = 7 * 24 * 3600.0  # what the event streams keep: a week
STREAM_NAME_IN_USE = 10058  # add_stream's answer for an existing, different config
STREAM_VISIBLE_S = 10.0  # how long a created stream may take to answer (a forming cluster)
CRASH_LIMIT_FACTOR = 10
FIRST_CONNECT_S = 10.0

Handler = Callable[[AnyEvent], Awaitable[None]]
RequestHandler = Callable[[bytes, str], Awaitable[bytes]]


class NotMine(Exception):
    """This replica may not apply the message now, another one can (a standby placer
    asked for spares the leader grants): it is handed back at once, and a hand-back is
    no failure, so it never spends the poison budget (only the crash limit bounds it)."""


class PermanentError(Exception):
    """The message can never be handled; retrying is pointless. It is dead-lettered."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


async def _connected(connecting: asyncio.Task[Client], timeout_s: float) -> Client:
    """The client `connecting` gives within `timeout_s`. Otherwise, or when the caller
    is cancelled, the connect is cancelled and waited out (`_abandon`). TimeoutError
    (transient) when it did not connect in time."""
    try:
        done, _ = await asyncio.wait((connecting,), timeout=timeout_s)
    except asyncio.CancelledError:
        await _abandon(connecting)
        raise
    if not done:
        await _abandon(connecting)
        raise TimeoutError(f"NATS did not connect within {timeout_s} s")
    return connecting.result()


async def _abandon(connecting: asyncio.Task[Client]) -> None:
    """Cancel a connect and wait until it has ended; a client it made even so (it
    connected as the cancel came) is closed."""
    try:
        await cancel_and_wait(connecting)
    finally:
        if connecting.done() and not connecting.cancelled() and connecting.exception() is None:
            with contextlib.suppress(Exception):
                await connecting.result().close()


class Bus:
    """A connection to NATS with JetStream, owned by one process."""

    def __init__(
        self,
        nc: Client,
        *,
        max_deliver: int = 5,
        ack_wait_s: float = 10.0,
        stream_replicas: int = 1,
    ) -> None:
        self.nc = nc
        self.stream_replicas = stream_replicas
        self.js: JetStreamContext = nc.jetstream()
        self.max_deliver = max_deliver
        self.ack_wait_s = ack_wait_s
        # Deliveries that ended in no outcome at all (the consumer was killed, or NATS
        # was away past the ack deadline) are not failures; only a message delivered
        # this often without one is taken for a message that kills its consumer.
        self.crash_limit = CRASH_LIMIT_FACTOR * max_deliver
        self._answering: set[asyncio.Task[None]] = set()  # `serve(concurrent=True)`'s

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        name: str,
        max_deliver: int = 5,
        ack_wait_s: float = 10.0,
        stream_replicas: int = 1,
        creds: str = "",
        tls_ca: str = "",
        inbox_prefix: str = "",
    ) -> Bus:
        """Connect once (callers wait out a server that is not up, see
        `shared.runtime.until_ready`); afterwards nats.py reconnects for ever, and the
        subscriptions and buffered publishes survive a server restart. On a secured bus
        `creds` is the process's NKey seed file, `tls_ca` the CA its servers' certificates
        are verified with, `inbox_prefix` its identity's own (`shared.security`)."""

        async def disconnected() -> None:
            log.warning("NATS disconnected, reconnecting", extra=kv(client=name))

        async def reconnected() -> None:
            log.info("NATS reconnected", extra=kv(client=name))

        async def error(err: Exception) -> None:
            # Each failed reconnect try reports here; the disconnect was logged once.
            level = logging.DEBUG if is_transient(err) else logging.WARNING
            log.log(level, "NATS client error", extra=kv(client=name, error=repr(err)))

        # With endless reconnects nats.py would also retry the first connect for ever;
        # bound it, so the caller's retry loop can see `stop` between tries. Not with
        # `asyncio.wait_for`: a cancel it loses leaves the connect retrying for ever
        # (shared/waits.py), here or behind a caller that was cancelled.
        connecting = asyncio.ensure_future(
            nats.connect(
                nats_servers(url),
                name=name,
                connect_timeout=5,
                allow_reconnect=True,
                max_reconnect_attempts=-1,
                reconnect_time_wait=0.5,
                disconnected_cb=disconnected,
                reconnected_cb=reconnected,
                error_cb=error,
                **nats_options(creds, tls_ca, inbox_prefix),
            )
        )
        nc = await _connected(connecting, FIRST_CONNECT_S)
        return cls(
            nc, max_deliver=max_deliver, ack_wait_s=ack_wait_s, stream_replicas=stream_replicas
        )

    async def round_trip(self, timeout_s: int) -> None:
        """A PING answered by the server's PONG: proof that it hears us right now.
        Raises nats' FlushTimeoutError (transient) when no answer comes in time."""
        try:
            await self.nc.flush(timeout=timeout_s)
        finally:
            # nats.py leaves a timed-out flush's cancelled future queued for the next
            # PONG, whose set_result then raises inside the client's read loop and wedges
            # the connection for good (chaos seed 2, after a partition healed): drop
            # every settled one, so a late PONG answers the next ping instead.
            pongs = self.nc._pongs
            pongs[:] = [f for f in pongs if not f.done()]

    async def close(self) -> None:
        if self._answering:  # requests being answered: a moment to send their replies
            _, late = await asyncio.wait(self._answering, timeout=5)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.nc.drain(), timeout=5)
        if not self.nc.is_closed:
            await self.nc.close()

    async def ensure_streams(self) -> None:
        """Create or update the event and dead-letter streams; safe to call concurrently."""
        for name, subjects in ((STREAM, STREAM_SUBJECTS), (DLQ_STREAM, [DLQ_PREFIX + ">"])):
            config = api.StreamConfig(
                name=name,
                subjects=subjects,
                storage=api.StorageType.FILE,
                duplicate_window=120.0,
                max_age=STREAM_MAX_AGE_S,
                num_replicas=self.stream_replicas,
            )
            try:
                await self.js.add_stream(config)
            except BadRequestError as err:
                if err.err_code != STREAM_NAME_IN_USE:
                    raise  # e.g. 10005 "no suitable peers": transient, retried whole
                await self.js.update_stream(config)
            await self._visible(name)

    async def _visible(self, stream: str) -> None:
        """Until `stream` answers here: a cluster that just formed accepts the create
        and can still say "stream not found" to the next call (its servers apply the
        assignment, then elect the stream's leader). TimeoutError (transient) after
        `STREAM_VISIBLE_S`, so `until_ready` tries the whole creation again."""
        deadline = asyncio.get_running_loop().time() + STREAM_VISIBLE_S
        while True:
            try:
                await self.js.stream_info(stream)
                return
            except NotFoundError:
                if asyncio.get_running_loop().time() > deadline:
                    raise TimeoutError(
                        f"stream {stream} created but not found after {STREAM_VISIBLE_S:.0f} s"
                    ) from None
                await asyncio.sleep(0.05)

    # --- publish ---------------------------------------------------------------------

    async def publish(self, event: Event) -> None:
        await self.publish_raw(subject_of(event), encode(event), str(event.event_id), {})

    async def publish_raw(
        self, subject: str, payload: bytes, msg_id: str, headers: dict[str, str]
    ) -> None:
        hdrs = inject_headers(headers)
        hdrs["Nats-Msg-Id"] = msg_id
        await self.js.publish(subject, payload, timeout=5.0, headers=hdrs)

    # --- consume ---------------------------------------------------------------------

    async def consume(
        self,
        durable: str,
        subjects: Sequence[str],
        handler: Handler,
        stop: asyncio.Event,
        *,
        batch: int = 32,
    ) -> None:
        """Pull `subjects` with a durable consumer until `stop` is set.

        The message in hand is finished before returning. A transient bus error (NATS
        restarting, the JetStream API not answering) re-binds the consumer after a
        backoff instead of ending the loop; the durable keeps its position.
        """
        backoff = Backoff()
        while not stop.is_set():
            try:
                await self._consume_bound(durable, subjects, handler, stop, batch, backoff)
            except Exception as err:
                if not is_transient(err):
                    raise
                log.warning("consumer lost the bus", extra=kv(durable=durable, error=repr(err)))
                await backoff.wait(stop)

    async def _consume_bound(
        self,
        durable: str,
        subjects: Sequence[str],
        handler: Handler,
        stop: asyncio.Event,
        batch: int,
        backoff: Backoff,
    ) -> None:
        """One binding of the durable; the subscription is always unsubscribed, or
        draining can hang on late pull responses."""
        sub = await self._pull_subscription(durable, subjects)
        in_hand: list[Msg] = []  # fetched, not yet finished: their deadlines are kept
        keeper = asyncio.ensure_future(_keep_deadlines(in_hand, self.ack_wait_s / 3))
        try:
            while not stop.is_set():
                msgs = await _fetch(sub, batch)
                backoff.reset()
                for i, msg in enumerate(msgs):
                    in_hand[:] = msgs[i:]
                    await self._deliver(durable, msg, handler, stop)
                in_hand.clear()
        finally:
            keeper.cancel()
            await asyncio.wait([keeper])
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _pull_subscription(
        self, durable: str, subjects: Sequence[str]
    ) -> JetStreamContext.PullSubscription:
        config = api.ConsumerConfig(
            durable_name=durable,
            ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=self.ack_wait_s,
            filter_subjects=list(subjects),
            max_ack_pending=1000,
        )
        try:
            await self.js.add_consumer(STREAM, config)
        except NotFoundError:
            # A NATS server that came back without its store: recreate, then bind.
            await self.ensure_streams()
            await self.js.add_consumer(STREAM, config)
        except BadRequestError as err:
            if is_transient(err):  # 10005: a replicated consumer while a peer is away
                raise
            # An existing durable with another config keeps its position; say so.
            log.warning(
                "consumer exists with other settings", extra=kv(durable=durable, error=str(err))
            )
        return await self.js.pull_subscribe_bind(durable=durable, stream=STREAM)

    async def _deliver(self, durable: str, msg: Msg, handler: Handler, stop: asyncio.Event) -> None:
        delivered = msg.metadata.num_delivered
        if delivered > self.crash_limit:
            await self._dead_letter(durable, msg, f"delivered {delivered} times without an outcome")
            return
        try:
            event = decode(msg.data)
        except (msgspec.DecodeError, msgspec.ValidationError) as err:
            log.error("undecodable message", extra=kv(subject=msg.subject, error=str(err)))
            await self._dead_letter(durable, msg, f"undecodable: {err}")
            return
        if (mismatch := node_mismatch(msg.subject, event)) is not None:
            # A node event about another node than its subject's: forged (an agent may
            # publish on its own node's subjects alone) or misrouted. Poison, never handled.
            log.error(mismatch, extra=kv(subject=msg.subject, durable=durable))
            await self._dead_letter(durable, msg, mismatch)
            return
        ctx = extract_context(msg.headers)
        with tracer.start_as_current_span(
            f"consume {tag_of(event)}", context=ctx, kind=trace.SpanKind.CONSUMER
        ) as span:
            span.set_attribute("messaging.consumer", durable)
            if isinstance(job_id := getattr(event, "job_id", None), int):  # find a job's trace
                span.set_attribute("muster.job_id", job_id)
            try:
                await self._handle_through_outages(msg, event, handler, stop)
            except PermanentError as err:
                log.error("permanent failure", extra=kv(subject=msg.subject, error=err.reason))
                await self._dead_letter(durable, msg, err.reason)
                return
            except _StoppedRetrying:
                await msg.nak()
                return
            except NotMine as err:
                log.debug("not this replica's", extra=kv(subject=msg.subject, why=str(err)))
                await msg.nak(delay=NOT_MINE_DELAY_S)
                return
            except Exception as err:
                span.record_exception(err)
                await self._retry_or_give_up(durable, msg, delivered, err)
                return
        await msg.ack()

    async def _handle_through_outages(
        self, msg: Msg, event: AnyEvent, handler: Handler, stop: asyncio.Event
    ) -> None:
        """Run the handler; a transient failure is retried here, with backoff, while the
        consumer's keeper extends the ack deadlines of the messages in hand, so an outage
        never spends a delivery (and so never the poison budget)."""
        backoff = Backoff()
        while True:
            try:
                await handler(event)
                return
            except Exception as err:
                if isinstance(err, PermanentError) or not is_transient(err):
                    raise
                if stop.is_set():
                    raise _StoppedRetrying from err
                log.warning(
                    "handler met an outage, retrying",
                    extra=kv(subject=msg.subject, failures=backoff.failures + 1, error=repr(err)),
                )
            await backoff.wait(stop)

    async def _retry_or_give_up(
        self, durable: str, msg: Msg, delivered: int, err: Exception
    ) -> None:
        if delivered >= self.max_deliver:
            log.error("handler kept failing", extra=kv(subject=msg.subject, error=repr(err)))
            await self._dead_letter(durable, msg, f"failed {delivered} times: {err!r}")
            return
        delay = BACKOFF_S[min(delivered - 1, len(BACKOFF_S) - 1)]
        log.warning(
            "handler failed, will retry",
            extra=kv(subject=msg.subject, delivered=delivered, delay=delay, error=repr(err)),
        )
        await msg.nak(delay=delay)

    async def _dead_letter(self, durable: str, msg: Msg, reason: str) -> None:
        """Copy the message to the dead-letter stream, then terminate it."""
        seq = msg.metadata.sequence.stream
        headers = {
            "Muster-Original-Subject": msg.subject,
            "Muster-Consumer": durable,
            "Muster-Error": reason[:1000],
        }
        await self.publish_raw(DLQ_PREFIX + durable, msg.data, f"dlq-{durable}-{seq}", headers)
        await msg.term()

    # --- request-reply API -----------------------------------------------------------

    async def serve(
        self, subject: str, queue: str, handler: RequestHandler, *, concurrent: bool = False
    ) -> None:
        """Answer requests on `subject` in a queue group, so replicas share the load.
        One request at a time (NATS calls a subscription's handler in turn), or with
        `concurrent` each in a task of its own, so a slow one holds none behind it (the
        handler orders what must be ordered)."""

        async def answer(msg: Msg) -> None:
            with tracer.start_as_current_span(
                f"serve {msg.subject}",
                context=extract_context(msg.headers),
                kind=trace.SpanKind.SERVER,
            ):
                reply = await handler(msg.data, msg.subject)
            if msg.reply:
                await msg.respond(reply)

        async def on_request(msg: Msg) -> None:
            if not concurrent:
                await answer(msg)
                return
            task = asyncio.create_task(answer(msg))
            self._answering.add(task)
            task.add_done_callback(self._answered)

        await self.nc.subscribe(subject, queue=queue, cb=on_request)

    def _answered(self, task: asyncio.Task[None]) -> None:
        self._answering.discard(task)
        if not task.cancelled() and (err := task.exception()) is not None:
            log.error("a request's handler failed", exc_info=err)  # as NATS logs one in turn

    async def request(self, subject: str, payload: bytes, timeout: float = 10.0) -> bytes:
        msg = await self.nc.request(subject, payload, timeout=timeout, headers=inject_headers())
        return msg.data

    async def dead_letters(self, durable: str) -> AsyncIterator[tuple[bytes, dict[str, str]]]:
        """Read what was dead-lettered for a consumer (for operators and tests)."""
        try:
            info = await self.js.stream_info(DLQ_STREAM)
        except NotFoundError:
            return
        if not info.state.messages:
            return  # an empty stream reports first_seq 0, which get_msg refuses
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            try:
                raw = await self.js.get_msg(DLQ_STREAM, seq)
            except NotFoundError:
                continue
            if raw.subject == DLQ_PREFIX + durable:
                yield raw.data or b"", dict(raw.headers or {})


class _StoppedRetrying(Exception):
    """`stop` was set while a handler waited out an outage: the message is nak'ed."""


async def _keep_deadlines(in_hand: list[Msg], period_s: float) -> None:
    """Until cancelled, tell JetStream every `period_s` that the messages in hand are
    still being worked on (`+WPI`), so a slow handler or one waiting out an outage is
    not redelivered meanwhile. Best effort: while NATS itself is away this fails, and
    an expired deadline costs only a redelivery, which the inbox makes harmless."""
    while True:
        await asyncio.sleep(period_s)
        for msg in list(in_hand):
            try:
                await msg.in_progress()
            except Exception as err:
                log.debug("cannot extend an ack deadline", extra=kv(error=repr(err)))
                break


# How long to wait for the rest of a batch once its first message is in hand: nats-py's
# lingering pull for N messages returns only when N came or its timeout ran out, so one
# event waited up to a whole second for company (health's fabric reports: 0.8 s).
_BATCH_MORE_S = 0.01


async def _fetch(sub: JetStreamContext.PullSubscription, batch: int) -> list[Msg]:
    """The next messages: wait (up to 1 s) for one, then take what else is there now.

    "What else" is what the first says was pending behind it: a pull for more than is
    there lingers until its deadline (the server keeps a pull that has one), which
    held every lone event back by `_BATCH_MORE_S` on its way in."""
    try:
        first = await sub.fetch(1, timeout=1.0)
    except (TimeoutError, NatsTimeoutError):
        return []
    more = min(batch - 1, first[0].metadata.num_pending or 0)
    if more <= 0:
        return first
    try:
        return first + await sub.fetch(more, timeout=_BATCH_MORE_S)
    except (TimeoutError, NatsTimeoutError):
        return first
