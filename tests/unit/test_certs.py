"""holdwarden.certs.generate, holdwarden.certs.bundle, holdwarden.certs.rotate and the
`holdwarden certs` CLI (no cluster)."""

from __future__ import annotations

import ipaddress
import os
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from holdwarden.certs import bundle as cert_bundle
from holdwarden.certs.bundle import CertDirError, load_cert_dir, parse_bundle, write_cert_dir
from holdwarden.certs.cli import parse_validity
from holdwarden.certs.generate import (
    KeyPair,
    fingerprint,
    generate_ca,
    generate_client,
    generate_serving,
)
from holdwarden.certs.rotate import prune, renew_serving, rotate, rotate_ca
from holdwarden.cli import main

NOW = datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)

# One CA for the tests that only need "a CA" (key generation is cheap, but not free).
CA = generate_ca(now=NOW)


def sans_of(cert: x509.Certificate) -> tuple[list[str], list[str]]:
    ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return (
        list(ext.get_values_for_type(x509.DNSName)),
        [str(ip) for ip in ext.get_values_for_type(x509.IPAddress)],
    )


def verifies(leaf: KeyPair, roots: list[x509.Certificate], name: str, at: datetime) -> bool:
    """Does ``leaf`` verify as a server certificate for ``name`` at ``at`` against ``roots``?

    Uses cryptography's X.509 path validation (RFC 5280 + CA/B-style policy), the same
    checks a TLS client makes.
    """
    subject: x509.verification.Subject
    try:
        subject = x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        subject = x509.DNSName(name)
    verifier = PolicyBuilder().store(Store(roots)).time(at).build_server_verifier(subject)
    try:
        verifier.verify(leaf.certificate, [])
    except VerificationError:
        return False
    return True


# -- the CA -------------------------------------------------------------------------


def test_ca_is_a_p256_pathlen0_ca_with_cert_and_crl_signing() -> None:
    cert = CA.certificate
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
    assert isinstance(cert.public_key().curve, ec.SECP256R1)  # type: ignore[union-attr]
    basic = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert basic.critical and basic.value.ca and basic.value.path_length == 0
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage)
    assert usage.critical
    assert usage.value.key_cert_sign and usage.value.crl_sign
    assert not usage.value.digital_signature
    ski = cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    assert ski == x509.SubjectKeyIdentifier.from_public_key(cert.public_key())
    assert cert.subject == cert.issuer
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "holdwarden-ca"
    cert.verify_directly_issued_by(cert)


