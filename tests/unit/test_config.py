"""The configuration schema: defaults, every key, and errors that name the key."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from holdwarden.config import Config, ConfigError, encode, parse_duration
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
    assert config.webhook.event_loop == "uvloop"


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
                "eventLoop": "asyncio",
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
    assert config.webhook.event_loop == "asyncio"
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


# -- the Structs: table tests, and properties over valid and invalid files ------------------


@pytest.mark.parametrize(
    ("data", "key", "words"),
    [
        ({"mode": "kube"}, "mode", "use 'kueue' or 'plain'"),
        ({"modes": "plain"}, "modes", "the keys here are mode, annotationPrefix"),
        ({"webhook": {"certificates": {"rotate": True}}}, "webhook.certificates.rotate", "mode"),
        ({"annotationPrefix": "Not_A_Domain"}, "annotationPrefix", "DNS subdomain"),
        ({"webhook": {"listenAddress": "9443"}}, "webhook.listenAddress", "host:port"),
        ({"webhook": {"maxBodyBytes": 10}}, "webhook.maxBodyBytes", "at least 1024"),
        ({"webhook": {"maxBodyBytes": "big"}}, "webhook.maxBodyBytes", "an integer"),
        ({"webhook": {"auditMaxFiles": 1001}}, "webhook.auditMaxFiles", "at most 1000"),
        ({"webhook": {"certDir": 3}}, "webhook.certDir", "file path"),
        ({"webhook": {"idleTimeout": "0s"}}, "webhook.idleTimeout", "longer than zero"),
        ({"webhook": {"shutdownDelay": "soon"}}, "webhook.shutdownDelay", "'60s'"),
        ({"webhook": {"eventLoop": "trio"}}, "webhook.eventLoop", "use 'asyncio' or 'uvloop'"),
        (
            {"webhook": {"maxBodyBytes": 8192, "maxInFlightBodyBytes": 4096}},
            "webhook.maxInFlightBodyBytes",
            "at least webhook.maxBodyBytes",
        ),
        ({"kueue": {"identities": ["a", ""]}}, "kueue.identities", "item 1"),
        ({"kueue": "yes"}, "kueue", "a mapping"),
        (
            {"readmission": {"multiKueue": {"kueueNamespace": "Kueue"}}},
            "readmission.multiKueue.kueueNamespace",
            "DNS label",
        ),
        (
            {"readmission": {"multiKueue": {"workerTimeout": "0s"}}},
            "readmission.multiKueue.workerTimeout",
            "longer than zero",
        ),
        ({"readmission": {"multiKueue": {"x": 1}}}, "readmission.multiKueue.x", "unknown key"),
        ({"readmission": {"metricsAddress": "x"}}, "readmission.metricsAddress", "host:port"),
        (
            {"kueue": {"managedJobsNamespaceSelector": {"matchLabel": {}}}},
            "kueue.managedJobsNamespaceSelector.matchLabel",
            "unknown key",
        ),
    ],
)
def test_bad_values_name_their_key_and_say_what_to_write(data: Any, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as raised:
        Config.from_dict(data)
    assert raised.value.key == key
    assert words in str(raised.value)


@pytest.mark.parametrize(
    "data",
    [
        {"webhook": None, "kueue": None, "readmission": {"multiKueue": None}},
        {"webhook": {"clientCAFile": ""}, "kueue": {"managedJobsNamespaceSelector": None}},
    ],
)
def test_empty_sections_and_optional_keys_mean_their_defaults(data: Any) -> None:
    assert Config.from_dict(data) == Config()


def test_the_file_and_the_attributes_name_the_same_keys() -> None:
    config = Config.from_dict(
        {
            "timeouts": {"apiserverRequest": "2m"},
            "kueue": {"manageJobsWithoutQueueName": True},
            "webhook": {"clientCAFile": "/ca.pem", "auditEvents": {"queueSize": 7}},
            "readmission": {"multiKueue": {"kueueNamespace": "kq", "workerRecheck": "9s"}},
        }
    )
    assert config.timeouts.apiserver_request == config.apiserver_request_timeout
    assert config.apiserver_request_timeout == timedelta(minutes=2)
    assert config.kueue.manage_jobs_without_queue_name is True
    assert config.kueue_manage_jobs_without_queue_name is True
    assert config.webhook.client_ca_file == Path("/ca.pem")
    assert config.webhook.audit_events.queue_size == 7
    assert config.readmission.multi_kueue.kueue_namespace == "kq"
    assert config.readmission.multi_kueue.worker_recheck == timedelta(seconds=9)


positive_durations = (
    st.tuples(st.integers(0, 99), st.integers(0, 59), st.integers(0, 59), st.integers(0, 999))
    .filter(any)
    .map(
        lambda parts: "".join(
            f"{value}{unit}"
            for value, unit in zip(parts, ("h", "m", "s", "ms"), strict=True)
            if value
        )
    )
)
names = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,10}[a-z0-9])?", fullmatch=True)
identities = st.lists(st.text(min_size=1, max_size=20), max_size=3)


def _sections(**parts: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Mappings holding any subset of the given keys."""
    return st.fixed_dictionaries({}, optional=parts)


