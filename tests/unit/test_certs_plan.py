"""holdwarden.certs.plan.decide: the self-managed leader's next step (pure; no cluster)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from holdwarden.certs.plan import CA, Action, Policy, Secret, Serving, View, decide

NOW = datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)
NAMES = frozenset({"DNS:holdwarden", "IP:127.0.0.1"})
POLICY = Policy(
    ca_renew_before=timedelta(days=365),
    renew_before=timedelta(days=30),
    propagation_delay=timedelta(seconds=10),
    prune_after=timedelta(seconds=40),
    names=NAMES,
)
OLD = CA("old", NOW + timedelta(days=2000))
NEW = CA("new", NOW + timedelta(days=3650))


def serving(issuer: str = "new", *, age: timedelta = timedelta(days=1), left: int = 80) -> Serving:
    return Serving(issuer, NOW - age, NOW + timedelta(days=left), NAMES)


def view(
    secret: Secret | None,
    injected: frozenset[str] | None = frozenset({"new"}),
    injected_for: timedelta = timedelta(hours=1),
) -> View:
    return View(secret, injected, injected_for, NOW)


FRESH = Secret((NEW,), "new", serving())
ROTATED = Secret((NEW, OLD), "new", serving("old"))
BOTH = frozenset({"new", "old"})

CASES = [
    ("no Secret", view(None, frozenset()), Action.CREATE),
    ("no Secret, no configuration", view(None, None), Action.CREATE),
    ("all fresh and injected", view(FRESH), Action.NOTHING),
    ("bundle not injected yet", view(FRESH, frozenset()), Action.INJECT),
    ("another bundle injected", view(FRESH, frozenset({"other"})), Action.INJECT),
    ("configuration missing", view(FRESH, None), Action.WAIT),
    (
        "CA due",
        view(replace(FRESH, bundle=(CA("new", NOW + timedelta(days=300)),))),
        Action.ROTATE_CA,
    ),
    ("CA expired", view(replace(FRESH, bundle=(CA("new", NOW - timedelta(1)),))), Action.ROTATE_CA),
    ("signing CA not in the bundle", view(replace(FRESH, signing="gone")), Action.ROTATE_CA),
    ("serving due", view(replace(FRESH, serving=serving(left=29))), Action.RENEW),
    ("serving expired", view(replace(FRESH, serving=serving(left=-1))), Action.RENEW),
    (
        "serving names changed",
        view(replace(FRESH, serving=replace(serving(), names=frozenset({"DNS:x"})))),
        Action.RENEW,
    ),
    ("after CA rotation: inject first", view(ROTATED, frozenset({"old"})), Action.INJECT),
    (
        "after CA rotation: injected, still propagating",
        view(ROTATED, BOTH, timedelta(seconds=9)),
        Action.WAIT,
    ),
    ("after CA rotation: injected and settled", view(ROTATED, BOTH), Action.RENEW),
    (
        "renewed from the new CA, too recently to prune",
        view(replace(ROTATED, serving=serving(age=timedelta(seconds=39))), BOTH),
        Action.NOTHING,
    ),
    (
        "renewed from the new CA long enough ago",
        view(replace(ROTATED, serving=serving(age=timedelta(seconds=40))), BOTH),
        Action.PRUNE,
    ),
    (
        "same-CA renewal needs no propagation",
        view(replace(FRESH, serving=serving(left=1)), frozenset({"new"}), timedelta(0)),
        Action.RENEW,
    ),
]


@pytest.mark.parametrize(("what", "seen", "expected"), CASES, ids=[c[0] for c in CASES])
def test_decide_table(what: str, seen: View, expected: Action) -> None:
    step = decide(seen, POLICY)
    assert step.action is expected, (what, step)
    assert step.reason


# -- random histories -----------------------------------------------------------------


@dataclass
class Model:
    """The Secret and the webhook configuration as the leader's steps change them."""

    policy: Policy
    ca_validity: timedelta
    validity: timedelta
    now: datetime = NOW
    secret: Secret | None = None
    injected: frozenset[str] = frozenset()
    injected_at: datetime = NOW
    # (serving issuer, replaced at): serving certs a slow replica may still serve.
    replaced: list[tuple[str, datetime]] = field(default_factory=list)
    ids: itertools.count[int] = field(default_factory=itertools.count)
    actions: list[Action] = field(default_factory=list)

    def new_ca(self) -> CA:
        return CA(f"ca{next(self.ids)}", self.now + self.ca_validity)

    def new_serving(self, issuer: str) -> Serving:
        return Serving(issuer, self.now, self.now + self.validity, self.policy.names)

    def step(self) -> None:
        seen = View(self.secret, self.injected, self.now - self.injected_at, self.now)
        action = decide(seen, self.policy).action
        self.actions.append(action)
        secret = self.secret
        if action is Action.CREATE:
            ca = self.new_ca()
            self.secret = Secret((ca,), ca.fingerprint, self.new_serving(ca.fingerprint))
            return
        if action in (Action.WAIT, Action.NOTHING):
            return
        assert secret is not None
        if action is Action.ROTATE_CA:
            ca = self.new_ca()
            kept = tuple(c for c in secret.bundle if c.not_after > self.now)
            self.secret = replace(secret, bundle=(ca, *kept), signing=ca.fingerprint)
        elif action is Action.INJECT:
            bundle = frozenset(c.fingerprint for c in secret.bundle)
            # Invariant: what is served, and what was served until recently, stays trusted.
            assert secret.serving.issuer in bundle or not self.injected
            for issuer, at in self.replaced:
                if self.now - at < self.policy.prune_after:
                    assert issuer in bundle, (issuer, self.actions)
            self.injected = bundle
            self.injected_at = self.now
        elif action is Action.RENEW:
            # Invariant: a new serving certificate is from a CA injected long enough ago.
            assert secret.signing in self.injected
            if secret.serving.issuer != secret.signing:
                assert self.now - self.injected_at >= self.policy.propagation_delay
            self.replaced.append((secret.serving.issuer, self.now))
            self.secret = replace(secret, serving=self.new_serving(secret.signing))
        elif action is Action.PRUNE:
            signing = tuple(c for c in secret.bundle if c.fingerprint == secret.signing)
            self.secret = replace(secret, bundle=signing)


