"""The project file's `aws:` section: bad input gets one clear message naming the field."""

from __future__ import annotations

import pytest

from clustertrain.cloud import build_cluster_config
from clustertrain.cloud.config import AwsConfig, fsx_capacity_problem, fsx_throughput_problem
from clustertrain.core.errors import ConfigError


def _q(raw, **kw):
    raw["aws"]["queues"][0].update(kw)


def _fsx(raw, i=0, **kw):
    """Edit file system ``i`` as one the stack creates (its settings count only without a file_system_id)."""
    raw["aws"]["fsx"][i].pop("file_system_id", None)
    raw["aws"]["fsx"][i].update(kw)


# (id, edit of the raw project, text the ConfigError must contain)
BAD = [
    ("negative-min", lambda r: _q(r, min_count=-1), "aws.queues[0].min_count"),
    ("zero-max", lambda r: _q(r, max_count=0), "aws.queues[0].max_count"),
    ("min-gt-max", lambda r: _q(r, min_count=81), "min_count (81) exceeds max_count (80)"),
    ("spot-odcr", lambda r: _q(r, capacity_type="SPOT"), "cannot be used with capacity_type SPOT"),
    ("bad-cr", lambda r: _q(r, capacity_reservation_id="cr-xxxxxxxxxxxxx"), "capacity_reservation_id 'cr-xxxxxxxxxxxxx' must look like"),
    ("queue-name", lambda r: _q(r, name="GPU_queue"), "queue name 'GPU_queue'"),
    ("fsx-capacity", lambda r: _fsx(r, capacity_gb=3000), "capacity_gb 3000 is not valid for PERSISTENT_2"),
    ("fsx-capacity-nearest", lambda r: _fsx(r, capacity_gb=3000), "nearest: 4800"),
    ("fsx-throughput", lambda r: _fsx(r, throughput=200), "throughput 200 is not valid for PERSISTENT_2"),
    ("fsx-persistent", lambda r: _fsx(r, deployment_type="PERSISTENT"), "aws.fsx[0].deployment_type"),
    ("fsx-scratch-throughput", lambda r: _fsx(r, deployment_type="SCRATCH_2"), "remove it"),
    ("dup-mount", lambda r: _fsx(r, 1, mount_dir="/fsx/data"), "mount dir '/fsx/data' is used by two file systems"),
    ("reserved-mount", lambda r: _fsx(r, mount_dir="/home"), "system directory"),
    ("relative-mount", lambda r: _fsx(r, mount_dir="fsx/data"), "absolute path"),
    ("az-region", lambda r: r["aws"].update(availability_zone="us-east-1a"), "not in region ap-southeast-3"),
    ("os-alinux2", lambda r: r["aws"].update(os="alinux2"), "aws.os"),
    ("ssh-cidr", lambda r: r["aws"]["network"].update(ssh_cidr="10.0.0.1/24"), "host bits zero"),
    ("bad-subnet", lambda r: r["aws"]["network"].update(public_subnet_id="subnet-xxxxxxxxx"), "not a subnet id"),
    ("bucket-uri", lambda r: r["aws"]["buckets"].update(data="s3://training-data-jakarta"), "a name, not s3://"),
    ("unknown-key", lambda r: r["aws"].update(Os="alinux2023"), "unknown key"),
    ("reserved-tag", lambda r: r["aws"]["tags"].update({"aws:owner": "x"}), "reserved prefix"),
    ("retention", lambda r: r["aws"]["monitoring"].update(log_retention_days=10), "not a CloudWatch retention"),
]


@pytest.mark.parametrize("case_id,edit,text", BAD, ids=[b[0] for b in BAD])
def test_bad_aws_section_is_one_clear_line(make_project, case_id, edit, text):
    with pytest.raises(ConfigError) as err:
        make_project(edit)
    msg = str(err.value)
    assert text in msg, msg
    assert "\n" not in msg


# Checks that need the catalog or several sections run when the config is built.
BUILD_BAD = [
    ("unknown-instance", lambda r: _q(r, instance_type="p5e.48xlarg"), "aws.queues[0].instance_type: unknown instance type 'p5e.48xlarg'"),
    ("efa-on-cpu", lambda r: (_q(r, instance_type="c6i.4xlarge", efa=True, capacity_reservation_id=None),
                              r["cluster"].update(instance_type="c6i.4xlarge")), "does not support EFA"),
    ("gpu-checks-cpu", lambda r: (_q(r, instance_type="c6i.4xlarge", gpu_health_checks=True),
                                  r["cluster"].update(instance_type="c6i.4xlarge")), "has no NVIDIA GPU"),
    ("missing-public-subnet", lambda r: r["aws"]["network"].pop("public_subnet_id"), "aws.network.public_subnet_id: the head node subnet is missing"),
    ("missing-private-subnet", lambda r: r["aws"]["network"].pop("private_subnet_id"), "aws.network.private_subnet_id: the compute/FSx subnet"),
    ("missing-key-pair", lambda r: r["aws"]["head_node"].pop("key_name"), "aws.head_node.key_name: no EC2 key pair"),
    ("missing-storage-policy", lambda r: r["aws"].pop("storage_policy_arn"), "aws.storage_policy_arn: no IAM policy gives the nodes S3 access"),
    ("partition", lambda r: _q(r, name="other"), "cluster.partition"),
    ("unknown-region", lambda r: r["aws"].update(region="xx-nowhere-1", availability_zone=None), "not an AWS region known"),
]


