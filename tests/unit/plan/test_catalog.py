"""The one instance catalog (clustertrain/plan/instances.yaml): it validates, its facts agree with each
other, every stage reads a view of it, and no other file in clustertrain/ carries its own copy."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

from clustertrain.cloud.catalog import load_catalog as cloud_catalog
from clustertrain.cloud.project_rules import project_findings
from clustertrain.cloud.rules import check_cluster_config
from clustertrain.core.errors import ConfigError
from clustertrain.plan.catalog import CATALOG_PATH, INSTANCE_TYPE_RE, load_catalog, read_catalog
from clustertrain.resolve import load_project
from clustertrain.train.metrics import peak_flops_for

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "clustertrain"
P5E = ROOT / "examples" / "p5e-80x7.yaml"
#: keys that name an instance or GPU fact; only the catalog may hold them in a data file
FACT_KEYS = {"gpus", "gpu", "gpu_model", "gpu_name", "gpu_memory_gib", "memory_gib", "vcpus", "efa", "efa_devices",
             "efa_adapters", "efa_interfaces", "nvme_gb", "nvme_tb", "network_gbps", "nvlink_gbps", "peak_bf16_tflops"}


# --- no stage carries its own copy ------------------------------------------------------------------------


def _mappings(node):
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _mappings(value)
    elif isinstance(node, list):
        for value in node:
            yield from _mappings(value)


def yaml_copies(package: Path, catalog_path: Path) -> list[str]:
    """Data files other than the catalog that key a mapping by instance type or hold an instance fact (a fact
    key with a number, a flag or a GPU name: `gpu: required` in a table of checks is not one)."""
    catalog = read_catalog()
    gpu_names = set(catalog.gpus) | {n for g in catalog.gpus.values() for n in g.names}
    found = []
    for path in sorted(package.rglob("*.yaml")):
        if path.resolve() == catalog_path.resolve():
            continue
        for mapping in _mappings(yaml.safe_load(path.read_text(encoding="utf-8"))):
            keys = {k for k in mapping if isinstance(k, str)}
            types = sorted(k for k in keys if INSTANCE_TYPE_RE.match(k) or k in catalog.instances)
            facts = sorted(k for k in keys & FACT_KEYS
                           if isinstance(mapping[k], (int, float)) or (isinstance(mapping[k], str) and mapping[k] in gpu_names))
            if types or facts:
                found.append(f"{path.relative_to(package)}: {', '.join(types + facts)}")
    return found


def python_copies(package: Path, catalog_module: Path) -> list[str]:
    """Python dict literals outside the catalog module that map an instance type or a GPU name to a number."""
    catalog = read_catalog()
    names = set(catalog.instances) | {n.upper() for g in catalog.gpus.values() for n in g.names}
    found = []
    for path in sorted(package.rglob("*.py")):
        if path.resolve() == catalog_module.resolve():
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Dict):
                continue
            for key, value in zip(node.keys, node.values):
                named = isinstance(key, ast.Constant) and isinstance(key.value, str) and (
                    INSTANCE_TYPE_RE.match(key.value) or key.value.upper() in names)
                if named and isinstance(value, ast.Constant) and isinstance(value.value, (int, float)):
                    found.append(f"{path.relative_to(package)}:{node.lineno}: {key.value!r}: {value.value!r}")
    return found


def test_no_stage_carries_its_own_copy_of_instance_facts():
    """Instance facts lived in five files and disagreed (g6e.48xlarge NVMe, g6e.12xlarge as a queue type)."""
    assert yaml_copies(PACKAGE, CATALOG_PATH) == [], "move instance facts to clustertrain/plan/instances.yaml"
    assert python_copies(PACKAGE, PACKAGE / "plan" / "catalog.py") == [], "read facts from clustertrain.plan.catalog"


def test_the_copy_detectors_see_the_shapes_they_must(tmp_path):
    """The detectors on the shapes the old tree had: a table keyed by instance type (cloud/instances.yaml),
    facts keyed by family (validate/requirements.yaml, launch/nccl_presets.yaml), a TFLOPS dict (train/metrics.py)."""
    (tmp_path / "a.yaml").write_text("instances:\n  g6e.48xlarge: {nvme: 7600}\n")
    (tmp_path / "b.yaml").write_text("families:\n  p5: {gpus: 8}\n  p4d: {efa: true}\n  p5e: {gpu_name: H200}\n")
    (tmp_path / "ok.yaml").write_text("instance_types:\n  p5: {note: x, collectives: {}}\nroles: {compute: {gpu: required, efa: absent}}\n")
    (tmp_path / "m.py").write_text('PEAK = {"H100": 989.0, "L40S": 362.0}\nOK = {"name": 1}\n')
    assert yaml_copies(tmp_path, CATALOG_PATH) == ["a.yaml: g6e.48xlarge", "b.yaml: gpus", "b.yaml: efa", "b.yaml: gpu_name"]
    assert python_copies(tmp_path, CATALOG_PATH) == ["m.py:1: 'H100': 989.0", "m.py:1: 'L40S': 362.0"]


# --- the catalog itself ------------------------------------------------------------------------------------


def test_catalog_validates_and_every_fact_names_a_source():
    cat = read_catalog()
    assert len(cat.instances) >= 20 and "unverified" in cat.sources
    for name, inst in cat.instances.items():
        for key in (inst.source, inst.network.source, inst.nvme_source):
            assert key is None or key in cat.sources, name
        assert inst.price is None or (inst.price.source and inst.price.region and inst.price.date), name
    for name, gpu in cat.gpus.items():
        assert gpu.source in cat.sources and (gpu.memory_gib is None or gpu.memory_source in cat.sources), name


def test_every_instance_is_internally_consistent():
    cat = read_catalog()
    for name, inst in cat.instances.items():
        gpu = cat.gpu_of(name)
        assert (gpu is None) == (inst.gpus == 0), name
        assert 0.5 <= inst.memory_gib / inst.vcpus <= 16, f"{name}: host memory per vCPU out of any EC2 range"
        if inst.nccl_preset:
            assert inst.efa and inst.gpus > 0, f"{name}: an NCCL/EFA preset needs EFA and GPUs"
        if gpu is not None and gpu.memory_gib is not None:
            nominal = float(re.search(r"(\d+)GB", next(k for k, g in cat.gpus.items() if g is gpu)).group(1))
            assert 0.9 * nominal <= gpu.memory_gib <= nominal, f"{name}: usable GPU memory vs the nominal size"
        if gpu is not None and gpu.nvlink_gbps:
            assert inst.gpus >= 2, name


def test_g6e_facts_fixed_in_one_place():
    """g6e.48xlarge: 4 x 1900 GB = 7,600 GB of NVMe (the old plan catalog said 15.2 TB without a source; see
    the catalog's g6e-nvme source). Both views read the same figure now."""
    cat = read_catalog()
    assert cat.instances["g6e.48xlarge"].nvme_gb == 7600 and cat.instances["g6e.48xlarge"].nvme_source == "g6e-nvme"
    assert load_catalog()["g6e.48xlarge"].nvme_tb == 7.6 and cloud_catalog().get("g6e.48xlarge").nvme_gb == 7600


def test_plan_and_cloud_views_agree():
    plan, cloud = load_catalog(), cloud_catalog()
    assert set(plan) < set(cloud.instances)  # the planner offers the GPU types with a bf16 peak; cloud knows all
    for name, inst in plan.items():
        facts = cloud.get(name)
        assert (inst.gpus, inst.vcpus, inst.memory_gib, round(inst.nvme_tb * 1000)) == (
            facts.gpus, facts.vcpus, facts.memory_gib, facts.nvme_gb), name
        assert (inst.efa_adapters > 0) == facts.efa, name


def _queue_config(itype: str) -> dict:
    return {"Region": "us-east-1", "Image": {"Os": "alinux2023"},
            "HeadNode": {"InstanceType": "c6i.4xlarge", "Networking": {"SubnetId": "subnet-0a7c3e91d54b2f860"},
                         "Ssh": {"KeyName": "k"}},
            "Scheduling": {"Scheduler": "slurm", "SlurmQueues": [{
                "Name": "gpu", "Networking": {"SubnetIds": ["subnet-06d2b8f4a1c9e7351"]},
                "ComputeResources": [{"Name": "gpu", "InstanceType": itype, "MinCount": 0, "MaxCount": 2}]}]}}


@pytest.mark.parametrize("itype", sorted(load_catalog()))
def test_every_type_the_planner_offers_is_accepted_as_a_queue_type(itype):
    """g6e.12xlarge was plannable but rejected for queues (it was missing from cloud/instances.yaml)."""
    project = load_project(P5E, [f"cluster.instance_type={itype}", f"aws.queues.gpu-queue.instance_type={itype}"])
    assert [str(f) for f in project_findings(project) if f.path.endswith("instance_type")] == []
    findings = check_cluster_config(_queue_config(itype))
    assert not [str(f) for f in findings if f.path.endswith("InstanceType")]


def test_a_type_outside_the_catalog_is_refused_by_both_views():
    findings = check_cluster_config(_queue_config("p9.huge"))
    assert any("unknown instance type 'p9.huge'" in f.message and "plan/instances.yaml" in f.fix for f in findings)
    with pytest.raises(ConfigError, match="'p9.huge' is not in the instance catalog"):
        from clustertrain.plan.catalog import find_instance

        find_instance(load_catalog(), "p9.huge")


@pytest.mark.parametrize("edit,message", [
    (lambda d: d["instances"]["p5.48xlarge"].update(gpu="H999"), r"instances.p5.48xlarge.gpu: 'H999' is not in gpus"),
    (lambda d: d["instances"]["p5.48xlarge"].update(source="aws"), r"instances.p5.48xlarge.source: source 'aws' is not in sources"),
    (lambda d: d["instances"]["g5.12xlarge"].update(nccl_preset="p5", network={"efa_interfaces": 0, "source": "ec2-efa"}),
     r"instances.g5.12xlarge.nccl_preset: the NCCL/EFA presets are for EFA instances"),
    (lambda d: d["instances"]["t3.micro"].update(gpus=1), r"instances.t3.micro: gpu and gpus disagree"),
    (lambda d: d["instances"]["p5.48xlarge"].update(nvme=30720), r":\d+: instances.p5.48xlarge.nvme: unknown key"),
])
def test_a_mistake_in_the_catalog_is_one_line_naming_the_key(tmp_path, edit, message):
    data = yaml.safe_load(CATALOG_PATH.read_text())
    edit(data)
    path = tmp_path / "instances.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(ConfigError, match=message) as err:
        read_catalog(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)


# --- the trainer's view: the GPU's peak for MFU ------------------------------------------------------------


@pytest.mark.parametrize("device,peak", [("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H200", 989e12),
                                         ("NVIDIA A100-SXM4-40GB", 312e12), ("NVIDIA L40S", 362e12), ("NVIDIA L4", 121e12),
                                         ("NVIDIA A10G", 70e12), ("Tesla V100-SXM2-16GB", None), ("Some CPU", None), (None, None)])
def test_peak_flops_come_from_the_catalog_longest_name_first(device, peak):
    assert peak_flops_for(device) == peak
