"""The window size srun sends to a terminal step's relay (shared/pty_size.py)."""

from __future__ import annotations

import pytest

from shared.pty_size import decode, encode


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("40 120", (40, 120)),
        (" 24  80 ", (24, 80)),
        ("1 1", (1, 1)),
        ("65535 65535", (65535, 65535)),
        ("0 80", None),
        ("24 0", None),
        ("65536 80", None),
        ("24", None),
        ("24 80 1", None),
        ("-24 80", None),
        ("24 eighty", None),
        ("\uff12\uff14 80", None),  # full-width digits: isdigit, not ASCII
        ("", None),
    ],
)
def test_a_window_size_is_two_whole_numbers_a_terminal_can_hold(
    text: str, size: tuple[int, int] | None
) -> None:
    assert decode(text) == size


def test_what_srun_sends_the_relay_reads() -> None:
    assert decode(encode(50, 132)) == (50, 132)