@pytest.mark.parametrize("case_id,edit,text", BUILD_BAD, ids=[b[0] for b in BUILD_BAD])
def test_build_rejects_with_field_and_fix(make_project, case_id, edit, text):
    project = make_project(edit)
    with pytest.raises(ConfigError) as err:
        build_cluster_config(project)
    assert text in str(err.value), str(err.value)


def _queue(r, **kw):
    r["aws"]["queues"][0].update(kw)


@pytest.mark.parametrize("edit,min_count,placement,drain", [
    (None, 80, False, True),                                                                   # targeted ODCR (the scenario)
    (lambda r: _queue(r, capacity_type="CAPACITY_BLOCK"), 80, False, True),                    # Capacity Block
    (lambda r: _queue(r, capacity_reservation_id=None), 0, True, False),                        # plain on-demand
    (lambda r: _queue(r, min_count=10, placement_group=True), 10, True, True),                 # explicit values win
], ids=["odcr", "capacity-block", "on-demand", "explicit"])
def test_reserved_capacity_defaults_to_static_nodes_no_placement_group_and_drain(make_project, edit, min_count, placement, drain):
    config = build_cluster_config(make_project(edit))
    q = config["Scheduling"]["SlurmQueues"][0]
    assert q["ComputeResources"][0]["MinCount"] == min_count
    assert q["ComputeResources"][0]["MaxCount"] == 80
    assert q["Networking"]["PlacementGroup"] == {"Enabled": placement}
    assert (config["Scheduling"]["SlurmSettings"].get("QueueUpdateStrategy") == "DRAIN") is drain


def test_nodes_get_our_policy_and_never_s3access(scenario):
    from tests.unit.cloud.conftest import DEPLOYED_POLICY

    config = build_cluster_config(scenario)
    head, queue = config["HeadNode"]["Iam"], config["Scheduling"]["SlurmQueues"][0]["Iam"]
    assert "S3Access" not in head and "S3Access" not in queue
    assert queue["AdditionalIamPolicies"] == [{"Policy": DEPLOYED_POLICY}]
    assert head["AdditionalIamPolicies"] == [{"Policy": DEPLOYED_POLICY},
                                             {"Policy": "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"}]


def test_fsx_rules_match_the_documented_steps():
    assert fsx_capacity_problem("PERSISTENT_2", 1200) is None
    assert fsx_capacity_problem("PERSISTENT_2", 2400) is None
    assert fsx_capacity_problem("PERSISTENT_2", 7200) is None
    assert fsx_capacity_problem("PERSISTENT_2", 4800) is None
    assert "nearest: 2400" in fsx_capacity_problem("PERSISTENT_2", 1800)
    assert fsx_capacity_problem("SCRATCH_1", 3600) is None and fsx_capacity_problem("SCRATCH_1", 4800)
    assert fsx_capacity_problem("PERSISTENT_1", 6000, 12) is None and fsx_capacity_problem("PERSISTENT_1", 2400, 12)
    assert fsx_throughput_problem("PERSISTENT_2", 1000) is None
    assert fsx_throughput_problem("PERSISTENT_2", 200)
    assert fsx_throughput_problem("PERSISTENT_1", 200) is None
    assert fsx_throughput_problem("SCRATCH_2", None) is None and fsx_throughput_problem("SCRATCH_2", 125)


def test_layout_sends_unnamed_kinds_to_the_first_file_system():
    aws = AwsConfig.model_validate({
        "region": "us-east-1", "queues": [{"name": "gpu", "instance_type": "p5.48xlarge", "max_count": 2}],
        "fsx": [{"name": "a", "mount_dir": "/fsx/a"}, {"name": "b", "mount_dir": "/fsx/b", "holds": ["logs"]}],
    })
    assert aws.layout() == {"datasets": "/fsx/a", "checkpoints": "/fsx/a", "outputs": "/fsx/a", "logs": "/fsx/b", "tensorboard": "/fsx/a"}
    assert aws.fsx[0].effective_throughput == 250


def test_cloud_config_imports_only_leaves_and_the_stage_does_not_import_project_at_import_time():
    import subprocess
    import sys

    code = ("import sys, clustertrain.cloud.config as c, clustertrain.cloud; "
            "mods = [m for m in sys.modules if m.startswith('clustertrain.')]; "
            "print(','.join(sorted(mods)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip().split(",")
    assert "clustertrain.project" not in out
    assert not [m for m in out if m.split(".")[1] in ("plan", "launch", "train", "storage", "data", "validate", "cli")]
    import clustertrain.cloud.config as config
    import clustertrain.cloud.limits as limits

    def imported(module) -> list[str]:
        src = __import__("pathlib").Path(module.__file__).read_text()
        return [line.split()[1] for line in src.splitlines() if line.startswith(("from clustertrain", "import clustertrain"))]

    assert imported(config) == ["clustertrain.cloud.limits", "clustertrain.core.schema"]  # the strict base and the AWS facts
    assert imported(limits) == []
