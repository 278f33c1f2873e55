"""The shared loader: one line naming file:line for YAML and validation mistakes; stored models lenient."""

from __future__ import annotations

import pytest

from clustertrain.core.errors import ConfigError, DataError
from clustertrain.core.schema import StoredModel, StrictModel, load_yaml_model


class Inner(StrictModel):
    size: int


class Outer(StrictModel):
    name: str
    items: list[Inner] = []


class Written(StoredModel):
    version: str


def test_unknown_key_names_its_line_and_the_valid_keys(tmp_path):
    p = tmp_path / "f.yaml"
    p.write_text("name: a\nitems:\n  - size: 1\n  - size: 2\n    colour: red\n")
    with pytest.raises(ConfigError) as e:
        load_yaml_model(p, Outer)
    assert str(e.value) == f"{p}:5: items[1].colour: unknown key; valid keys here: size"


def test_wrong_type_names_its_line(tmp_path):
    p = tmp_path / "f.yaml"
    p.write_text("name: a\nitems:\n  - size: big\n")
    with pytest.raises(DataError, match=rf"^{p}:3: items\[0\].size: .*integer.*\(got 'big'\)$"):
        load_yaml_model(p, Outer, error=DataError)


def test_syntax_error_and_missing_file(tmp_path):
    p = tmp_path / "f.yaml"
    p.write_text("name: [a\n")
    with pytest.raises(ConfigError, match=r":2:1: YAML syntax error"):
        load_yaml_model(p, Outer)
    with pytest.raises(ConfigError, match="file not found"):
        load_yaml_model(tmp_path / "none.yaml", Outer)


def test_stored_models_ignore_fields_a_newer_version_added(tmp_path):
    p = tmp_path / "run.json"
    p.write_text('{"version": "9.9", "added_later": {"x": 1}}')
    assert load_yaml_model(p, Written).version == "9.9"
    with pytest.raises(ConfigError, match="unknown key"):
        load_yaml_model(p, type("StrictWritten", (StrictModel,), {"__annotations__": {"version": str}}))