@pytest.mark.parametrize(
    ("validity", "backdate"),
    [
        (timedelta(days=3650), timedelta(hours=1)),
        (timedelta(days=1), timedelta(0)),
        (timedelta(hours=2), timedelta(minutes=5)),
    ],
)
def test_ca_validity_window(validity: timedelta, backdate: timedelta) -> None:
    ca = generate_ca(validity=validity, backdate=backdate, now=NOW)
    assert ca.not_before == NOW - backdate
    assert ca.not_after == NOW + validity


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"validity": timedelta(0)}, "--ca-validity must be longer than zero"),
        ({"validity": timedelta(days=-1)}, "--ca-validity must be longer than zero"),
        ({"backdate": timedelta(seconds=-1)}, "backdate must not be negative"),
        ({"now": datetime(2026, 1, 1)}, "timezone-aware"),
        ({"common_name": ""}, "common name"),
        ({"common_name": "c" * 65}, "common name must be 1 to 64"),
    ],
)
def test_ca_rejects_bad_arguments(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        generate_ca(**kwargs)  # type: ignore[arg-type]


# -- serving certificates -----------------------------------------------------------


@pytest.mark.parametrize(
    ("service", "namespace", "extra_dns", "ips", "want_dns", "want_ips"),
    [
        (
            "holdwarden",
            "holdwarden-system",
            [],
            [],
            ["holdwarden", "holdwarden.holdwarden-system", "holdwarden.holdwarden-system.svc"],
            [],
        ),
        (
            "hw",
            "ns",
            ["localhost", "hw.ns.svc.cluster.local"],
            ["127.0.0.1", "::1"],
            ["hw", "hw.ns", "hw.ns.svc", "localhost", "hw.ns.svc.cluster.local"],
            ["127.0.0.1", "::1"],
        ),
        # Duplicates are written once.
        (
            "a",
            "b",
            ["a.b.svc", "x"],
            ["10.0.0.1", "10.0.0.1"],
            ["a", "a.b", "a.b.svc", "x"],
            ["10.0.0.1"],
        ),
    ],
)
def test_serving_sans(
    service: str,
    namespace: str,
    extra_dns: list[str],
    ips: list[str],
    want_dns: list[str],
    want_ips: list[str],
) -> None:
    leaf = generate_serving(CA, service, namespace, extra_dns=extra_dns, ip_addresses=ips, now=NOW)
    assert sans_of(leaf.certificate) == (want_dns, want_ips)
    cn = leaf.certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
    assert cn == f"{service}.{namespace}.svc"
    for name in want_dns + want_ips:
        assert verifies(leaf, [CA.certificate], name, NOW)
    assert not verifies(leaf, [CA.certificate], "other.example.com", NOW)


@pytest.mark.parametrize(
    ("service", "namespace", "want_cn"),
    [
        ("hw", "ns", "hw.ns.svc"),
        ("s" * 30, "n" * 29, "s" * 30 + "." + "n" * 29 + ".svc"),  # 64: fits
        ("s" * 30, "n" * 30, "s" * 30 + "." + "n" * 30),  # .svc would make 65
        ("s" * 63, "n" * 63, "s" * 63),
    ],
)
def test_serving_common_name_is_the_longest_service_name_that_fits(
    service: str, namespace: str, want_cn: str
) -> None:
    leaf = generate_serving(CA, service, namespace, now=NOW)
    cn = leaf.certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
    assert cn == want_cn
    assert sans_of(leaf.certificate)[0] == [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
    ]
    assert verifies(leaf, [CA.certificate], f"{service}.{namespace}.svc", NOW)


def test_serving_usages_and_key_identifiers() -> None:
    leaf = generate_serving(CA, "hw", "ns", now=NOW)
    cert = leaf.certificate
    assert isinstance(cert.public_key().curve, ec.SECP256R1)  # type: ignore[union-attr]
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage)
    assert usage.critical and usage.value.digital_signature
    assert not usage.value.key_cert_sign and not usage.value.crl_sign
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    basic = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert basic.ca is False
    aki = cert.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    ca_ski = CA.certificate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    assert aki.key_identifier == ca_ski.digest
    assert cert.issuer == CA.certificate.subject
    cert.verify_directly_issued_by(CA.certificate)


@pytest.mark.parametrize(
    ("validity", "backdate", "want_before", "want_after"),
    [
        (timedelta(days=365), timedelta(hours=1), NOW - timedelta(hours=1), NOW + timedelta(365)),
        (timedelta(hours=12), timedelta(0), NOW, NOW + timedelta(hours=12)),
        (
            timedelta(minutes=90),
            timedelta(minutes=10),
            NOW - timedelta(minutes=10),
            NOW + timedelta(minutes=90),
        ),
        # Backdating stops at the CA's own notBefore (NOW - 1h).
        (timedelta(days=1), timedelta(days=2), NOW - timedelta(hours=1), NOW + timedelta(1)),
    ],
)
def test_serving_validity_and_backdating(
    validity: timedelta, backdate: timedelta, want_before: datetime, want_after: datetime
) -> None:
    leaf = generate_serving(CA, "hw", "ns", validity=validity, backdate=backdate, now=NOW)
    assert leaf.not_before == want_before
    assert leaf.not_after == want_after
    # Clock skew: a verifier whose clock is behind by less than the backdate accepts it.
    assert verifies(leaf, [CA.certificate], "hw.ns.svc", max(want_before, CA.not_before))
    assert not verifies(leaf, [CA.certificate], "hw.ns.svc", want_after + timedelta(seconds=1))


def test_serving_never_outlives_its_ca() -> None:
    short_ca = generate_ca(validity=timedelta(days=30), now=NOW)
    with pytest.raises(ValueError, match=r"--validity 365d would outlive the CA"):
        generate_serving(short_ca, "hw", "ns", now=NOW)
    later = NOW + timedelta(days=29)
    with pytest.raises(ValueError, match="--validity 2d would outlive the CA"):
        generate_serving(short_ca, "hw", "ns", validity=timedelta(days=2), now=later)
    leaf = generate_serving(short_ca, "hw", "ns", validity=timedelta(days=1), now=later)
    assert leaf.not_after == short_ca.not_after


