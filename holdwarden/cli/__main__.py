"""``python -m holdwarden.cli``: the same as the ``holdwarden`` command."""

from __future__ import annotations

import sys

from holdwarden.cli import main

sys.exit(main())
