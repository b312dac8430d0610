"""The README's demo command runs its whole story and every step turns out as narrated.

Here with ``--controllers played`` (no controllers: the demo plays Kueue's and Trainer's
one step each); the default, on the real controllers, is tests/real/test_demo_real.py.
"""

from __future__ import annotations

import re
import subprocess
import sys


def test_demo_tells_the_whole_story() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "holdwarden.cli", "demo", "--controllers", "played"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    # "!!" marks a step that did not turn out as the story says.
    assert "!!" not in out, out
    assert "refused by the API server (403)" in out
    assert "[held-workload-inactive]" in out
    # The audit table row of the editor's refused write (columns are sized to their text).
    assert re.search(r"held-workload-inactive +team-a +trainjob-llm-pretrain-\S+ +1 +alice ", out)
    assert "StaleHold (rejected)" in out
    assert '"state": "at-start-gate"' in out
    assert '"attempt": 1' in out
    assert "nothing left running" in out
