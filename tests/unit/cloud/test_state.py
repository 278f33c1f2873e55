"""The infrastructure state file beside the project: written atomically, read leniently, and how the project reads the
deployed ids from it instead of hand-copied ones (the state here is written by the test in the documented format; the
integration test tests/integration/cloud/test_infra_deploy.py writes it through a real deploy on moto's server)."""

from __future__ import annotations

import json

import pytest
import yaml

from clustertrain.check import run_check
from clustertrain.cloud.state import InfraState, fsx_logical_id, fsx_output, read_state, state_path, write_state
from clustertrain.core.errors import ConfigError
from clustertrain.resolve import load_project
from tests.unit.cloud.conftest import DEPLOYED_FSX, DEPLOYED_IDS, DEPLOYED_POLICY, scenario_raw

OUTPUTS = {"VpcId": "vpc-0b1c2d3e4f5a6b7c8", "PublicSubnetId": DEPLOYED_IDS["public_subnet_id"],
           "PrivateSubnetId": DEPLOYED_IDS["private_subnet_id"], "HeadNodeSecurityGroupId": DEPLOYED_IDS["head_security_group_id"],
           "ComputeSecurityGroupId": DEPLOYED_IDS["compute_security_group_id"], "StoragePolicyArn": DEPLOYED_POLICY,
           "DataBucketName": "training-data-jakarta", "CheckpointBucketName": "checkpoint-jakarta",
           "FsxDataId": DEPLOYED_FSX["fsx-data"], "FsxCheckpointsId": DEPLOYED_FSX["fsx-checkpoints"],
           "FsxLogsId": DEPLOYED_FSX["fsx-logs"]}
STACK_FIELDS = ["public_subnet_id", "private_subnet_id", "head_security_group_id", "compute_security_group_id"]


def state(region="ap-southeast-3", **outputs) -> InfraState:
    return InfraState(stack_name="p5e-80x7-infra", stack_id="arn:aws:cloudformation:ap-southeast-3:482913650271:stack/p5e-80x7-infra/1",
                      region=region, status="CREATE_COMPLETE", outputs={**OUTPUTS, **outputs}, project="p5e-80x7")


def project_file(tmp_path, keep_ids=False):
    raw = scenario_raw()
    if not keep_ids:
        for k in STACK_FIELDS:
            raw["aws"]["network"].pop(k)
        raw["aws"].pop("storage_policy_arn")
        for f in raw["aws"]["fsx"]:
            f.pop("file_system_id")  # the stack creates them
    path = tmp_path / "p5e-80x7.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_state_round_trips_and_lives_beside_the_project(tmp_path):
    path = state_path(tmp_path / "p5e-80x7.yaml")
    assert path == tmp_path / "p5e-80x7.infra.json"
    write_state(path, state())
    back = read_state(path)
    assert back == state() and back.version == 1
    raw = json.loads(path.read_text())
    raw["a_newer_field"] = 1  # stored state is read leniently
    path.write_text(json.dumps(raw))
    assert read_state(path).outputs == OUTPUTS


@pytest.mark.parametrize("text, words", [("{not json", "not a readable infra state"),
                                         ('{"stack_name": "x"}', "not an infra state written by"),
                                         (json.dumps({**json.loads(state().to_json()), "version": 99}), "newer than this clustertrain")])
def test_a_damaged_state_is_one_line(tmp_path, text, words):
    path = tmp_path / "p.infra.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=words) as e:
        read_state(path)
    assert "\n" not in str(e.value) and str(path) in str(e.value)


def test_missing_ids_are_read_from_the_deployed_stack(tmp_path):
    path = project_file(tmp_path)
    bare = load_project(path)
    assert bare.aws.network.public_subnet_id is None and bare.infra_state is None
    errors = {f.path: f for _, f in run_check(bare, only=["cluster"]).errors}
    assert "infra deploy" in errors["aws.network.public_subnet_id"].fix and str(path) in errors["aws.network.public_subnet_id"].fix
    assert "StoragePolicyArn" in errors["aws.storage_policy_arn"].fix
    write_state(state_path(path), state())
    project = load_project(path)
    assert project.aws.network.public_subnet_id == DEPLOYED_IDS["public_subnet_id"]
    assert project.aws.storage_policy_arn == DEPLOYED_POLICY
    assert set(project.filled_from_state) == {f"aws.network.{k}" for k in STACK_FIELDS} | {"aws.storage_policy_arn"}
    assert not [f for _, f in run_check(project, only=["cluster"]).errors]


