"""The test rig: development tooling, not part of the installed project.

- ``rig.localcluster``: a real local control plane (etcd, kube-apiserver, and on request
  the real Kueue, Trainer, JobSet, kube-controller-manager, a scheduler and kwok nodes),
  and ``holdwarden demo`` on it.
- ``rig.builders``: the one set of TrainJob and Workload bodies that the tests, the demo and
  the benchmarks build objects from.

Nothing shipped imports this package (tests/unit/test_layering.py); ``holdwarden demo`` finds it
only in a source checkout.
"""
