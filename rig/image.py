"""``make image``: the shipped Dockerfile built into an image with a daemonless builder, and
exported as an archive that ``ctr -n k8s.io images import`` (or ``docker load``) takes.

Steps, each cached so that a second run is fast:

1. The tools, from Debian's packages: ``buildah`` (the builder), ``runc`` (the runtime it
   uses; Debian's crun 1.8 refuses a host with a hybrid cgroup layout) and ``mmdebstrap``
   (the base below). Missing ones are installed with ``apt-get`` (as root, non-interactive);
   anyone else is told which packages to install.
2. The base the Dockerfile's ``FROM`` names. It is pulled as usual when a registry can be
   reached (``HOLDWARDEN_IMAGE_BASE=pull``). Otherwise (the default, ``local``) a stand-in
   is made here: Debian's own Python (3.11 on bookworm, the same minor version as the real
   base) with pip, built by ``mmdebstrap`` from this machine's apt sources, given this
   machine's trusted CA certificates (so that pip inside the build can verify the package
   index it reaches), without Debian's ``EXTERNALLY-MANAGED`` marker (the Dockerfile pip-
   installs into the system Python, as it does on the real base), and stored under the
   ``FROM`` name. The root filesystem tarball is cached in
   ``$HOLDWARDEN_CACHE/images/base-<key>.tar``, the key a hash of the suite, the package
   list, the apt sources and the CA certificates, so a changed input makes a new base.
3. ``buildah build`` of the Dockerfile, with its layer cache (an unchanged source tree
   rebuilds nothing), tagged ``holdwarden:<version>``.
4. The export: ``$HOLDWARDEN_CACHE/images/holdwarden-<version>.tar``, a docker-archive
   whose one tag is ``holdwarden:<version>``; rewritten only when the image changed.

Every command is bounded by a timeout, and every failure raises ``ImageBuildError`` naming
the command, its output's tail and what to do.
"""

from __future__ import annotations

import argparse
import codecs
import fcntl
import hashlib
import json
import os
import re
import selectors
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rig.localcluster.binaries import cache_dir

REPO = Path(__file__).resolve().parent.parent
DOCKERFILE = REPO / "Dockerfile"

# The stand-in base: Debian's suite whose python3 is the real base's minor version.
SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-pip", "ca-certificates", "passwd")
# Debian packages that provide the commands this module runs.
TOOLS = {"buildah": "buildah", "runc": "runc", "mmdebstrap": "mmdebstrap"}
# Bumped when the recipe below changes in a way the key does not see.
_RECIPE = "1"

APT_TIMEOUT = 900.0
MMDEBSTRAP_TIMEOUT = 1200.0
BUILD_TIMEOUT = 1800.0
SHORT_TIMEOUT = 300.0


class ImageBuildError(RuntimeError):
    """The image could not be built; the message says which step and what to do."""


@dataclass(frozen=True)
class Image:
    name: str
    """The local name, ``holdwarden:<version>`` (buildah stores it as localhost/...)."""
    image_id: str
    archive: Path
    version: str
    base: str
    """How the base was had: ``pulled``, ``made`` or ``cached``."""


def project_version() -> str:
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    return str(data["project"]["version"])


def images_dir() -> Path:
    return cache_dir() / "images"


def from_images() -> list[str]:
    """The images the Dockerfile's stages start FROM (not its own stage names)."""
    stages: set[str] = set()
    bases: list[str] = []
    for line in DOCKERFILE.read_text().splitlines():
        match = re.match(r"\s*FROM\s+(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", line, re.IGNORECASE)
        if match is None:
            continue
        image, stage = match.group(1), match.group(2)
        if image not in stages and image not in bases:
            bases.append(image)
        if stage:
            stages.add(stage)
    return bases


