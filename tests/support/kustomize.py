"""The manifests as the real kustomize renders them (v5.5.0, tests/support/tool_binaries.py).

``render(folder, components)`` is ``kustomize build`` of ``folder`` with ``components``
added after its own, as an overlay that lists them would: a kustomization in a scratch
folder naming them by relative path (kustomize refuses absolute ones). Nothing of
kustomize is re-implemented here; a kustomization the real tool refuses fails the test
with kustomize's own message.
"""

from __future__ import annotations

import copy
import functools
import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

from tests.support.tool_binaries import ensure_kustomize

Obj = dict[str, Any]


# manifests/kustomization.yaml generates the ConfigMap holdwarden-config with kustomize's
# content hash appended to its name (so that a changed configuration rolls the Pods).
_HASHED = re.compile(r"^(?P<name>.+)-[a-z0-9]{10}$")


def generated_as(obj: Obj, name: str) -> bool:
    """Whether ``obj`` is named ``name``, or ``name`` with a generator's hash suffix."""
    found = obj["metadata"]["name"]
    if found == name:
        return True
    match = _HASHED.match(found)
    return obj["kind"] in ("ConfigMap", "Secret") and match is not None and match["name"] == name


def unhashed(objs: list[Obj], name: str = "holdwarden-config") -> list[Obj]:
    """``objs`` with the generated ``name``'s hash suffix taken off, wherever it is named."""
    hashed = [
        o["metadata"]["name"] for o in objs if o["kind"] == "ConfigMap" and generated_as(o, name)
    ]
    if not hashed or hashed == [name]:
        return objs
    (full,) = hashed
    text = yaml.safe_dump_all(objs).replace(full, name)
    return [d for d in yaml.safe_load_all(text) if isinstance(d, dict)]


class KustomizeFailed(RuntimeError):
    """kustomize refused to build; the message is its stderr."""


def render(folder: Path, components: list[Path] | None = None) -> list[Obj]:
    """The objects ``kustomize build`` prints for ``folder`` plus ``components``."""
    key = (str(folder.resolve()), tuple(str(c.resolve()) for c in components or ()))
    return copy.deepcopy(_render(*key))


@functools.lru_cache(maxsize=128)
def _render(folder: str, components: tuple[str, ...]) -> list[Obj]:
    binary = ensure_kustomize(log=False)
    with tempfile.TemporaryDirectory(prefix="holdwarden-kustomize-") as scratch:
        target = folder
        if components:
            overlay = {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(folder, scratch)],
                "components": [os.path.relpath(c, scratch) for c in components],
            }
            (Path(scratch) / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
            target = scratch
        result = subprocess.run(
            [str(binary), "build", target], capture_output=True, text=True, timeout=120
        )
    if result.returncode != 0:
        raise KustomizeFailed(f"kustomize build {folder} {list(components)}: {result.stderr}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if isinstance(doc, dict)]