@pytest.mark.parametrize(
    ("service", "namespace", "kwargs", "message"),
    [
        ("Holdwarden", "ns", {}, "service 'Holdwarden' is not a DNS label"),
        ("hw", "ns.x", {}, "namespace 'ns.x' is not a DNS label"),
        ("-hw", "ns", {}, "is not a DNS label"),
        ("hw", "", {}, "namespace '' is not a DNS label"),
        ("a" * 64, "ns", {}, "is not a DNS label"),
        ("hw", "ns", {"ip_addresses": ["localhost"]}, "--ip 'localhost' is not an IP address"),
        ("hw", "ns", {"extra_dns": ["bad name"]}, "--dns 'bad name' is not a DNS name"),
        ("hw", "ns", {"extra_dns": [""]}, "is not a DNS name"),
        ("hw", "ns", {"validity": timedelta(0)}, "--validity must be longer than zero"),
    ],
)
def test_serving_rejects_bad_arguments(
    service: str, namespace: str, kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        generate_serving(CA, service, namespace, now=NOW, **kwargs)  # type: ignore[arg-type]


def test_serving_refuses_a_leaf_as_signer() -> None:
    leaf = generate_serving(CA, "hw", "ns", now=NOW)
    with pytest.raises(ValueError, match="not a CA"):
        generate_serving(leaf, "hw", "ns", now=NOW)


# Short labels, and labels near the 63-character limit (from_regex rarely makes those).
_label = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", fullmatch=True) | st.builds(
    lambda head, n: (head * n)[:63],
    st.sampled_from(["a", "x9", "k-8"]),
    st.integers(20, 63),
).filter(lambda s: not s.endswith("-"))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(service=_label, namespace=_label)
def test_property_any_labels_give_exactly_the_three_service_names(
    service: str, namespace: str
) -> None:
    leaf = generate_serving(CA, service, namespace, now=NOW)
    dns, ips = sans_of(leaf.certificate)
    assert dns == [service, f"{service}.{namespace}", f"{service}.{namespace}.svc"]
    assert ips == []
    leaf.certificate.verify_directly_issued_by(CA.certificate)
    assert verifies(leaf, [CA.certificate], f"{service}.{namespace}.svc", NOW)
    cn = leaf.certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
    assert cn in dns and len(cn) <= 64
    # The key written is the key certified.
    assert leaf.private_key.public_key() == leaf.certificate.public_key()


@settings(max_examples=25, deadline=None)
@given(
    validity_s=st.integers(min_value=1, max_value=3000 * 86400),
    backdate_s=st.integers(min_value=0, max_value=2 * 86400),
)
def test_property_window_is_exactly_what_was_asked_within_the_ca(
    validity_s: int, backdate_s: int
) -> None:
    ca = generate_ca(validity=timedelta(days=3650), backdate=timedelta(days=1), now=NOW)
    validity, backdate = timedelta(seconds=validity_s), timedelta(seconds=backdate_s)
    leaf = generate_serving(ca, "hw", "ns", validity=validity, backdate=backdate, now=NOW)
    assert leaf.not_after == NOW + validity
    assert leaf.not_before == max(NOW - backdate, ca.not_before)
    assert ca.not_before <= leaf.not_before < leaf.not_after <= ca.not_after


# -- client certificates ------------------------------------------------------------


def test_client_certificate_names_user_and_groups() -> None:
    admin = generate_client(CA, "admin", ["system:masters", "ops"], now=NOW)
    cert = admin.certificate
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "admin"
    orgs = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
    assert orgs == ["system:masters", "ops"]
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    with pytest.raises(x509.ExtensionNotFound):
        cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    cert.verify_directly_issued_by(CA.certificate)
    with pytest.raises(ValueError, match="common name"):
        generate_client(CA, "")


