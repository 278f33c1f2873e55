"""Shared fixtures for the cloud stage: the seed scenario as a project (7 models on 80 x p5e.48xlarge)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from clustertrain.project import Project, validate_project

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples"


def scenario_raw() -> dict:
    """examples/p5e-80x7.yaml: the seed scenario (planner inputs and the `aws:` section) as a raw mapping."""
    return yaml.safe_load((EXAMPLES / "p5e-80x7.yaml").read_text())


@pytest.fixture
def scenario() -> Project:
    return validate_project(scenario_raw(), source="p5e-80x7")


@pytest.fixture
def make_project():
    """Build a project from the scenario with a function applied to its raw dict."""
    def build(edit=None) -> Project:
        raw = scenario_raw()
        if edit:
            edit(raw)
        return validate_project(raw, source="test")
    return build
