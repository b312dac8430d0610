"""The configuration schema: defaults, every key, and errors that name the key."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from holdwarden.config import Config, ConfigError, parse_duration
from holdwarden.vocabulary import DEFAULT_KUEUE_IDENTITIES, DEFAULT_WORKLOAD_DELETERS


def test_empty_file_gives_the_documented_defaults(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("")
    config = Config.from_file(path)
    assert config == Config()
    assert config.mode == "kueue"
    assert config.annotation_prefix == "holdwarden.io"
    assert config.apiserver_request_timeout == timedelta(seconds=60)
    assert config.kueue_identities == DEFAULT_KUEUE_IDENTITIES
    assert config.readmission.enabled is False
    assert config.webhook.workload_deleters == DEFAULT_WORKLOAD_DELETERS


def test_every_key_is_read() -> None:
    config = Config.from_dict(
        {
            "mode": "plain",
            "annotationPrefix": "holds.example.com",
            "holder": "dispatch",
            "timeouts": {"apiserverRequest": "1m30s"},
            "kueue": {"identities": ["system:serviceaccount:k:kueue"]},
            "webhook": {
                "listenAddress": "127.0.0.1:8443",
                "certDir": "/tls",
                "auditLog": "/audit.jsonl",
                "metricsAddress": "127.0.0.1:8080",
                "maxBodyBytes": 4096,
                "workloadDeleters": ["system:serviceaccount:ops:cleaner"],
            },
            "readmission": {"enabled": True, "controllerName": "x.io/gate", "interval": "250ms"},
        }
    )
    assert config.mode == "plain"
    assert config.annotation_prefix == "holds.example.com"
    assert config.holder == "dispatch"
    assert config.apiserver_request_timeout == timedelta(seconds=90)
    assert config.kueue_identities == ("system:serviceaccount:k:kueue",)
    assert config.webhook.listen_address == "127.0.0.1:8443"
    assert config.webhook.cert_dir == Path("/tls")
    assert config.webhook.audit_log == Path("/audit.jsonl")
    assert config.webhook.metrics_address == "127.0.0.1:8080"
    assert config.webhook.max_body_bytes == 4096
    assert config.webhook.workload_deleters == ("system:serviceaccount:ops:cleaner",)
    assert config.readmission.enabled is True
    assert config.readmission.controller_name == "x.io/gate"
    assert config.readmission.interval == timedelta(milliseconds=250)


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"mode": "kube"}, "mode"),
        ({"modes": "plain"}, "modes"),
        ({"annotationPrefix": "Not_A_Domain"}, "annotationPrefix"),
        ({"holder": " "}, "holder"),
        ({"holder": 3}, "holder"),
        ({"timeouts": {"apiserverRequest": "1 minute"}}, "timeouts.apiserverRequest"),
        ({"timeouts": {"apiserverRequest": "0s"}}, "timeouts.apiserverRequest"),
        ({"timeouts": {"requestTimeout": "60s"}}, "timeouts.requestTimeout"),
        ({"timeouts": "60s"}, "timeouts"),
        ({"kueue": {"identities": "kueue"}}, "kueue.identities"),
        ({"kueue": {"identities": [""]}}, "kueue.identities"),
        ({"webhook": {"listenAddress": "9443"}}, "webhook.listenAddress"),
        ({"webhook": {"metricsAddress": "0.0.0.0:99999"}}, "webhook.metricsAddress"),
        ({"webhook": {"maxBodyBytes": 10}}, "webhook.maxBodyBytes"),
        ({"webhook": {"maxBodyBytes": True}}, "webhook.maxBodyBytes"),
        ({"webhook": {"tls": {}}}, "webhook.tls"),
        ({"webhook": {"workloadDeleters": "gc"}}, "webhook.workloadDeleters"),
        ({"webhook": {"workloadDeleters": [""]}}, "webhook.workloadDeleters"),
        ({"readmission": {"enabled": "yes"}}, "readmission.enabled"),
        ({"readmission": {"interval": "0s"}}, "readmission.interval"),
        ({"readmission": {"controllerName": ""}}, "readmission.controllerName"),
        (["mode", "plain"], "<root>"),
    ],
)
def test_bad_values_name_their_key(data: Any, key: str) -> None:
    with pytest.raises(ConfigError) as raised:
        Config.from_dict(data)
    assert raised.value.key == key
    assert repr(key) in str(raised.value)


def test_unreadable_and_unparsable_files_say_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        Config.from_file(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("mode: [plain\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        Config.from_file(broken)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("60s", timedelta(seconds=60)),
        ("1m30s", timedelta(seconds=90)),
        ("250ms", timedelta(milliseconds=250)),
        ("2h", timedelta(hours=2)),
        ("1h2m3s4ms", timedelta(hours=1, minutes=2, seconds=3, milliseconds=4)),
    ],
)
def test_durations(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "60", "s", "1.5s", "-1s", "1d", "60 s", "1s1m"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_duration(text, "timeouts.apiserverRequest")


@given(st.integers(0, 99), st.integers(0, 59), st.integers(0, 59), st.integers(0, 999))
def test_duration_round_trip(hours: int, minutes: int, seconds: int, millis: int) -> None:
    text = (
        "".join(
            f"{value}{unit}"
            for value, unit in ((hours, "h"), (minutes, "m"), (seconds, "s"), (millis, "ms"))
            if value
        )
        or "0s"
    )
    expected = timedelta(hours=hours, minutes=minutes, seconds=seconds, milliseconds=millis)
    assert parse_duration(text) == expected
