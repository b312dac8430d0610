"""The one error the local control plane's parts raise when they cannot start.

Its own module, below the others: ``cluster.py`` starts ``controllers.py``, ``nodes.py``
and ``realnode.py``, and they raise this error, so it cannot live in ``cluster.py``
without an import circle (``tests/unit/test_localcluster_imports.py`` keeps none).
"""

from __future__ import annotations


class ControlPlaneError(RuntimeError):
    """The local control plane could not start; the message carries the server's logs."""
