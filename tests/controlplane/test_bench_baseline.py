"""The adapter benchmark's baseline is an honest preconditioned update, on the real API server.

``bench/adapter_bench.py`` reports Hold's latency as a ratio to a bare GET + PUT of the held
object (issue 11's "Hold <= 1.2x a bare GET+PUT"). A PUT that leaves the object unchanged is
answered by the API server without an etcd write, so a baseline made of such PUTs is too
cheap and every ratio against it too high; stop 18's side-by-side rounds wrote the same value
each round and measured exactly that. This pins the benchmark's own assumption: every bare
pair commits a new resourceVersion, in both modes, round after round.
"""

from __future__ import annotations

import uuid

import pytest

from bench.adapter_bench import Bench
from rig.localcluster import LocalCluster


@pytest.mark.parametrize("mode", ["kueue", "plain"])
def test_every_bare_pair_of_the_baseline_commits_a_new_resource_version(
    cluster: LocalCluster, mode: str
) -> None:
    bench = Bench(cluster, mode, f"-{uuid.uuid4().hex[:8]}")
    try:
        ref = bench.make_job("baseline")
        res, name = bench.held_name(ref)

        def resource_version() -> str:
            got = bench.custom.get_namespaced_custom_object(*bench.coords(res), name)
            return str(got["metadata"]["resourceVersion"])

        seen = [resource_version()]
        for _ in range(3):  # one pair per round, as the side-by-side rounds send them
            assert len(bench.bare_pair(ref, 1)) == 1
            seen.append(resource_version())
        assert len(set(seen)) == len(seen), f"a bare PUT wrote nothing: {seen}"
    finally:
        bench.close()
