"""holdwarden: instance-numbered holds for Kubeflow Trainer TrainJobs.

This package holds what the three parts share (the vocabulary and the configuration
schema), the ``holdwarden`` command line, and the local control plane used by the tests
and the demo. The parts themselves are the top-level packages ``adapter``, ``webhook``
and ``certs``.
"""

__version__ = "0.1.0"