@settings(max_examples=150, deadline=None)
@given(
    gaps=st.lists(st.integers(1, 30 * 3600), min_size=1, max_size=300),
    ca_days=st.integers(20, 400),
    validity_days=st.integers(2, 10),
)
def test_random_histories_keep_the_served_certificate_trusted(
    gaps: list[int], ca_days: int, validity_days: int
) -> None:
    """Steps at most 30 h apart, validities of days: after the first injection the serving
    certificate is always valid and signed by a CA in the injected bundle, and the write
    invariants (asserted in Model.step) hold."""
    policy = replace(
        POLICY,
        ca_renew_before=timedelta(days=validity_days + 2),
        renew_before=timedelta(days=2),
    )
    model = Model(policy, timedelta(days=ca_days), timedelta(days=validity_days))
    for gap in gaps:
        # A few steps each tick, as the leader does (re-reading after each write).
        for _ in range(6):
            model.step()
        model.now += timedelta(seconds=gap)
        secret = model.secret
        assert secret is not None
        if model.injected:
            assert secret.serving.issuer in model.injected, model.actions
            assert secret.serving.not_after > model.now, model.actions


@given(
    ca_left=st.integers(-10, 4000),
    serving_left=st.integers(-10, 400),
    injected=st.sampled_from([None, frozenset(), frozenset({"new"}), BOTH]),
    injected_for=st.integers(0, 100),
    issuer=st.sampled_from(["new", "old", ""]),
)
def test_decide_never_renews_onto_an_uninjected_or_unsettled_ca(
    ca_left: int, serving_left: int, injected: frozenset[str] | None, injected_for: int, issuer: str
) -> None:
    secret = Secret(
        (CA("new", NOW + timedelta(days=ca_left)), OLD), "new", serving(issuer, left=serving_left)
    )
    step = decide(View(secret, injected, timedelta(seconds=injected_for), NOW), POLICY)
    if step.action is Action.RENEW:
        assert injected is not None and "new" in injected
        if issuer != "new":
            assert injected_for >= POLICY.propagation_delay.total_seconds()
    if step.action is Action.PRUNE:
        assert issuer == "new"


# -- the configuration section ------------------------------------------------------------


