"""A readmission gate alone in a process, so a test can SIGKILL it (a leader that dies
without releasing its Lease or finishing its writes).

``python -m tests.support.readmission_gate_process KUBECONFIG USER CHECK IDENTITY`` runs a gate
configured as ``tests.controlplane.test_readmission_kube.failover_gate_config(CHECK)``,
impersonating USER, until killed or until stdin closes. It prints ``started`` once running.
"""

from __future__ import annotations

import logging
import sys

from kubernetes import config as kube_config

from holdwarden.readmission.controller import ReadmissionGate


def main(argv: list[str]) -> int:
    kubeconfig, user, check, identity = argv
    from tests.controlplane.test_readmission_kube import failover_gate_config

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    loader: object = kube_config
    api = loader.new_client_from_config(config_file=kubeconfig)  # type: ignore[attr-defined]
    api.default_headers["Impersonate-User"] = user
    gate = ReadmissionGate(failover_gate_config(check), api, identity=identity)
    gate.start()
    print("started", flush=True)
    try:
        sys.stdin.read()  # the test closes stdin to stop us politely; SIGKILL to not
    finally:
        gate.stop(timeout=5)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