def test_file_systems_the_stack_creates_are_mounted_by_the_ids_it_recorded(tmp_path):
    from clustertrain.cloud.infra import build_infra_template
    from clustertrain.cloud.pcluster import build_cluster_config

    assert [fsx_logical_id(n) for n in ("fsx-data", "data", "scratch_2", "FSX-a-b")] == ["FsxData", "FsxData", "FsxScratch2", "FsxAB"]
    assert fsx_output("fsx-checkpoints") == "FsxCheckpointsId"
    path = project_file(tmp_path)
    errors = {f.path: f for _, f in run_check(load_project(path), only=["cluster"]).errors}
    assert errors["aws.fsx[1].file_system_id"].message == ("fsx-checkpoints (/fsx/checkpoints) is created by the "
                                                          "infrastructure stack, which has not created it yet")
    assert "FsxCheckpointsId output" in errors["aws.fsx[1].file_system_id"].fix
    write_state(state_path(path), state())
    project = load_project(path)
    mounted = {s["Name"]: s["FsxLustreSettings"] for s in build_cluster_config(project)["SharedStorage"]}
    assert mounted == {name: {"FileSystemId": fs_id} for name, fs_id in DEPLOYED_FSX.items()}  # none new: pcluster allows 1
    assert [f.file_system_id for f in project.aws.fsx] == [None, None, None]  # the file's entries are left as written,
    resources = build_infra_template(project)["Resources"]  # so the stack keeps them
    assert [k for k, r in resources.items() if r["Type"] == "AWS::FSx::FileSystem"] == ["FsxData", "FsxCheckpoints", "FsxLogs"]
    assert resources["FsxLogs"]["Properties"]["StorageCapacity"] == 4800 and resources["FsxLogs"]["DeletionPolicy"] == "RetainExceptOnCreate"
    assert {"DataBucket", "CheckpointBucket", "StoragePolicy"} <= set(resources["FsxLogs"]["DependsOn"])  # made last
    write_state(state_path(path), state(region="us-east-1"))  # another region's stack fills nothing
    assert "aws.fsx[0].file_system_id" in {f.path for _, f in run_check(load_project(path), only=["cluster"]).errors}


def test_two_file_system_names_that_make_one_logical_id_are_one_line(tmp_path):
    from clustertrain.cloud.infra import build_infra_template
    from clustertrain.project import validate_project

    raw = scenario_raw()
    raw["aws"]["fsx"] = [{"name": "fsx-data", "mount_dir": "/fsx/a"}, {"name": "data", "mount_dir": "/fsx/b"}]
    with pytest.raises(ConfigError, match="the names 'fsx-data' and 'data' both make the template's logical id FsxData"):
        build_infra_template(validate_project(raw, source="t"))


def test_an_id_the_file_sets_is_kept_and_a_different_one_is_an_error(tmp_path):
    path = project_file(tmp_path, keep_ids=True)
    write_state(state_path(path), state(PrivateSubnetId="subnet-0ffffffffffffffff"))
    project = load_project(path)
    assert project.aws.network.private_subnet_id == DEPLOYED_IDS["private_subnet_id"] and project.filled_from_state == ()
    errors = [f for _, f in run_check(project, only=["cluster"]).errors]
    assert [f.path for f in errors] == ["aws.network.private_subnet_id"]
    assert "subnet-0ffffffffffffffff" in errors[0].message and "remove aws.network.private_subnet_id" in errors[0].fix


def test_a_stack_in_another_region_fills_nothing_and_is_an_error(tmp_path):
    path = project_file(tmp_path)
    write_state(state_path(path), state(region="us-east-1"))
    project = load_project(path)
    assert project.aws.network.public_subnet_id is None
    errors = {f.path: f for _, f in run_check(project, only=["cluster"]).errors}
    assert "us-east-1" in errors["aws.region"].message and "--set aws.region=us-east-1" in errors["aws.region"].fix
