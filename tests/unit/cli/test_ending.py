"""SIGTERM and SIGHUP to srun and salloc (muster/ending.py): a handler while inside,
an inherited ignore kept (nohup), the earlier handlers back afterwards."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from muster.ending import Ended, handled


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_signal_inside_raises_ended_with_the_shells_status(signum: int, status: int) -> None:
    with pytest.raises(Ended) as told, handled():
        os.kill(os.getpid(), signum)
        time.sleep(0.05)  # the handler runs here, inside
        pytest.fail("the handler did not run")
    assert told.value.signum == signum and told.value.status == status


def test_an_inherited_ignore_is_kept_and_earlier_handlers_come_back() -> None:
    heard: list[int] = []
    earlier_term = signal.signal(signal.SIGTERM, lambda n, _f: heard.append(n))
    earlier_hup = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as `nohup` leaves it
    try:
        with handled(heard.append):
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGHUP)  # ignored: nobody hears it
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
        assert heard == [signal.SIGTERM]
        os.kill(os.getpid(), signal.SIGTERM)  # the earlier handler again
        time.sleep(0.05)
        assert heard == [signal.SIGTERM, signal.SIGTERM]
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, earlier_term)
        signal.signal(signal.SIGHUP, earlier_hup)


def test_outside_the_main_thread_nothing_changes() -> None:
    seen: list[object] = []

    def look() -> None:
        with handled():
            seen.append(signal.getsignal(signal.SIGTERM))

    before = signal.getsignal(signal.SIGTERM)
    thread = threading.Thread(target=look)
    thread.start()
    thread.join()
    assert seen == [before]
