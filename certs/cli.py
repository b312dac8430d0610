"""``holdwarden certs …``: generate, inject, rotate, renew, prune, inspect.

Exit codes: 0 done; 2 bad input (a flag, a file, a name that does not exist), with a
one-line message and never a traceback; 1 the API server failed the request.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cryptography import x509

from holdwarden.certs.bundle import (
    CA_BUNDLE,
    CA_KEY,
    TLS_CERT,
    TLS_KEY,
    CertDirError,
    load_cert_dir,
    parse_bundle,
    write_cert_dir,
)
from holdwarden.certs.generate import (
    DEFAULT_CA_VALIDITY,
    DEFAULT_LEAF_VALIDITY,
    fingerprint,
    generate_ca,
    generate_serving,
)

if TYPE_CHECKING:
    from holdwarden.certs.enforcing import Verifier

DEFAULT_WEBHOOK_CONFIG = "holdwarden-enforcer"
DEFAULT_SERVICE = "holdwarden"
DEFAULT_NAMESPACE = "holdwarden-system"

_VALIDITY_RE = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")


def parse_validity(text: str) -> timedelta:
    """A validity such as ``365d``, ``12h``, ``90m``, ``30s`` or ``1d12h``; longer than zero.

    Raises ``ValueError`` with a message fit for the user.
    """
    match = _VALIDITY_RE.fullmatch(text.strip())
    if not text.strip() or match is None:
        raise ValueError(f"{text!r} is not a validity; write it like '365d', '12h' or '90m'")
    days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    try:
        value = timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    except OverflowError:
        raise ValueError(f"{text!r} is far too long a validity") from None
    if value <= timedelta(0):
        raise ValueError(f"{text!r}: the validity must be longer than zero")
    return value


def _validity_arg(text: str) -> timedelta:
    try:
        return parse_validity(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def register(subparsers: argparse._SubParsersAction[Any], verify: Verifier) -> None:
    """``verify``: how ``certs enforce`` verifies the enforcer answers (the roof hands in
    the adapter's preflight probe; certs/enforcing.py)."""
    certs = subparsers.add_parser(
        "certs",
        help="make, inject, rotate and inspect the enforcer's certificates",
        description="Certificates of the enforcer: a CA, a serving certificate, rotation.",
    )
    sub = certs.add_subparsers(dest="certs_command", required=True, metavar="SUBCOMMAND")

    gen = sub.add_parser(
        "generate",
        help="make a new CA and serving certificate in a directory",
        description="Write ca.crt, ca.key, tls.crt and tls.key (keys mode 0600) into --out.",
    )
    _service_flags(gen)
    gen.add_argument("--out", required=True, metavar="DIR", help="directory to write into")
    _san_flags(gen)
    _validity_flags(gen, ca=True)
    gen.add_argument("--force", action="store_true", help="replace an existing CA in --out")
    gen.set_defaults(handler=_guard(_generate))

    inject = sub.add_parser(
        "inject",
        help="put a CA bundle into the ValidatingWebhookConfiguration",
        description="Set clientConfig.caBundle on every webhook of the configuration.",
    )
    inject.add_argument(
        "--webhook-config",
        default=DEFAULT_WEBHOOK_CONFIG,
        metavar="NAME",
        help=f"ValidatingWebhookConfiguration name (default {DEFAULT_WEBHOOK_CONFIG})",
    )
    inject.add_argument("--ca-bundle", required=True, metavar="FILE", help="PEM CA bundle")
    inject.add_argument(
        "--kubeconfig",
        metavar="PATH",
        help="kubeconfig file; default: credentials from $KUBECONFIG, else ~/.kube/config, "
        "else the in-cluster service account (kubectl's order)",
    )
    inject.add_argument("--context", metavar="NAME", help="kubeconfig context to use")
    inject.set_defaults(handler=_guard(_inject))

    enforce = sub.add_parser(
        "enforce",
        help="verify the enforcer answers, then set the webhook's failurePolicy",
        description="Verify through the API server that the enforcer refuses a "
        "hold-breaking dry-run write (the preflight probe), then set the failurePolicy the "
        "annotation holdwarden.io/failure-policy asks for (Fail by default) on every webhook "
        "of the configuration. What the self-managed enforcer does by itself; for provided "
        "and cert-manager certificates (docs/install.md).",
    )
    enforce.add_argument(
        "--webhook-config",
        default=DEFAULT_WEBHOOK_CONFIG,
        metavar="NAME",
        help=f"ValidatingWebhookConfiguration name (default {DEFAULT_WEBHOOK_CONFIG})",
    )
    enforce.add_argument(
        "--config",
        metavar="FILE",
        help="holdwarden configuration (mode, annotationPrefix, "
        "webhook.certificates.probeNamespace); default: the built-in defaults",
    )
    enforce.add_argument(
        "--wait",
        type=_validity_arg,
        default=timedelta(0),
        metavar="DURATION",
        help="keep trying this long (e.g. 300s) while the enforcer is not verified",
    )
    enforce.add_argument("--kubeconfig", metavar="PATH", help="kubeconfig file (as for inject)")
    enforce.add_argument("--context", metavar="NAME", help="kubeconfig context to use")
    enforce.set_defaults(handler=_guard(_enforce), verify=verify)

    rotate = sub.add_parser(
        "rotate",
        help="new CA (old ones kept in the bundle) and a serving certificate from it",
        description=(
            "Add a new CA to the front of ca.crt, keeping every still-valid old CA, then "
            "(unless --ca-only) a new serving certificate signed by it. Inject ca.crt "
            "before the server sees the new serving certificate: see docs/how-to/certificates.md."
        ),
    )
    rotate.add_argument("--dir", required=True, metavar="DIR", help="an existing cert dir")
    _service_flags(rotate)
    _san_flags(rotate, inherit=True)
    _validity_flags(rotate, ca=True)
    rotate.add_argument(
        "--ca-only",
        action="store_true",
        help="only add the new CA; make the serving certificate later with 'renew'",
    )
    rotate.set_defaults(handler=_guard(_rotate))

    renew = sub.add_parser(
        "renew",
        help="a new serving certificate from the directory's current CA",
        description="Replace tls.key and tls.crt with a new pair signed by ca.key.",
    )
    renew.add_argument("--dir", required=True, metavar="DIR", help="an existing cert dir")
    _service_flags(renew)
    _san_flags(renew, inherit=True)
    _validity_flags(renew, ca=False)
    renew.set_defaults(handler=_guard(_renew))

    prune = sub.add_parser(
        "prune",
        help="drop old CAs from the bundle once every client has the new one",
        description="Keep only the current CA in ca.crt (refused if tls.crt is not from it).",
    )
    prune.add_argument("--dir", required=True, metavar="DIR", help="an existing cert dir")
    prune.set_defaults(handler=_guard(_prune))

    inspect = sub.add_parser(
        "inspect",
        help="show the certificates in a PEM file",
        description="Print subject, issuer, SANs, validity and fingerprint of each certificate.",
    )
    inspect.add_argument("file", metavar="FILE", help="a PEM certificate or bundle")
    inspect.set_defaults(handler=_guard(_inspect))


def _service_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--service", default=DEFAULT_SERVICE, help=f"Service name (default {DEFAULT_SERVICE})"
    )
    parser.add_argument(
        "--namespace",
        "-n",
        default=DEFAULT_NAMESPACE,
        help=f"Service namespace (default {DEFAULT_NAMESPACE})",
    )


