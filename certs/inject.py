"""Put a CA bundle into a ValidatingWebhookConfiguration's ``clientConfig.caBundle``.

Invariants: every webhook of the named configuration ends up with exactly this bundle;
the write is preconditioned on the ``resourceVersion`` that was read (a concurrent
change makes it fail with 409 and it is redone from a fresh read, a few times); nothing
is written when every webhook already has the bundle.
"""

from __future__ import annotations

import base64
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from holdwarden.certs.bundle import parse_bundle

MAX_ATTEMPTS = 5


class InjectError(Exception):
    """The bundle could not be injected; the message names the object.

    ``not_found`` is true when the configuration does not exist (a user mistake, not an
    API failure).
    """

    def __init__(self, message: str, *, not_found: bool = False) -> None:
        super().__init__(message)
        self.not_found = not_found


def inject_ca_bundle(
    api_client: k8s.ApiClient,
    config_name: str,
    bundle_pem: bytes,
    *,
    request_timeout: float = 30.0,
) -> int:
    """Set ``caBundle`` on every webhook of ValidatingWebhookConfiguration ``config_name``.

    Returns how many webhooks changed (0: they all had it already; nothing written).
    """
    if not parse_bundle(bundle_pem):
        raise ValueError("the CA bundle holds no PEM certificate")
    encoded = base64.b64encode(bundle_pem).decode("ascii")
    api = k8s.AdmissionregistrationV1Api(api_client)
    what = f"ValidatingWebhookConfiguration {config_name!r}"
    for _ in range(MAX_ATTEMPTS):
        try:
            config: Any = api.read_validating_webhook_configuration(
                config_name, _request_timeout=request_timeout
            )
        except ApiException as exc:
            if exc.status == 404:
                raise InjectError(
                    f"{what} does not exist; apply the manifests first "
                    "(kubectl apply -k manifests/)",
                    not_found=True,
                ) from None
            raise InjectError(f"cannot read {what}: {_reason(exc)}") from None
        changed = 0
        for webhook in config.webhooks or []:
            if webhook.client_config.ca_bundle != encoded:
                webhook.client_config.ca_bundle = encoded
                changed += 1
        if changed == 0:
            return 0
        # The object as read carries metadata.resourceVersion: the update is refused with
        # 409 if anyone changed it since, instead of overwriting their change.
        try:
            api.replace_validating_webhook_configuration(
                config_name, config, _request_timeout=request_timeout
            )
        except ApiException as exc:
            if exc.status == 409:
                continue
            if exc.status == 404:
                raise InjectError(
                    f"{what} was deleted while the bundle was injected", not_found=True
                ) from None
            raise InjectError(f"cannot update {what}: {_reason(exc)}") from None
        return changed
    raise InjectError(
        f"{what} kept changing under us (409 Conflict {MAX_ATTEMPTS} times); try again"
    )


def _reason(exc: ApiException) -> str:
    return f"{exc.status} {exc.reason}".strip()