def qualified(name: str) -> str:
    """A short Docker Hub name as buildah resolves it (``python:3.11-slim`` ->
    ``docker.io/library/python:3.11-slim``)."""
    first = name.split("/", 1)[0]
    if "/" in name and ("." in first or ":" in first or first == "localhost"):
        return name
    return f"docker.io/{name}" if "/" in name else f"docker.io/library/{name}"


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def run(
    argv: Sequence[str],
    *,
    timeout: float,
    what: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    echo: bool = False,
) -> str:
    """Run ``argv`` to completion within ``timeout`` seconds; its stdout, or an
    ``ImageBuildError`` saying what failed and its output's tail. ``echo`` streams the
    output to stderr as well (long builds), keeping it for the error."""
    try:
        if echo:
            proc = subprocess.Popen(
                list(argv),
                cwd=cwd,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
            try:
                out = _stream(proc, timeout)
            except subprocess.TimeoutExpired as exc:
                proc.kill()
                proc.wait(timeout=30)
                raise ImageBuildError(
                    f"{what}: `{' '.join(argv)}` took over {timeout:.0f} s"
                ) from exc
            if proc.returncode != 0:
                raise ImageBuildError(
                    f"{what}: `{' '.join(argv)}` exited {proc.returncode}:\n{_tail(out)}"
                )
            return out
        done = subprocess.run(
            list(argv),
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except FileNotFoundError as exc:
        raise ImageBuildError(f"{what}: {argv[0]} is not installed ({exc})") from exc
    except subprocess.TimeoutExpired as exc:
        raise ImageBuildError(f"{what}: `{' '.join(argv)}` took over {timeout:.0f} s") from exc
    if done.returncode != 0:
        raise ImageBuildError(
            f"{what}: `{' '.join(argv)}` exited {done.returncode}:\n"
            f"{_tail(done.stdout + done.stderr)}"
        )
    return done.stdout


def _stream(proc: subprocess.Popen[bytes], timeout: float) -> str:
    """Copy ``proc``'s output to stderr as it comes, until it exits or ``timeout``: reads
    whatever is there (never waits for a line's end), so the deadline always holds."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    kept: list[str] = []
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(proc.args, timeout)
            if not selector.select(timeout=min(left, 1.0)):
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            text = decoder.decode(chunk)
            kept.append(text)
            sys.stderr.write(text)
    proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    return "".join(kept) + decoder.decode(b"", final=True)


# --- 1. the tools ----------------------------------------------------------------------


def ensure_tools() -> None:
    """Install the Debian packages whose commands are missing, or say which to install."""
    missing = sorted({pkg for cmd, pkg in TOOLS.items() if shutil.which(cmd) is None})
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise ImageBuildError(
            f"the image build needs the Debian packages {' '.join(missing)}: install them "
            f"(apt-get install {' '.join(missing)}) or run `make image` as root on Debian"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    # Wait (bounded) for another apt or dpkg run to finish rather than failing at once.
    apt = ["apt-get", "-o", "DPkg::Lock::Timeout=300", "-y", "-q"]
    install = [*apt, "install", "--no-install-recommends", *missing]
    print(f"holdwarden image: installing {' '.join(missing)}", file=sys.stderr)
    try:
        run(install, timeout=APT_TIMEOUT, what="installing the build tools", env=env)
    except ImageBuildError:
        # A machine whose package lists were never fetched: fetch them once, then retry.
        run([*apt, "update"], timeout=APT_TIMEOUT, what="apt-get update", env=env)
        run(install, timeout=APT_TIMEOUT, what="installing the build tools", env=env)


def buildah(*args: str) -> list[str]:
    """A buildah command line with the runtime this host needs (runc, not crun)."""
    return ["buildah", *args]


def builder_env() -> dict[str, str]:
    # buildah reads BUILDAH_RUNTIME for every command that runs a container.
    return {**os.environ, "BUILDAH_RUNTIME": shutil.which("runc") or "runc"}


def image_id(name: str) -> str | None:
    """The local image's ID, or None when there is no such image."""
    done = subprocess.run(
        buildah("inspect", "--type", "image", "--format", "{{.FromImageID}}", name),
        capture_output=True,
        text=True,
        timeout=SHORT_TIMEOUT,
        stdin=subprocess.DEVNULL,
        check=False,
        env=builder_env(),
    )
    return done.stdout.strip() or None if done.returncode == 0 else None


# --- 2. the base -------------------------------------------------------------------------


def _apt_sources() -> list[Path]:
    files = [Path("/etc/apt/sources.list")] if Path("/etc/apt/sources.list").is_file() else []
    folder = Path("/etc/apt/sources.list.d")
    if folder.is_dir():
        files += sorted(
            p for p in folder.iterdir() if p.suffix in (".list", ".sources") and p.is_file()
        )
    return [f for f in files if f.read_text().strip()]


def _host_cas() -> list[Path]:
    folder = Path("/usr/local/share/ca-certificates")
    return sorted(folder.rglob("*.crt")) if folder.is_dir() else []


def base_key() -> str:
    digest = hashlib.sha256()
    digest.update(f"{_RECIPE}\n{SUITE}\n{' '.join(BASE_PACKAGES)}\n".encode())
    for path in [*_apt_sources(), *_host_cas()]:
        digest.update(str(path).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def _mmdebstrap(out: Path) -> None:
    sources = _apt_sources()
    if not sources:
        raise ImageBuildError(
            "making the base: this machine has no apt sources (/etc/apt/sources.list*) to "
            "build it from; set HOLDWARDEN_IMAGE_BASE=pull where the base can be pulled"
        )
    hooks = [
        # This machine's CAs, so that pip in the build verifies the index it reaches.
        *(f"copy-in {ca} /usr/local/share/ca-certificates/" for ca in _host_cas()),
        'chroot "$1" update-ca-certificates',
        # The Dockerfile pip-installs into the system Python, as on the real base.
        'rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED',
        # Nothing apt fetched stays in the image.
        'rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*',
    ]
    argv = [
        "mmdebstrap",
        "--variant=minbase",
        "--mode=root",
        "--format=tar",
        f"--include={','.join(BASE_PACKAGES)}",
        '--aptopt=APT::Install-Recommends "false"',
        *(
            f"--dpkgopt=path-exclude=/usr/share/{d}/*"
            for d in ("doc", "man", "info", "locale", "lintian", "linda")
        ),
        "--dpkgopt=path-include=/usr/share/doc/*/copyright",
        *(f"--customize-hook={hook}" for hook in hooks),
        SUITE,
        str(out),
        *(str(s) for s in sources),
    ]
    run(argv, timeout=MMDEBSTRAP_TIMEOUT, what="making the base with mmdebstrap", echo=True)


def _import_base(rootfs: Path, names: Sequence[str]) -> None:
    """``rootfs`` (a tarball) as an image named each of ``names``, with the real base's
    config where the Dockerfile relies on it (PATH, LANG, CMD)."""
    env = builder_env()
    container = run(
        buildah("from", "--name", f"holdwarden-base-{os.getpid()}", "scratch"),
        timeout=SHORT_TIMEOUT,
        what="importing the base",
        env=env,
    ).strip()
    try:
        run(
            buildah("add", container, str(rootfs), "/"),
            timeout=SHORT_TIMEOUT,
            what="importing the base",
            env=env,
        )
        # fmt: off
        run(
            buildah(
                "config",
                "--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "--env", "LANG=C.UTF-8",
                "--cmd", "python3",
                "--os", "linux",
                "--label", f"holdwarden.stand-in-base={SUITE}:{' '.join(BASE_PACKAGES)}",
                container,
            ),
            timeout=SHORT_TIMEOUT,
            what="importing the base",
            env=env,
        )
        # fmt: on
        run(
            buildah("commit", "--rm", container, names[0]),
            timeout=SHORT_TIMEOUT,
            what="importing the base",
            env=env,
        )
    except BaseException:
        subprocess.run(buildah("rm", container), capture_output=True, timeout=60, env=env)
        raise
    for name in names[1:]:
        run(buildah("tag", names[0], name), timeout=SHORT_TIMEOUT, what="tagging the base", env=env)


def ensure_base(mode: str) -> str:
    """Every image the Dockerfile starts FROM, present locally; how it was had."""
    bases = from_images()
    if mode == "pull":
        for base in bases:
            run(
                buildah("pull", base),
                timeout=BUILD_TIMEOUT,
                what=f"pulling {base} (HOLDWARDEN_IMAGE_BASE=pull; unset it to make a "
                "stand-in base here)",
                env=builder_env(),
            )
        return "pulled"
    if mode != "local":
        raise ImageBuildError(f"HOLDWARDEN_IMAGE_BASE={mode}: expected local or pull")
    key = base_key()
    tag = f"localhost/holdwarden-base:{SUITE}-{key}"
    names = [tag, *(qualified(b) for b in bases)]
    if image_id(tag) is not None:
        # The base of this key is in the builder's store: make sure FROM names it.
        want = image_id(tag)
        for name in names[1:]:
            if image_id(name) != want:
                run(buildah("tag", tag, name), timeout=SHORT_TIMEOUT, what="tagging the base")
        return "cached"
    folder = images_dir()
    folder.mkdir(parents=True, exist_ok=True)
    rootfs = folder / f"base-{SUITE}-{key}.tar"
    how = "cached"
    if not rootfs.is_file():
        partial = rootfs.with_suffix(".partial")
        partial.unlink(missing_ok=True)
        print(f"holdwarden image: making the base {tag} with mmdebstrap", file=sys.stderr)
        _mmdebstrap(partial)
        partial.rename(rootfs)
        how = "made"
    _import_base(rootfs, names)
    return how


# --- 3. and 4. the image and its archive --------------------------------------------------


# What the Dockerfile copies: a change to any of them is a change to the image.
CONTEXT = ("Dockerfile", "pyproject.toml", "README.md", "requirements.lock",
           "adapter", "webhook", "readmission", "certs", "holdwarden")  # fmt: skip


def revision() -> str:
    """The commit the image is built from, ``-dirty`` when what it copies differs from it;
    ``unknown`` outside a git checkout."""

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["git", "-C", str(REPO), *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    head = git("rev-parse", "HEAD")
    if head.returncode != 0:
        return "unknown"
    changed = git("status", "--porcelain", "--", *CONTEXT)
    return head.stdout.strip() + ("-dirty" if changed.stdout.strip() else "")


@contextmanager
def build_lock() -> Iterator[None]:
    """One image build at a time per cache (make image and the test may race)."""
    folder = images_dir()
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / ".lock").open("w") as handle:
        deadline = time.monotonic() + BUILD_TIMEOUT
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise ImageBuildError(
                        f"another image build held {folder / '.lock'} for {BUILD_TIMEOUT:.0f} s"
                    ) from None
                time.sleep(1.0)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build_image(*, quiet: bool = False) -> Image:
    """The image of this checkout, built (or found in the cache) and exported."""
    version = project_version()
    name = f"localhost/holdwarden:{version}"
    with build_lock():
        ensure_tools()
        base = ensure_base(os.environ.get("HOLDWARDEN_IMAGE_BASE", "local"))
        rev = revision()
        # fmt: off
        argv = buildah(
            "build",
            "--layers",
            "--pull=false",
            # RUN steps share the host's network (the package index) and run in a chroot:
            # this host's root lacks CAP_SYS_RESOURCE, which runc's rlimits would need.
            "--network=host",
            "--isolation=chroot",
            "--build-arg", f"VERSION={version}",
            "--build-arg", f"REVISION={rev}",
            # Also as labels of the build itself: buildah's layer cache does not see a
            # build argument's new value in a LABEL step, and would keep the old revision.
            "--label", f"org.opencontainers.image.version={version}",
            "--label", f"org.opencontainers.image.revision={rev}",
            "--tag", name,
            "--file", str(DOCKERFILE),
            str(REPO),
        )
        # fmt: on
        env = builder_env()
        run(argv, timeout=BUILD_TIMEOUT, what="building the image", env=env, echo=not quiet)
        built = image_id(name)
        if built is None:
            raise ImageBuildError(f"building the image: {name} is not in buildah's store")
        archive = images_dir() / f"holdwarden-{version}.tar"
        stamp = archive.with_suffix(".id")
        if not archive.is_file() or not stamp.is_file() or stamp.read_text() != built:
            partial = archive.with_suffix(".partial")
            partial.unlink(missing_ok=True)
            run(
                buildah("push", name, f"docker-archive:{partial}:holdwarden:{version}"),
                timeout=BUILD_TIMEOUT,
                what="exporting the image",
                env=builder_env(),
            )
            partial.rename(archive)
            stamp.write_text(built)
    return Image(name, built, archive, version, base)


def archive_tags(archive: Path) -> list[str]:
    """The tags a docker-archive carries (what ``ctr images import`` will name)."""
    import tarfile

    with tarfile.open(archive) as tar:
        member = tar.extractfile("manifest.json")
        if member is None:
            raise ImageBuildError(f"{archive}: no manifest.json")
        manifest = json.load(member)
    return [tag for entry in manifest for tag in entry.get("RepoTags") or []]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rig.image", description=__doc__)
    parser.parse_args(argv)
    started = time.monotonic()
    try:
        image = build_image()
    except ImageBuildError as exc:
        print(f"holdwarden image: {exc}", file=sys.stderr)
        return 1
    size = image.archive.stat().st_size
    print(
        f"image {image.name} ({image.image_id[:12]}, base {image.base}) in "
        f"{time.monotonic() - started:.0f} s\n"
        f"archive {image.archive} ({size / 2**20:.0f} MiB): "
        f"ctr -n k8s.io images import {image.archive}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
