"""The configuration's generated descriptions are up to date: docs/configuration.md's key
table and the chart's values.schema.json (its ``config`` part) are what
``python -m rig.configschema`` makes from holdwarden/config.py's Structs. Pure: no helm,
no cluster (tests/controlplane/test_chart.py runs the schema through the real Helm)."""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from holdwarden.config import Config, encode
from rig import configschema


def test_the_generated_files_are_up_to_date() -> None:
    stale = [str(path.relative_to(configschema.ROOT)) for path in configschema.stale()]
    assert not stale, f"{', '.join(stale)} differ from the Structs; run `{configschema.COMMAND}`"


def _leaves(data: dict[str, Any], prefix: str = "") -> set[str]:
    out: set[str] = set()
    for key, value in data.items():
        if isinstance(value, dict) and key != "managedJobsNamespaceSelector":
            out |= _leaves(value, f"{prefix}{key}.")
        else:
            out.add(prefix + key)
    return out


def test_the_table_has_one_row_per_key_of_the_file() -> None:
    text = configschema.DOCS.read_text(encoding="utf-8")
    table = text.split(configschema.BEGIN)[1].split(configschema.END)[0]
    keys = re.findall(r"^\| `([^`]+)` \|", table, re.MULTILINE)
    assert len(keys) == len(set(keys))
    assert set(keys) == _leaves(encode(Config()))


def test_the_chart_schema_describes_the_chart_default_configuration() -> None:
    schema = json.loads(configschema.VALUES_SCHEMA.read_text())["properties"]["config"]
    values = yaml.safe_load((configschema.ROOT / "charts/holdwarden/values.yaml").read_text())
    Config.from_dict(values["config"])

    def known(node: dict[str, Any], data: dict[str, Any], path: str) -> None:
        assert node["additionalProperties"] is False, path
        for key, value in data.items():
            assert key in node["properties"], f"{path}.{key}"
            if isinstance(value, dict) and "title" in node["properties"][key]:
                known(node["properties"][key], value, f"{path}.{key}")

    known(schema, values["config"], "config")
