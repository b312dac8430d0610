"""The CLIs the manifest tests run, Helm and kustomize, and kubectl for the real node's
installs (tests/pods), each built once from the Go module proxy.

``python -m tests.support.tool_binaries`` (part of ``make binaries``) builds each tool at its pinned
version from its committed module in ``tools/<name>`` (go.mod/go.sum pin every dependency;
``-mod=readonly``, so the build never resolves a version on its own) into
``$HOLDWARDEN_CACHE``, beside kube-apiserver. ``HOLDWARDEN_HELM``, ``HOLDWARDEN_KUSTOMIZE``
and ``HOLDWARDEN_KUBECTL`` may name a prebuilt binary instead (its version is then the
caller's responsibility). kubectl v1.36.3 embeds kustomize v5.8.1 for ``apply -k``.

Built by rig/localcluster/binaries.py's ``go_build``: a build writes ``<name>.partial``
and renames it into place under a file lock, so an interrupted or concurrent build never
leaves a half-written binary; with no Go and no binary it raises ``BinariesUnavailable``.
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from rig.localcluster.binaries import BinariesUnavailable, cache_dir, go_build

TOOLS_DIR = Path(__file__).resolve().parents[2] / "tools"
_MODULE_FILES = ("go.mod", "go.sum", "tools.go")


@dataclass(frozen=True)
class Tool:
    name: str
    version: str
    package: str
    ldflags: str
    override: str
    """The environment variable that may name a prebuilt binary."""

    @property
    def module(self) -> Path:
        return TOOLS_DIR / self.name


HELM = Tool(
    "helm", "v3.21.4", "helm.sh/helm/v3/cmd/helm",
    "-s -w -X helm.sh/helm/v3/internal/version.version=v3.21.4", "HOLDWARDEN_HELM",
)  # fmt: skip
# The kustomize kubectl v1.32 embeds; the admins used kubectl kustomize v5.5.
KUSTOMIZE = Tool(
    "kustomize", "v5.5.0", "sigs.k8s.io/kustomize/kustomize/v5",
    "-s -w -X sigs.k8s.io/kustomize/api/provenance.version=v5.5.0", "HOLDWARDEN_KUSTOMIZE",
)  # fmt: skip
# kubectl for the real node's installs (tests/pods): the control plane's release, built from
# the same k8s.io/kubernetes module (its staging modules replaced by their v0.36.3 tags).
KUBECTL = Tool(
    "kubectl", "v1.36.3", "k8s.io/kubernetes/cmd/kubectl",
    "-s -w -X k8s.io/component-base/version.gitVersion=v1.36.3"
    " -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=36"
    " -X k8s.io/component-base/version.gitTreeState=clean"
    " -X k8s.io/client-go/pkg/version.gitVersion=v1.36.3",
    "HOLDWARDEN_KUBECTL",
)  # fmt: skip
HELM_VERSION = HELM.version


def tool_path(tool: Tool) -> Path:
    """Where the built tool is cached: the folder names its version and its go.sum's hash,
    so a changed module builds a new binary rather than reusing an old one."""
    digest = hashlib.sha256()
    for name in _MODULE_FILES:
        digest.update((tool.module / name).read_bytes())
    return cache_dir() / f"{tool.name}-{tool.version}-{digest.hexdigest()[:12]}" / tool.name


def ensure_tool(tool: Tool, log: bool = True) -> Path:
    """The executable: ``$<override>``, else the cached build, else built now."""
    prebuilt = os.environ.get(tool.override)
    if prebuilt:
        path = Path(prebuilt)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise BinariesUnavailable(f"{tool.override}={path} is not an executable file")
        return path
    return go_build(
        tool_path(tool),
        tool.module,
        _MODULE_FILES,
        tool.package,
        tool.ldflags,
        f"{tool.name} {tool.version}",
        "-mod=readonly",
        log,
        missing_go_hint=f"set {tool.override} to a {tool.name} binary",
    )


def ensure_helm(log: bool = True) -> Path:
    return ensure_tool(HELM, log)


def ensure_kustomize(log: bool = True) -> Path:
    return ensure_tool(KUSTOMIZE, log)


def ensure_kubectl(log: bool = True) -> Path:
    return ensure_tool(KUBECTL, log)


def main(argv: list[str] | None = None) -> int:
    """Build the named tools (``helm``, ``kustomize``, ``kubectl``), or all three."""
    names = sys.argv[1:] if argv is None else argv
    tools = {tool.name: tool for tool in (HELM, KUSTOMIZE, KUBECTL)}
    unknown = [name for name in names if name not in tools]
    if unknown:
        print(
            f"holdwarden: unknown tool {unknown[0]!r}; known: {', '.join(tools)}", file=sys.stderr
        )
        return 2
    try:
        for name in names or tools:
            print(f"{name}: {ensure_tool(tools[name])}")
    except BinariesUnavailable as exc:
        print(f"holdwarden: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
