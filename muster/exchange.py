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


def bus_refusal(error: str, creds: str, inbox: str) -> str:
    """What to do about the bus's `-ERR` to this client: a key it does not know (not
    registered, or removed), an inbox its key may not read (registered as another user),
    or anything else as the server said it."""
    if "Authorization Violation" in error:
        what = f"the key in {creds}" if creds else "a client without a key"
        return (
            f"the bus refused {what} (Authorization Violation): your key is not registered "
            "on this cluster; show it with `muster whoami` and ask an operator to run "
            "`muster user add NAME --key U...`"
        )
    if "Permissions Violation" in error and inbox in error:
        return (
            f"the bus refused this client's replies on {inbox} ({error}): your key is "
            "registered for another user name; set MUSTER_USER to that name"
        )
    return f"the bus refused this client: {error}"


def exchange(
    url: str, verb: str, payload_of: Callable[[], bytes], timeout: float, user: str = ""
) -> bytes:
    """The reply's bytes to `payload_of()` sent to `muster.api.<verb>`, over a bus
    connection as `user` (their key, their inbox); with no service subscribed yet,
    resent (signed afresh: a resend is not a replay) for up to NO_RESPONDERS_WAIT_S. An
    unreachable cluster, a refused credential or a missing service is an ApiRefused
    saying so."""
    creds, ca, inbox = bus_credentials(url, user=user)
    subject = API_PREFIX + verb
    deadline = time.monotonic() + NO_RESPONDERS_WAIT_S
    while True:
        try:
            return wire.request(
                nats_servers(url),
                subject,
                payload_of(),
                timeout=timeout,
                creds=creds,
                tls_ca=ca,
                inbox_prefix=inbox,
            )
        except wire.Unreachable as err:
            raise ApiRefused(f"{err}; is the cluster up?", "unreachable", ()) from err
        except wire.ServerError as err:
            raise ApiRefused(bus_refusal(str(err), creds, inbox), "bus_refused", ()) from err
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