def test_keypair_helpers() -> None:
    leaf = generate_serving(CA, "hw", "ns", now=NOW)
    assert leaf.not_after.tzinfo is not None
    assert leaf.fingerprint == fingerprint(leaf.certificate)
    assert len(leaf.fingerprint) == 64
    assert leaf.key_pem.startswith(b"-----BEGIN PRIVATE KEY-----")
    assert leaf.private_key.public_key().public_numbers() == (
        leaf.certificate.public_key().public_numbers()  # type: ignore[union-attr]
    )


# -- the cert dir -------------------------------------------------------------------


def _files(directory: Path) -> dict[str, int]:
    return {p.name: stat.S_IMODE(p.stat().st_mode) for p in directory.iterdir()}


def test_write_and_load_cert_dir(tmp_path: Path) -> None:
    serving = generate_serving(CA, "hw", "ns", now=NOW)
    write_cert_dir(tmp_path / "d", CA, serving)
    assert _files(tmp_path / "d") == {
        "ca.crt": 0o644,
        "ca.key": 0o600,
        "tls.crt": 0o644,
        "tls.key": 0o600,
    }
    loaded = load_cert_dir(tmp_path / "d")
    assert loaded.ca == CA
    assert loaded.serving == serving
    assert [fingerprint(c) for c in loaded.bundle] == [CA.fingerprint]


def test_atomic_write_leaves_no_temporary_file_and_replaces_in_one_step(tmp_path: Path) -> None:
    target = tmp_path / "f"
    cert_bundle.atomic_write(target, b"one", 0o600)
    inode = target.stat().st_ino
    cert_bundle.atomic_write(target, b"two", 0o644)
    assert target.read_bytes() == b"two"
    assert target.stat().st_ino != inode  # a new file renamed over the old one
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert os.listdir(tmp_path) == ["f"]


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: (d / "tls.key").unlink(), "tls.key does not exist"),
        (lambda d: (d / "ca.crt").write_bytes(b"nothing"), "ca.crt holds no certificate"),
        (
            lambda d: (d / "tls.key").write_bytes(generate_serving(CA, "x", "y").key_pem),
            "tls.key does not match",
        ),
        (
            lambda d: (d / "ca.key").write_bytes(generate_ca().key_pem),
            "ca.key does not belong to any CA",
        ),
        (lambda d: (d / "ca.key").write_bytes(b"garbage"), "ca.key is not a private key"),
    ],
)
def test_load_cert_dir_names_the_bad_file(tmp_path: Path, damage: object, message: str) -> None:
    write_cert_dir(tmp_path, CA, generate_serving(CA, "hw", "ns", now=NOW))
    damage(tmp_path)  # type: ignore[operator]
    with pytest.raises(CertDirError, match=message):
        load_cert_dir(tmp_path)


# -- rotation -----------------------------------------------------------------------


def test_rotation_keeps_both_cas_and_both_serving_certs_verify(tmp_path: Path) -> None:
    old_ca = generate_ca(now=NOW)
    old_serving = generate_serving(old_ca, "hw", "ns", ip_addresses=["127.0.0.1"], now=NOW)
    write_cert_dir(tmp_path, old_ca, old_serving)
    later = NOW + timedelta(days=30)

    result = rotate(tmp_path, "hw", "ns", now=later)

    loaded = load_cert_dir(tmp_path)
    assert [fingerprint(c) for c in loaded.bundle] == [result.ca.ca.fingerprint, old_ca.fingerprint]
    assert loaded.ca == result.ca.ca
    assert loaded.serving == result.serving
    assert result.ca.kept == (old_ca.certificate,) and result.ca.dropped == ()
    bundle = list(loaded.bundle)
    for leaf in (old_serving, result.serving):
        assert verifies(leaf, bundle, "hw.ns.svc", later)
    # The new serving cert is from the new CA only; the 127.0.0.1 SAN was kept.
    assert not verifies(result.serving, [old_ca.certificate], "hw.ns.svc", later)
    assert verifies(result.serving, [result.ca.ca.certificate], "127.0.0.1", later)
    with pytest.raises(InvalidSignature):
        result.serving.certificate.verify_directly_issued_by(old_ca.certificate)


