"""The webhook's failurePolicy, set only once the enforcer is verified to answer.

The shipped ValidatingWebhookConfiguration carries ``failurePolicy: Ignore`` and no
caBundle, so that no write is refused while the enforcer is not yet reachable or trusted
(docs/install.md, "One step"). The policy it should end up with is the annotation
``holdwarden.io/failure-policy`` on that same object (``Fail`` when absent; the
defence-in-depth component and the chart's ``failurePolicy`` value set ``Ignore``). The
self-managed leader (certs/selfmanaged.py), once the caBundle is injected, verifies through
the apiserver that the enforcer answers, with the adapter's own preflight probe (a
server-side dry-run write the enforcer must refuse, in ``webhook.certificates
.probeNamespace``; handed in by the roof as a ``Verifier``), and only then writes the
wanted policy. It checks again every interval,
so a re-apply that resets the field to ``Ignore`` is corrected once the probe passes again;
a wanted ``Ignore`` needs no probe.

Every write is a PUT preconditioned on the resourceVersion read (a 409 is decided again at
the next interval); nothing here creates the configuration, so a deleted one stays deleted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from holdwarden.config import Config
from holdwarden.vocabulary import FAILURE_POLICY_ANNOTATION

POLICIES = ("Fail", "Ignore")
DEFAULT_POLICY = "Fail"


@dataclass(frozen=True)
class Verdict:
    """The outcome of one look at the failurePolicy: what is wanted, what is there, and
    whether a write was made (``changed``) or why not (``reason``)."""

    wanted: str
    current: tuple[str, ...]
    changed: bool
    reason: str


def wanted_policy(configuration: Any) -> str:
    """The failurePolicy the configuration's annotation asks for (``Fail`` by default).
    A value that is neither ``Fail`` nor ``Ignore`` is an error naming the annotation."""
    annotations = (configuration.metadata.annotations or {}) if configuration else {}
    value = str(annotations.get(FAILURE_POLICY_ANNOTATION, DEFAULT_POLICY))
    if value not in POLICIES:
        raise ValueError(
            f"ValidatingWebhookConfiguration {configuration.metadata.name!r} annotation "
            f"{FAILURE_POLICY_ANNOTATION}={value!r} is not Fail or Ignore"
        )
    return value


def current_policies(configuration: Any) -> tuple[str, ...]:
    """Each webhook's failurePolicy (the API's default, Fail, where unset)."""
    return tuple((w.failure_policy or "Fail") for w in configuration.webhooks or [])


Verifier = Callable[[Config, k8s.ApiClient, str], tuple[bool, str]]
"""Does the enforcer answer through the apiserver, probed in the namespace given? (True,
why) or (False, why). The roof hands in the adapter's preflight probe (a server-side dry-run
create of a held object without its hold field, which the enforcer must refuse by its rule:
``holdwarden.cli.serve.verify_enforcer``), so that certs/ imports no other part."""


def set_failure_policy(
    api: k8s.ApiClient, configuration: Any, policy: str, request_timeout: float
) -> bool:
    """Set ``policy`` on every webhook of ``configuration`` (as read), preconditioned on its
    resourceVersion. False when it changed meanwhile (409) or is gone (404): decided again
    from a fresh read."""
    for hook in configuration.webhooks or []:
        hook.failure_policy = policy
    try:
        k8s.AdmissionregistrationV1Api(api).replace_validating_webhook_configuration(
            configuration.metadata.name, configuration, _request_timeout=request_timeout
        )
    except ApiException as exc:
        if exc.status in (404, 409):
            return False
        raise
    return True


def reconcile(
    config: Config,
    api: k8s.ApiClient,
    configuration: Any,
    request_timeout: float,
    verify: Verifier,
) -> Verdict:
    """One look: leave the policy alone if it is the wanted one; set ``Ignore`` at once;
    set ``Fail`` only after the enforcer refused the probe through the apiserver."""
    wanted = wanted_policy(configuration)
    current = current_policies(configuration)
    if current and all(p == wanted for p in current):
        return Verdict(wanted, current, False, f"failurePolicy is {wanted}")
    if wanted == "Fail":
        namespace = config.webhook.certificates.probe_namespace
        answered, why = verify(config, api, namespace)
        if not answered:
            return Verdict(
                wanted,
                current,
                False,
                f"failurePolicy stays {'/'.join(sorted(set(current)))} until the enforcer is "
                f"verified (probe in namespace {namespace}: {why})",
            )
    if not set_failure_policy(api, configuration, wanted, request_timeout):
        return Verdict(wanted, current, False, "the configuration changed meanwhile")
    return Verdict(wanted, current, True, f"failurePolicy set to {wanted}")