valid_files = _sections(
    mode=st.sampled_from(["kueue", "plain"]),
    annotationPrefix=names,
    holder=names,
    timeouts=_sections(apiserverRequest=positive_durations),
    kueue=_sections(
        identities=identities,
        manageJobsWithoutQueueName=st.booleans(),
        managedJobsNamespaceSelector=st.builds(
            lambda labels: {"matchLabels": labels}, st.dictionaries(names, names, max_size=2)
        ),
    ),
    webhook=_sections(
        listenAddress=st.integers(0, 65535).map(lambda port: f"127.0.0.1:{port}"),
        maxBodyBytes=st.integers(1024, 2**20),
        eventLoop=st.sampled_from(["uvloop", "asyncio"]),
        idleTimeout=positive_durations,
        shutdownDelay=positive_durations | st.just("0s"),
        holderIdentities=identities,
        auditSinks=st.permutations(["file", "stdout", "events"]).flatmap(
            lambda sinks: st.integers(1, 3).map(lambda n: sinks[:n])
        ),
        auditEvents=_sections(
            qps=st.floats(0.001, 1e6), burst=st.integers(1, 1000), window=positive_durations
        ),
        certificates=_sections(
            mode=st.sampled_from(["files", "self-managed"]),
            dnsNames=st.lists(names.map(lambda name: f"{name}.example"), max_size=2),
            ipAddresses=st.lists(st.ip_addresses().map(str), max_size=2),
            probeNamespace=names,
        ),
    ),
    readmission=_sections(
        enabled=st.booleans(),
        interval=positive_durations,
        leaseNamespace=names | st.just(""),
        multiKueue=_sections(kueueNamespace=names, workerTimeout=positive_durations),
    ),
)


@given(valid_files)
def test_a_valid_file_reads_back_from_its_encoding(data: dict[str, Any]) -> None:
    """decode(encode(decode(x))) == decode(x), and the encoding is the file's own form:
    durations as they were written, keys in camelCase, only JSON types."""
    config = Config.from_dict(data)
    encoded = encode(config)
    assert Config.from_dict(encoded) == config
    assert Config.from_dict(msgspec.json.decode(msgspec.json.encode(encoded))) == config
    for section, keys in data.items():
        if isinstance(keys, dict):
            for key, value in keys.items():
                if isinstance(value, str | bool | int):
                    assert encoded[section][key] == value, (section, key)


SECTIONS = ["", "timeouts.", "kueue.", "webhook.", "webhook.auditEvents.",
            "webhook.certificates.", "readmission.", "readmission.multiKueue."]  # fmt: skip


@given(st.sampled_from(SECTIONS), st.from_regex(r"[a-zA-Z][a-zA-Z0-9]{0,15}", fullmatch=True))
def test_any_unknown_key_is_refused_by_its_dotted_path(section: str, name: str) -> None:
    known = {f.encode_name for f in msgspec.structs.fields(_section_type(section))}
    if name in known:
        return
    data: dict[str, Any] = {name: 1}
    for part in reversed(section.rstrip(".").split(".") if section else []):
        data = {part: data}
    with pytest.raises(ConfigError) as raised:
        Config.from_dict(data)
    assert raised.value.key == section + name
    assert "unknown key" in str(raised.value)


def _section_type(section: str) -> type[msgspec.Struct]:
    kind: type[msgspec.Struct] = Config
    for part in section.rstrip(".").split(".") if section else []:
        field = next(f for f in msgspec.structs.fields(kind) if f.encode_name == part)
        kind = field.type
    return kind