def test_rotation_drops_expired_cas_and_duplicates(tmp_path: Path) -> None:
    expired = generate_ca(validity=timedelta(days=10), now=NOW - timedelta(days=20))
    valid = generate_ca(now=NOW - timedelta(days=1))
    serving = generate_serving(valid, "hw", "ns", now=NOW)
    bundle = expired.cert_pem + valid.cert_pem + valid.cert_pem
    write_cert_dir(tmp_path, valid, serving, bundle=bundle)

    result = rotate_ca(tmp_path, now=NOW)

    assert [fingerprint(c) for c in result.kept] == [valid.fingerprint]
    assert [fingerprint(c) for c in result.dropped] == [expired.fingerprint]
    assert [fingerprint(c) for c in parse_bundle((tmp_path / "ca.crt").read_bytes())] == [
        result.ca.fingerprint,
        valid.fingerprint,
    ]
    # rotate_ca leaves the serving pair alone; it still verifies against the new bundle.
    assert load_cert_dir(tmp_path).serving == serving
    assert verifies(serving, list(load_cert_dir(tmp_path).bundle), "hw.ns", NOW)


def test_three_rotations_keep_every_unexpired_ca(tmp_path: Path) -> None:
    write_cert_dir(tmp_path, CA, generate_serving(CA, "hw", "ns", now=NOW))
    cas = [CA.fingerprint]
    for step in range(1, 4):
        result = rotate(tmp_path, "hw", "ns", now=NOW + timedelta(days=step))
        cas.insert(0, result.ca.ca.fingerprint)
        assert [fingerprint(c) for c in load_cert_dir(tmp_path).bundle] == cas


def test_renew_serving_uses_current_ca_and_keeps_extra_names(tmp_path: Path) -> None:
    first = generate_serving(CA, "hw", "ns", extra_dns=["localhost"], ip_addresses=["::1"], now=NOW)
    write_cert_dir(tmp_path, CA, first)
    renewed = renew_serving(tmp_path, "hw", "ns", now=NOW + timedelta(days=1))
    assert renewed.fingerprint != first.fingerprint
    assert sans_of(renewed.certificate) == sans_of(first.certificate)
    renewed.certificate.verify_directly_issued_by(CA.certificate)
    replaced = renew_serving(tmp_path, "hw", "ns", extra_dns=[], ip_addresses=["127.0.0.1"])
    assert sans_of(replaced.certificate) == (["hw", "hw.ns", "hw.ns.svc"], ["127.0.0.1"])


def test_rotate_with_bad_arguments_changes_nothing(tmp_path: Path) -> None:
    write_cert_dir(tmp_path, CA, generate_serving(CA, "hw", "ns", now=NOW))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(ValueError, match="--validity"):
        rotate(tmp_path, "hw", "ns", validity=timedelta(days=9999), now=NOW)
    with pytest.raises(ValueError, match="service"):
        rotate(tmp_path, "HW", "ns", now=NOW)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_prune_keeps_only_the_current_ca_and_refuses_too_early(tmp_path: Path) -> None:
    write_cert_dir(tmp_path, CA, generate_serving(CA, "hw", "ns", now=NOW))
    staged = rotate_ca(tmp_path, now=NOW)
    with pytest.raises(CertDirError, match="not signed by the current CA"):
        prune(tmp_path)
    renew_serving(tmp_path, "hw", "ns", now=NOW)
    dropped = prune(tmp_path)
    assert [fingerprint(c) for c in dropped] == [CA.fingerprint]
    assert [fingerprint(c) for c in load_cert_dir(tmp_path).bundle] == [staged.ca.fingerprint]
    assert prune(tmp_path) == ()


# -- CLI ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("365d", timedelta(days=365)),
        ("12h", timedelta(hours=12)),
        ("90m", timedelta(minutes=90)),
        ("30s", timedelta(seconds=30)),
        ("1d12h", timedelta(days=1, hours=12)),
        ("3650d", timedelta(days=3650)),
    ],
)
def test_parse_validity(text: str, want: timedelta) -> None:
    assert parse_validity(text) == want


@pytest.mark.parametrize(
    "text", ["", "0d", "365", "1y", "-1d", "12h1d", "d", "1.5d", "9" * 30 + "d"]
)
def test_parse_validity_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="validity"):
        parse_validity(text)