def test_certificates_section_defaults_and_every_key() -> None:
    from holdwarden.config import CertificatesConfig, Config

    assert Config.from_dict({}).webhook.certificates == CertificatesConfig()
    section = {
        "mode": "self-managed",
        "secretName": "s",
        "namespace": "ns",
        "webhookConfiguration": "w",
        "service": "svc",
        "dnsNames": ["a.example"],
        "ipAddresses": ["127.0.0.1"],
        "caValidity": "100h",
        "caRenewBefore": "50h",
        "validity": "50h",
        "renewBefore": "1h",
        "interval": "2s",
        "propagationDelay": "0s",
        "leaseName": "l",
    }
    got = Config.from_dict({"webhook": {"certificates": section}}).webhook.certificates
    assert got == CertificatesConfig(
        "self-managed",
        "s",
        "ns",
        "w",
        "svc",
        ("a.example",),
        ("127.0.0.1",),
        timedelta(hours=100),
        timedelta(hours=50),
        timedelta(hours=50),
        timedelta(hours=1),
        timedelta(seconds=2),
        timedelta(0),
        "l",
    )


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ({"mode": "cert-manager"}, "webhook.certificates.mode"),
        ({"secretName": ""}, "webhook.certificates.secretName"),
        ({"validity": "0s"}, "webhook.certificates.validity"),
        ({"interval": "soon"}, "webhook.certificates.interval"),
        ({"caValidity": "10h", "caRenewBefore": "10h"}, "webhook.certificates.caRenewBefore"),
        ({"caRenewBefore": "10h", "validity": "11h"}, "webhook.certificates.validity"),
        ({"validity": "10h", "renewBefore": "10h"}, "webhook.certificates.renewBefore"),
        ({"ipAddresses": "127.0.0.1"}, "webhook.certificates.ipAddresses"),
        ({"ipAddresses": ["localhost"]}, "webhook.certificates.ipAddresses"),
        ({"dnsNames": ["no_underscores.example"]}, "webhook.certificates.dnsNames"),
        ({"service": "Holdwarden"}, "webhook.certificates.service"),
        ({"rotate": True}, "webhook.certificates.rotate"),
    ],
)
def test_certificates_section_errors_name_the_key(section: dict[str, object], key: str) -> None:
    from holdwarden.config import Config, ConfigError

    with pytest.raises(ConfigError) as caught:
        Config.from_dict({"webhook": {"certificates": section}})
    assert caught.value.key == key


# -- from a real Secret to the View -----------------------------------------------------


def test_a_secret_after_a_ca_rotation_reads_as_inject_then_renew() -> None:
    """holdwarden.certs.selfmanaged reduces the Secret to the View: signing CA = the key's, issuer =
    the CA whose signature the serving certificate carries, names from its SANs."""
    import base64

    from holdwarden.certs.bundle import encode_bundle
    from holdwarden.certs.generate import generate_ca, generate_serving
    from holdwarden.certs.selfmanaged import parse_secret, serving_names, view_of
    from holdwarden.config import CertificatesConfig

    settings = CertificatesConfig(ip_addresses=("127.0.0.1",))
    old = generate_ca(now=NOW)
    new = generate_ca(now=NOW)
    serving = generate_serving(old, "holdwarden", "ns", ip_addresses=["127.0.0.1"], now=NOW)

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    data = {
        "ca.crt": b64(encode_bundle([new.certificate, old.certificate])),
        "ca.key": b64(new.key_pem),
        "tls.crt": b64(serving.cert_pem),
        "tls.key": b64(serving.key_pem),
    }
    certs = parse_secret(data, "Secret ns/s", "7")
    policy = replace(POLICY, names=serving_names(settings, "ns"))
    seen = view_of(certs, (old.certificate,), timedelta(hours=1), NOW)
    assert seen.secret is not None
    assert seen.secret.signing == new.fingerprint
    assert seen.secret.serving.issuer == old.fingerprint
    assert seen.secret.serving.issued_at == NOW
    assert seen.secret.serving.names == policy.names
    assert decide(seen, policy).action is Action.INJECT
    both = (new.certificate, old.certificate)
    assert decide(view_of(certs, both, timedelta(0), NOW), policy).action is Action.WAIT
    assert decide(view_of(certs, both, timedelta(hours=1), NOW), policy).action is Action.RENEW
