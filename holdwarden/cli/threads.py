"""How the enforcer shares the GIL between its event loop and its threads."""

from __future__ import annotations

import sys

# CPython hands the GIL to a waiting thread after this long (its default is 5 ms).
SWITCH_INTERVAL = 0.0005


def shorten_gil_switch_interval() -> None:
    """Let a thread that waits for the GIL have it within ``SWITCH_INTERVAL``.

    The enforcer's audit writer thread needs the GIL for a moment after each ``fdatasync``
    before the refusal can be answered; at the default 5 ms a busy event loop would make
    every refusal wait up to 5 ms. It costs nothing unless another thread actually asks
    for the GIL.
    """
    sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL))