@given(days=st.integers(0, 5000), hours=st.integers(0, 23), minutes=st.integers(0, 59))
def test_property_parse_validity_round_trips(days: int, hours: int, minutes: int) -> None:
    want = timedelta(days=days, hours=hours, minutes=minutes)
    text = f"{days}d{hours}h{minutes}m"
    if want > timedelta(0):
        assert parse_validity(text) == want
    else:
        with pytest.raises(ValueError):
            parse_validity(text)


def test_cli_generate_rotate_renew_prune_inspect(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "certs"
    args = ["certs", "generate", "--service", "hw", "--namespace", "ns", "--out", str(out)]
    assert main([*args, "--ip", "127.0.0.1", "--validity", "30d", "--ca-validity", "60d"]) == 0
    first = load_cert_dir(out)
    assert first.serving.not_after - first.serving.not_before == timedelta(days=30, hours=1)
    assert first.ca.not_after - first.ca.not_before == timedelta(days=60, hours=1)
    assert sans_of(first.serving.certificate)[1] == ["127.0.0.1"]

    assert main(args) == 2  # refuses to overwrite a CA
    assert "use 'certs rotate'" in capsys.readouterr().err

    rot = ["certs", "rotate", "--dir", str(out), "--service", "hw", "--namespace", "ns"]
    assert main([*rot, "--ca-only"]) == 0
    staged = load_cert_dir(out)
    assert len(staged.bundle) == 2 and staged.serving == first.serving
    renew = ["certs", "renew", "--dir", str(out), "--service", "hw", "--namespace", "ns"]
    assert main(renew) == 0
    assert load_cert_dir(out).serving.certificate.issuer == staged.ca.certificate.subject
    assert sans_of(load_cert_dir(out).serving.certificate)[1] == ["127.0.0.1"]
    assert main(["certs", "prune", "--dir", str(out)]) == 0
    assert len(load_cert_dir(out).bundle) == 1
    assert main(rot) == 0
    assert len(load_cert_dir(out).bundle) == 2
    capsys.readouterr()

    assert main(["certs", "inspect", str(out / "ca.crt")]) == 0
    printed = capsys.readouterr().out
    assert printed.count("certificate ") == 2 and "of 2" in printed
    for cert in load_cert_dir(out).bundle:
        assert fingerprint(cert) in printed
    assert main(["certs", "inspect", str(out / "tls.crt")]) == 0
    printed = capsys.readouterr().out
    assert "SANs:        hw, hw.ns, hw.ns.svc, 127.0.0.1" in printed
    assert "CA:          no" in printed and "notAfter:" in printed


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["certs", "generate", "--out", "{d}", "--validity", "5000d"], "would outlive the CA"),
        (["certs", "generate", "--out", "{d}", "--service", "Bad"], "is not a DNS label"),
        (["certs", "generate", "--out", "{d}", "--ip", "nope"], "is not an IP address"),
        (["certs", "rotate", "--dir", "{d}/missing"], "does not exist"),
        (["certs", "renew", "--dir", "{d}/missing"], "does not exist"),
        (["certs", "prune", "--dir", "{d}/missing"], "does not exist"),
        (["certs", "inspect", "{d}/missing"], "cannot read"),
        (["certs", "inspect", "{d}/notpem"], "holds no PEM certificate"),
        (["certs", "inject", "--ca-bundle", "{d}/notpem"], "holds no PEM certificate"),
        (["certs", "inject", "--ca-bundle", "{d}/missing"], "cannot read --ca-bundle"),
        (
            ["certs", "inject", "--ca-bundle", "{d}/ca.pem", "--kubeconfig", "{d}/missing"],
            "no usable Kubernetes configuration",
        ),
    ],
)
def test_cli_user_mistakes_exit_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    (tmp_path / "notpem").write_text("hello\n")
    (tmp_path / "ca.pem").write_bytes(CA.cert_pem)
    code = main([a.replace("{d}", str(tmp_path)) for a in argv])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("flag", ["--validity", "--ca-validity"])
def test_cli_bad_validity_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["certs", "generate", "--out", str(tmp_path), flag, "1y"])
    assert exit_info.value.code == 2
    assert f"argument {flag}: '1y' is not a validity" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