def _san_flags(parser: argparse.ArgumentParser, *, inherit: bool = False) -> None:
    more = " (default: those of the current tls.crt)" if inherit else ""
    parser.add_argument(
        "--dns",
        action="append",
        default=None,
        metavar="NAME",
        help=f"extra DNS name, repeatable{more}",
    )
    parser.add_argument(
        "--ip",
        action="append",
        default=None,
        metavar="ADDR",
        help=f"IP address SAN, e.g. 127.0.0.1, repeatable{more}",
    )


def _validity_flags(parser: argparse.ArgumentParser, *, ca: bool) -> None:
    parser.add_argument(
        "--validity",
        type=_validity_arg,
        default=DEFAULT_LEAF_VALIDITY,
        help="serving certificate validity, e.g. 365d, 12h, 90m (default 365d)",
    )
    if ca:
        parser.add_argument(
            "--ca-validity",
            type=_validity_arg,
            default=DEFAULT_CA_VALIDITY,
            help="CA validity (default 3650d)",
        )


def _guard(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Turn user mistakes into one line on stderr and exit code 2."""

    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except (ValueError, OSError) as exc:
            # CertDirError and InjectError-not-found are ValueErrors or handled below.
            _error(args, str(exc))
            return 2

    return run


def _error(args: argparse.Namespace, message: str) -> None:
    print(f"holdwarden certs {args.certs_command}: error: {message}", file=sys.stderr)


def _generate(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if (out / CA_KEY).exists() and not args.force:
        _error(args, f"{out / CA_KEY} exists; use 'certs rotate' to replace it, or --force")
        return 2
    ca = generate_ca(validity=args.ca_validity)
    serving = generate_serving(
        ca,
        args.service,
        args.namespace,
        extra_dns=args.dns or (),
        ip_addresses=args.ip or (),
        validity=args.validity,
    )
    write_cert_dir(out, ca, serving)
    print(f"wrote {out}/{{{CA_BUNDLE},{CA_KEY},{TLS_CERT},{TLS_KEY}}}")
    _summary("CA", ca.certificate)
    _summary("serving", serving.certificate)
    print("next: holdwarden certs inject --ca-bundle", out / CA_BUNDLE)
    return 0


def _inject(args: argparse.Namespace) -> int:
    from kubernetes.config.config_exception import ConfigException

    from holdwarden import kubeclient
    from holdwarden.certs.inject import InjectError, inject_ca_bundle

    try:
        bundle = Path(args.ca_bundle).read_bytes()
    except OSError as exc:
        _error(args, f"cannot read --ca-bundle {args.ca_bundle}: {exc.strerror}")
        return 2
    try:
        certs = parse_bundle(bundle)
    except CertDirError as exc:
        _error(args, f"--ca-bundle {args.ca_bundle}: {exc}")
        return 2
    if not certs:
        _error(args, f"--ca-bundle {args.ca_bundle} holds no PEM certificate")
        return 2
    try:
        api_client = kubeclient.api_client(args.kubeconfig, args.context)
    except (ConfigException, OSError) as exc:
        _error(args, f"no usable Kubernetes configuration: {exc}")
        return 2
    try:
        with api_client:
            changed = inject_ca_bundle(api_client, args.webhook_config, bundle)
    except InjectError as exc:
        _error(args, str(exc))
        return 2 if exc.not_found else 1
    print(
        f"ValidatingWebhookConfiguration {args.webhook_config}: {changed} webhook(s) updated "
        f"with {len(certs)} CA certificate(s)"
    )
    return 0


def _enforce(args: argparse.Namespace) -> int:
    import time

    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config.config_exception import ConfigException

    from holdwarden import kubeclient
    from holdwarden.certs.enforcing import reconcile
    from holdwarden.config import Config

    config = Config.from_file(args.config) if args.config else Config()
    try:
        api_client = kubeclient.api_client(args.kubeconfig, args.context)
    except (ConfigException, OSError) as exc:
        _error(args, f"no usable Kubernetes configuration: {exc}")
        return 2
    deadline = time.monotonic() + args.wait.total_seconds()
    with api_client:
        admission = k8s.AdmissionregistrationV1Api(api_client)
        while True:
            try:
                configuration = admission.read_validating_webhook_configuration(
                    args.webhook_config, _request_timeout=30
                )
            except ApiException as exc:
                if exc.status == 404:
                    _error(args, f"ValidatingWebhookConfiguration {args.webhook_config} not found")
                    return 2
                _error(args, f"API request failed: {exc.status} {exc.reason}")
                return 1
            verdict = reconcile(config, api_client, configuration, 30.0, args.verify)
            done = verdict.changed or all(p == verdict.wanted for p in verdict.current)
            print(f"ValidatingWebhookConfiguration {args.webhook_config}: {verdict.reason}")
            if done:
                return 0
            if time.monotonic() >= deadline:
                return 1
            time.sleep(5)


def _rotate(args: argparse.Namespace) -> int:
    from holdwarden.certs.rotate import renew_serving, rotate_ca

    # Check the serving flags before the CA changes, so a typo changes nothing.
    generate_serving(
        generate_ca(validity=args.ca_validity),
        args.service,
        args.namespace,
        extra_dns=args.dns or (),
        ip_addresses=args.ip or (),
        validity=args.validity,
    )
    result = rotate_ca(args.dir, ca_validity=args.ca_validity)
    print(f"new CA first in {Path(args.dir) / CA_BUNDLE}")
    _summary("new CA", result.ca.certificate)
    for cert in result.kept:
        _summary("kept CA", cert)
    for cert in result.dropped:
        _summary("dropped expired CA", cert)
    if args.ca_only:
        print("next: inject ca.crt, then 'holdwarden certs renew' for the serving certificate")
        return 0
    serving = renew_serving(
        args.dir,
        args.service,
        args.namespace,
        extra_dns=args.dns,
        ip_addresses=args.ip,
        validity=args.validity,
    )
    _summary("serving", serving.certificate)
    print(
        "next: inject ca.crt before the server loads the new tls.crt (docs/how-to/certificates.md)"
    )
    return 0


def _renew(args: argparse.Namespace) -> int:
    from holdwarden.certs.rotate import renew_serving

    serving = renew_serving(
        args.dir,
        args.service,
        args.namespace,
        extra_dns=args.dns,
        ip_addresses=args.ip,
        validity=args.validity,
    )
    _summary("serving", serving.certificate)
    return 0


def _prune(args: argparse.Namespace) -> int:
    from holdwarden.certs.rotate import prune

    dropped = prune(args.dir)
    for cert in dropped:
        _summary("dropped CA", cert)
    current = load_cert_dir(args.dir).ca.certificate
    _summary("kept CA", current)
    return 0


def _inspect(args: argparse.Namespace) -> int:
    try:
        data = Path(args.file).read_bytes()
    except OSError as exc:
        _error(args, f"cannot read {args.file}: {exc.strerror}")
        return 2
    certs = parse_bundle(data)
    if not certs:
        _error(args, f"{args.file} holds no PEM certificate")
        return 2
    for index, cert in enumerate(certs):
        if index:
            print()
        print(describe(cert, index=index, total=len(certs)))
    return 0


def describe(
    cert: x509.Certificate, *, index: int = 0, total: int = 1, now: datetime | None = None
) -> str:
    """A human-readable summary of one certificate."""
    now = now or datetime.now(UTC)
    lines = [f"certificate {index + 1} of {total}"]
    lines.append(f"  subject:     {cert.subject.rfc4514_string()}")
    lines.append(f"  issuer:      {cert.issuer.rfc4514_string()}")
    try:
        ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        ca = False
    lines.append(f"  CA:          {'yes' if ca else 'no'}")
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = [*sans.get_values_for_type(x509.DNSName)]
        names += [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)]
    except x509.ExtensionNotFound:
        names = []
    lines.append(f"  SANs:        {', '.join(names) if names else '(none)'}")
    lines.append(f"  notBefore:   {_rfc3339(cert.not_valid_before_utc)}")
    state = "EXPIRED" if cert.not_valid_after_utc <= now else f"{_left(cert, now)} left"
    lines.append(f"  notAfter:    {_rfc3339(cert.not_valid_after_utc)} ({state})")
    lines.append(f"  serial:      {cert.serial_number:x}")
    lines.append(f"  sha256:      {fingerprint(cert)}")
    return "\n".join(lines)


def _summary(label: str, cert: x509.Certificate) -> None:
    print(
        f"  {label}: {cert.subject.rfc4514_string()}, notAfter "
        f"{_rfc3339(cert.not_valid_after_utc)}, sha256 {fingerprint(cert)[:16]}…"
    )


def _rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _left(cert: x509.Certificate, now: datetime) -> str:
    remaining = cert.not_valid_after_utc - now
    if remaining >= timedelta(days=2):
        return f"{remaining.days}d"
    return f"{int(remaining.total_seconds() // 3600)}h"
