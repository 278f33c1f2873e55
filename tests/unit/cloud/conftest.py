"""Shared fixtures for the cloud stage: the seed scenario as a project (7 models on 80 x p5e.48xlarge)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from clustertrain.project import Project, validate_project

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples"


def scenario_raw() -> dict:
    """examples/p5e-80x7.yaml (the planner's) with our aws fragment merged; a stand-in project when it is absent."""
    aws = yaml.safe_load((EXAMPLES / "p5e-80x7.aws.yaml").read_text())["aws"]
    planner = EXAMPLES / "p5e-80x7.yaml"
    if planner.is_file():
        raw = yaml.safe_load(planner.read_text())
    else:
        models = []
        for i in range(1, 8):
            models.append({
                "name": f"model{i}",
                "model": {"layers": 24, "hidden": 2048, "heads": 16, "seq_len": 2048},
                "training": {"max_steps": 1000, "micro_batch": 1, "global_batch": 88},
                "plan": {"nodes": 14 if i == 7 else 11},
            })
        raw = {"name": "p5e-80x7", "cluster": {"backend": "slurm", "nodes": 11, "gpus_per_node": 8,
                                                 "instance_type": "p5e.48xlarge", "partition": "gpu"},
               "storage": {"root": "/fsx/checkpoints", "data_bucket": "s3://training-data-jakarta/datasets",
                           "checkpoint_bucket": "s3://checkpoint-jakarta/checkpoints"},
               "models": models}
    raw["aws"] = copy.deepcopy(aws)
    return raw


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
