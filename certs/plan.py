"""What the self-managed certificate leader does next: a pure function of what it sees.

The leader (certs/selfmanaged.py) reads the Secret and the webhook configuration, reduces
them to a ``View`` (fingerprints and times only), asks ``decide`` for one ``Step``, does it,
and reads again. ``decide`` has no clock, no I/O and no randomness.

The order of the rules is what makes a rotation safe (overlap rotation):

  1. no Secret: CREATE a CA and a serving certificate from it;
  2. the signing CA is due (within ``caRenewBefore`` of its end): ROTATE_CA, a new CA first
     in the bundle and as the signing CA, old CAs still valid kept; the serving
     certificate is untouched, so nothing changes for the apiserver yet;
  3. the injected caBundle is not the Secret's bundle: INJECT it;
  4. the serving certificate must be replaced (expiring within ``renewBefore``, not signed
     by the signing CA, or naming the wrong hosts): RENEW, but if it moves to another CA
     only once the bundle holding that CA has been injected for ``propagationDelay``
     (the apiserver picks configuration changes up a moment later); until then WAIT;
  5. CAs other than the signing one are still in the bundle, and the serving certificate
     is the signing CA's and was issued at least ``prune_after`` ago (every replica has
     loaded it by then): PRUNE them (rule 3 then injects the smaller bundle);
  6. otherwise NOTHING.

Invariants (tests/unit/test_certs_plan.py checks them over random histories):
  - a serving certificate is only ever written signed by a CA that is in the injected
    bundle, and has been for ``propagationDelay`` (CREATE excepted: nothing was served);
  - a bundle is only ever injected if it holds the CA of the serving certificate in the
    Secret, and of the one it replaced less than ``prune_after`` ago.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime, timedelta


class Action(enum.Enum):
    CREATE = "create"
    ROTATE_CA = "rotate-ca"
    INJECT = "inject"
    RENEW = "renew"
    PRUNE = "prune"
    WAIT = "wait"
    NOTHING = "nothing"


@dataclass(frozen=True)
class CA:
    fingerprint: str
    not_after: datetime


@dataclass(frozen=True)
class Serving:
    """The serving certificate: ``issuer`` is the fingerprint of the CA of the bundle that
    signed it ("" when none did); ``issued_at`` when the leader made it."""

    issuer: str
    issued_at: datetime
    not_after: datetime
    names: frozenset[str]


@dataclass(frozen=True)
class Secret:
    """The Secret's contents: the bundle (newest first), the signing CA, the serving cert."""

    bundle: tuple[CA, ...]
    signing: str
    serving: Serving


@dataclass(frozen=True)
class View:
    """What the leader sees. ``injected``: the CA fingerprints in the caBundle (of every
    webhook of the configuration; None when it does not exist); ``injected_for``: how long
    that caBundle has been seen unchanged."""

    secret: Secret | None
    injected: frozenset[str] | None
    injected_for: timedelta
    now: datetime


@dataclass(frozen=True)
class Policy:
    ca_renew_before: timedelta
    renew_before: timedelta
    propagation_delay: timedelta
    prune_after: timedelta
    names: frozenset[str]


@dataclass(frozen=True)
class Step:
    action: Action
    reason: str


def decide(view: View, policy: Policy) -> Step:
    """The one next step (see the module doc for the rules and their order)."""
    secret = view.secret
    now = view.now
    if secret is None:
        return Step(Action.CREATE, "the Secret does not exist")
    signing = next((ca for ca in secret.bundle if ca.fingerprint == secret.signing), None)
    if signing is None or signing.not_after - now <= policy.ca_renew_before:
        return Step(Action.ROTATE_CA, "the signing CA is due for rotation")
    bundle = frozenset(ca.fingerprint for ca in secret.bundle)
    if view.injected is None:
        return Step(Action.WAIT, "the webhook configuration does not exist")
    if view.injected != bundle:
        return Step(Action.INJECT, "the injected caBundle is not the Secret's bundle")
    serving = secret.serving
    why = _renewal_reason(serving, secret.signing, now, policy)
    if why is not None:
        if serving.issuer != secret.signing and view.injected_for < policy.propagation_delay:
            return Step(Action.WAIT, f"{why}; the new CA's bundle is still propagating")
        return Step(Action.RENEW, why)
    if len(bundle) > 1 and now - serving.issued_at >= policy.prune_after:
        return Step(Action.PRUNE, "old CAs are no longer needed")
    return Step(Action.NOTHING, "up to date")


def _renewal_reason(serving: Serving, signing: str, now: datetime, policy: Policy) -> str | None:
    if serving.issuer != signing:
        return "the serving certificate is not signed by the signing CA"
    if serving.not_after - now <= policy.renew_before:
        return "the serving certificate is due for renewal"
    if serving.names != policy.names:
        return "the serving certificate names other hosts than configured"
    return None
