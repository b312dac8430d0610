"""The readmission gate: a Kueue AdmissionCheck controller
(docs/explanation/readmission-gate.md). ``decisions`` decides, purely; ``controller`` does
the I/O, on the watch caches of ``informer`` and the work queue of ``workqueue``;
``metrics`` is its Prometheus collectors. ``holdwarden gate`` runs it, in its own process
and Deployment (holdwarden/cli/gate.py); it imports no other part.
"""
