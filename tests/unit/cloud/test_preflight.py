"""cloud_findings: project-level aws checks as findings, then pcluster's schema and pure validators and our rules on
the generated config, one finding per problem, named by project-file field."""

from __future__ import annotations

import time

import pytest
import yaml

from clustertrain.cloud.preflight import cloud_findings, cloud_report
from clustertrain.cloud.preflight import validate_file
from clustertrain.project import validate_project
from clustertrain.resolve import load_project
from tests.unit.cloud.conftest import DEPLOYED_FSX, EXAMPLES, example_raw, scenario_raw

pytest.importorskip("pcluster.schemas.cluster_schema", reason="aws-parallelcluster not installed (pip install 'clustertrain[aws]')")


def _project(edit=None, raw_factory=scenario_raw):
    raw = raw_factory()
    if edit:
        edit(raw)
    return validate_project(raw, source="test")


def _q(**kw):
    return lambda r: r["aws"]["queues"][0].update(kw)


def _at(findings, path, level=None):
    return [f for f in findings if f.path == path and (level is None or f.level == level)]


def test_the_example_has_no_cloud_errors_only_its_documented_warnings():
    found = cloud_findings(_project(raw_factory=example_raw))
    assert [str(f) for f in found if f.level == "error"] == []
    doc_ids = {f.path for f in found if "AWS documentation" in f.message}
    assert doc_ids == {"aws.network.public_subnet_id", "aws.network.private_subnet_id", "aws.network.head_security_group_id",
                       "aws.network.compute_security_group_id", "aws.queues[0].capacity_reservation_id", "aws.storage_policy_arn"}
    assert all("allowed by aws.example_ids" in f.message for f in found if "AWS documentation" in f.message)


def test_documentation_ids_are_errors_without_example_ids():
    def real_fsx_but_doc_ids(r):
        r["aws"]["example_ids"] = False
        for f in r["aws"]["fsx"]:
            f["file_system_id"] = DEPLOYED_FSX[f["name"]]

    found = cloud_findings(_project(real_fsx_but_doc_ids, raw_factory=example_raw))
    errors = {f.path for f in found if f.level == "error"}
    assert {"aws.network.public_subnet_id", "aws.queues[0].capacity_reservation_id", "aws.storage_policy_arn"} <= errors


def test_a_deployed_project_has_no_errors_and_no_placement_advice_against_the_odcr():
    found = cloud_findings(_project())
    assert [f for f in found if f.level == "error"] == []
    assert not [f for f in found if "placement group" in f.message], [str(f) for f in found]


def test_capacity_block_with_min_count_zero_is_pcluster_s_error():
    found = cloud_findings(_project(_q(capacity_type="CAPACITY_BLOCK", min_count=0)))
    hits = _at(found, "aws.queues[0].min_count", "error")
    messages = {f.message for f in hits}
    assert "Min count must be a value > 0 when using Capacity Block reservation" in messages
    assert "Max count must be set to the same value of min count when using Capacity Block reservation" in messages
    assert all(f.source == "aws-parallelcluster ComputeResourceSizeValidator" for f in hits)


def test_capacity_block_defaults_pass():
    found = cloud_findings(_project(_q(capacity_type="CAPACITY_BLOCK")))
    assert [f for f in found if f.level == "error"] == []


@pytest.mark.parametrize("capacity_type,text", [("ONDEMAND", "targeted capacity reservation"), ("CAPACITY_BLOCK", "Capacity Block")])
def test_a_placement_group_beside_reserved_capacity_is_a_warning(capacity_type, text):
    found = cloud_findings(_project(_q(capacity_type=capacity_type, placement_group=True)))
    [f] = _at(found, "aws.queues[0].placement_group")
    assert f.level == "warning" and text in f.message
    if capacity_type == "CAPACITY_BLOCK":  # pcluster's PlacementGroupCapacityTypeValidator said the same: merged, both named
        assert f.source == "clustertrain, aws-parallelcluster"


def test_efa_without_placement_group_warns_only_without_a_reservation():
    found = cloud_findings(_project(_q(capacity_reservation_id=None, placement_group=False)))
    assert [f.level for f in _at(found, "aws.queues[0].placement_group")] == ["warning"]


def test_user_mistakes_are_findings_never_exceptions():
    found = cloud_findings(_project(lambda r: (r["aws"]["queues"][0].update(instance_type="p5e.48xlarg"),
                                               r["aws"]["network"].pop("private_subnet_id"))))
    assert {(f.path, f.level) for f in found} >= {("aws.queues[0].instance_type", "error"),
                                                   ("aws.network.private_subnet_id", "error")}


def test_no_aws_section_no_findings():
    project = load_project(EXAMPLES / "quickstart.yaml")
    assert project.aws is None and cloud_findings(project) == []


def test_fast_after_pcluster_is_loaded():
    project = _project()
    cloud_findings(project)  # pcluster's schema import is the slow part
    start = time.perf_counter()
    cloud_findings(project)
    assert time.perf_counter() - start < 1.0


def test_cluster_validate_reports_each_seed_problem_once():
    report = validate_file(EXAMPLES / "seed-003-cluster.yaml")
    keys = [(f.path, f.level) for f in report.findings]
    assert len(keys) == len(set(keys)), [str(f) for f in report.findings]
    [os_finding] = [f for f in report.findings if f.path == "Image.Os"]
    assert "alinux2" in os_finding.message and os_finding.source == "clustertrain, aws-parallelcluster"
    assert not [f for f in report.findings if f.path == "Scheduling.SlurmQueues"], "the top-level SlurmQueues finding covers it"


def test_cluster_validate_of_a_project_is_the_preflight(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(example_raw()))
    assert validate_file(path).findings == cloud_report(load_project(path)).findings


@pytest.mark.parametrize("name,taken", [
    ("checkpoint-jakarta", True), ("training-data-jakarta", True), ("checkpoints", True),
    ("p5e-80x7-checkpoints", False), ("checkpoints-482913650271", False), ("ckpt-7f3a9c2e1b", False),
])
def test_bucket_names_that_are_certainly_taken_are_warned(name, taken):
    from clustertrain.cloud.project_rules import bucket_name_problem

    assert (bucket_name_problem(name, "p5e-80x7") is not None) is taken
    found = cloud_findings(_project(lambda r: r["aws"]["buckets"].update(checkpoints=name)))
    assert [f.level for f in _at(found, "aws.buckets.checkpoints")] == (["warning"] if taken else [])
