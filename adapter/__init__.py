"""The holdwarden adapter: the library the supervisor calls to place and lift holds.

``Adapter`` does Start, Open, Hold, Release, Observe and Preflight on Kubeflow Trainer TrainJobs, in
Kueue mode (the Workload is held) and plain mode (the TrainJob is held), as ``spec/holds.md`` says;
``AsyncAdapter`` is its asyncio twin. Decisions are pure (``holdwarden.adapter.decisions``); the
operations are sans-I/O generators (``holdwarden.adapter.operations``), handed out by the
``holdwarden.adapter.core.Core`` each driver holds and run by the sync driver
(``holdwarden.adapter.kube``, the kubernetes client) or the asyncio driver
(``holdwarden.adapter.aio``, aiohttp).
"""

from holdwarden.adapter.aio import AsyncAdapter
from holdwarden.adapter.kube import Adapter
from holdwarden.adapter.types import (
    CallMeta,
    Capability,
    Observation,
    PreflightResult,
    Ref,
    ReleaseResult,
    State,
)
from holdwarden.config import Config

__all__ = [
    "Adapter",
    "AsyncAdapter",
    "CallMeta",
    "Capability",
    "Config",
    "Observation",
    "PreflightResult",
    "Ref",
    "ReleaseResult",
    "State",
]
