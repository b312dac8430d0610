"""holdwarden: instance-numbered holds for Kubeflow Trainer TrainJobs.

This package is the ground every part stands on: the vocabulary (annotation keys, rule
ids), the configuration schema, label selectors, the Kubernetes clients, leader election and
``holdwarden.objects`` (every read and write of the held objects' marks); and, as the roof,
the ``holdwarden`` command line (``holdwarden.cli``). The parts are the top-level packages
``adapter``, ``webhook``, ``certs`` and ``readmission``; the local control plane the tests
and the demo use is ``rig``, development tooling outside the wheel.
"""

__version__ = "0.1.0"
