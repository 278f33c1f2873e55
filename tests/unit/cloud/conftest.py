"""Shared fixtures for the cloud stage: the seed scenario as a project (7 models on 80 x p5e.48xlarge).

``example_raw()`` is examples/p5e-80x7.yaml as shipped (documentation-style ids, ``aws.example_ids: true``);
``scenario_raw()`` is the same project once deployed: the ids are replaced by ones that look like real AWS ids
(random hex), as a user copies them from `clustertrain cluster infra`'s outputs (the file systems' ids too: the
template of a project that names them creates none, see tests/unit/cloud/test_changeset.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from clustertrain.project import Project, validate_project

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples"

#: what a deployed project has where the example has documentation ids
DEPLOYED_IDS = {
    "public_subnet_id": "subnet-0a7c3e91d54b2f860",
    "private_subnet_id": "subnet-06d2b8f4a1c9e7351",
    "head_security_group_id": "sg-0e5a19c7b3d48f260",
    "compute_security_group_id": "sg-03b7d1f9e5a2c6480",
}
DEPLOYED_CR = "cr-05e8a2c6f1b9d7340"
#: the file systems the stack created (outputs FsxDataId, FsxCheckpointsId, FsxLogsId), by aws.fsx name
DEPLOYED_FSX = {"fsx-data": "fs-0c4f2a9e7b1d35680", "fsx-checkpoints": "fs-07b3e9d1c5a2f4860",
                "fsx-logs": "fs-0e1a6c8f3b9d27540"}
DEPLOYED_POLICY = "arn:aws:iam::482913650271:policy/p5e-80x7-infra-StoragePolicy-1Q2W3E4R5T6Y"


def example_raw() -> dict:
    """examples/p5e-80x7.yaml as a raw mapping, with the aws: changes this stage asks of it (no-ops once it has them)."""
    raw = yaml.safe_load((EXAMPLES / "p5e-80x7.yaml").read_text())
    aws = raw["aws"]
    aws.setdefault("storage_policy_arn", "arn:aws:iam::123456789012:policy/p5e-80x7-storage")
    aws.setdefault("example_ids", True)
    for q in aws["queues"]:
        if q.get("capacity_reservation_id"):
            q.pop("min_count", None)        # derived: static nodes on reserved capacity
            q.pop("placement_group", None)  # derived: none beside a targeted ODCR
    return raw


def scenario_raw() -> dict:
    """The example once deployed: real-looking ids, no example_ids."""
    raw = example_raw()
    aws = raw["aws"]
    aws["network"].update(DEPLOYED_IDS)
    aws["buckets"] = {"data": "training-data-jakarta", "checkpoints": "checkpoint-jakarta"}  # tests name them; fixed here
    aws["storage_policy_arn"] = DEPLOYED_POLICY
    aws["example_ids"] = False
    for f in aws["fsx"]:
        f["file_system_id"] = DEPLOYED_FSX[f["name"]]
    for q in aws["queues"]:
        if q.get("capacity_reservation_id"):
            q["capacity_reservation_id"] = DEPLOYED_CR
    return raw


@pytest.fixture
def scenario() -> Project:
    return validate_project(scenario_raw(), source="p5e-80x7")


@pytest.fixture
def make_project():
    """Build a project from the (deployed) scenario with a function applied to its raw dict."""
    def build(edit=None) -> Project:
        raw = scenario_raw()
        if edit:
            edit(raw)
        return validate_project(raw, source="test")
    return build
