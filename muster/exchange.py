"""Shell: one signed API request over muster.wire, for a one-shot command — the
servers tried, a cluster still starting waited out, every way it can fail turned into
an ApiRefused that says what to change. Shared by muster.client (msgspec structs) and
muster.lean (plain JSON); nothing here loads asyncio, nats-py or msgspec."""

from __future__ import annotations

import time

from muster import wire
from muster.client_env import bus_credentials
from muster.refusal import ApiRefused
from shared.urls import nats_servers

TYPE_CHECKING = False  # mypy takes it as true
if TYPE_CHECKING:
    from collections.abc import Callable

API_PREFIX = "muster.api."  # shared.api's (tests/unit/cli/test_lean.py holds them equal)
NO_RESPONDERS_WAIT_S = 15.0


def no_service(subject: str) -> str:
    service = "fairshare" if subject.endswith((".share", ".acct")) else "admission"
    return f"no {service} service answers on {subject}; is the cluster up?"


def exchange(url: str, verb: str, payload_of: Callable[[], bytes], timeout: float) -> bytes:
    """The reply's bytes to `payload_of()` sent to `muster.api.<verb>`; with no service
    subscribed yet, resent (signed afresh: a resend is not a replay) for up to
    NO_RESPONDERS_WAIT_S. An unreachable cluster, a refused credential or a missing
    service is an ApiRefused saying so."""
    creds, ca = bus_credentials(url)
    subject = API_PREFIX + verb
    deadline = time.monotonic() + NO_RESPONDERS_WAIT_S
    while True:
        try:
            return wire.request(
                nats_servers(url), subject, payload_of(), timeout=timeout, creds=creds, tls_ca=ca
            )
        except wire.Unreachable as err:
            raise ApiRefused(f"{err}; is the cluster up?", "unreachable", ()) from err
        except wire.ServerError as err:
            raise ApiRefused(f"the bus refused this client: {err}", "bus_refused", ()) from err
        except wire.BadCredential as err:
            raise ApiRefused(f"{err}; see MUSTER_NATS_CREDS", "bus_refused", ()) from err
        except TimeoutError as err:
            raise ApiRefused(
                f"no reply on {subject} within {timeout:g} s", "unavailable", ()
            ) from err
        except ConnectionError as err:
            raise ApiRefused(f"{err} (at {url})", "unavailable", ()) from err
        except wire.NoResponders as err:
            if time.monotonic() > deadline:
                raise ApiRefused(no_service(subject), "unavailable", ()) from err
        time.sleep(0.2)
