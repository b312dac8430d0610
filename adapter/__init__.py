"""The holdwarden adapter: the library the supervisor calls to place and lift holds.

``Adapter`` does Start, Open, Hold, Release, Observe and Preflight on Kubeflow Trainer
TrainJobs, in Kueue mode (the Workload is held) and plain mode (the TrainJob is held), as
``spec/holds.md`` says. Decisions are pure (``adapter.decisions``); I/O is ``adapter.kube``.
"""

from adapter.kube import Adapter
from adapter.types import CallMeta, Capability, Observation, PreflightResult, Ref, State
from holdwarden.config import Config

__all__ = [
    "Adapter",
    "CallMeta",
    "Capability",
    "Config",
    "Observation",
    "PreflightResult",
    "Ref",
    "State",
]
