"""manifests/kueue-manage-all and the generators behind it (webhook/match_conditions.py,
webhook/policy.py): the shipped patch is the rendered one, and the command lines print
what another managedJobsNamespaceSelector needs or refuse a bad one naming it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from holdwarden import labelselector
from holdwarden.config import Config
from holdwarden.vocabulary import KUEUE_NAMESPACE_PATH, KUEUE_NAMESPACE_WEBHOOK
from holdwarden.webhook import match_conditions, policy
from tests.support.kustomize import render

ROOT = Path(__file__).resolve().parents[2]
COMPONENT = ROOT / "manifests" / "kueue-manage-all"


def test_the_shipped_patch_is_the_rendered_one_for_kueues_default_selector() -> None:
    shipped = (COMPONENT / "webhook-patch.yaml").read_text()
    assert shipped == match_conditions.kueue_namespace_patch(labelselector.kueue_default()), (
        "regenerate: python -m holdwarden.webhook.match_conditions --kueue-namespace-entry "
        "> manifests/kueue-manage-all/webhook-patch.yaml"
    )


def test_the_component_adds_the_second_entry_and_turns_the_setting_on() -> None:
    objs = render(ROOT / "manifests", [COMPONENT])
    (hook,) = [o for o in objs if o["kind"] == "ValidatingWebhookConfiguration"]
    first, second = hook["webhooks"]
    assert second["name"] == KUEUE_NAMESPACE_WEBHOOK
    assert second["clientConfig"]["service"] == dict(
        first["clientConfig"]["service"], path=KUEUE_NAMESPACE_PATH
    )
    # Installed like the first: Ignore until the enforcer is verified.
    assert second["failurePolicy"] == first["failurePolicy"] == "Ignore"
    (config_map,) = [o for o in objs if o["kind"] == "ConfigMap"]
    config = Config.from_dict(yaml.safe_load(config_map["data"]["config.yaml"]))
    assert config.kueue_manage_jobs_without_queue_name
    assert config.kueue_managed_jobs_namespace_selector == labelselector.kueue_default()


def test_the_command_lines_print_another_selector(capsys: pytest.CaptureFixture[str]) -> None:
    selector = '{"matchLabels": {"team": "ml"}}'
    assert (
        match_conditions.main(
            ["--kueue-namespace-entry", "--managed-jobs-namespace-selector", selector]
        )
        == 0
    )
    (op,) = yaml.safe_load(capsys.readouterr().out)
    assert op["value"]["namespaceSelector"]["matchLabels"] == {"team": "ml"}
    assert (
        policy.main(["--kueue-namespace-policy", "--managed-jobs-namespace-selector", selector])
        == 0
    )
    documents = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["kind"] for d in documents] == [
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
    assert documents[1]["spec"]["matchResources"]["namespaceSelector"]["matchLabels"] == {
        "team": "ml"
    }


@pytest.mark.parametrize("main", [match_conditions.main, policy.main])
def test_a_bad_selector_is_refused_naming_its_key(
    main: object, capsys: pytest.CaptureFixture[str]
) -> None:
    flag = (
        "--kueue-namespace-entry" if main is match_conditions.main else "--kueue-namespace-policy"
    )
    with pytest.raises(SystemExit) as raised:
        main([flag, "--managed-jobs-namespace-selector", '{"matchLabel": {}}'])  # type: ignore[operator]
    assert raised.value.code == 2
    assert "managed-jobs-namespace-selector.matchLabel: unknown key" in capsys.readouterr().err
