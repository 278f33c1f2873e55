"""Scans run for real on this machine (CPU-only, no EFA) and must say so honestly."""

from __future__ import annotations

import shutil

import pytest
import yaml

from clustertrain.validate import ValidateError, load_requirements, scan
from clustertrain.validate.probes import probe_efa, probe_gpus
from clustertrain.validate.requirements import (COMPONENTS, DEFAULT_REQUIREMENTS, Minimum, NodeExpectation, family_entry,
                                                minimums_for)


def by_name(report):
    return {c.name: c for c in report.checks}


def test_requirements_table_has_the_seed_minimums():
    req = load_requirements()
    m = req.minimums
    assert (m.cuda_driver, m.efa_installer, m.cuda, m.nccl, m.aws_ofi_nccl) == ("535.54.03", "1.26.1", "12.2", "2.18.5", "1.8.1")
    # GPU and EFA counts come from the instance catalog, not from the table
    assert family_entry(req, "p5.48xlarge") == ("p5.48xlarge", NodeExpectation(8, 32, "H100"))
    assert family_entry(req, "p5en.48xlarge") == ("p5en.48xlarge", NodeExpectation(8, 16, "H200"))
    assert family_entry(req, "p5.4xlarge") == ("unknown type", NodeExpectation(1, 1))  # not in the catalog: no guess
    assert req.roles["head"]["slurm"] == "required" and req.roles["head"]["gpu"] == "absent"
    assert set(req.sources) == set(COMPONENTS)  # every base minimum says where it comes from


def test_minimum_versions_per_instance_family_and_type(tmp_path):
    """Item 10d: aws-ofi-nccl recognises p5e from 1.11.0 and p5en from 1.13.0; the seeds' 1.8.1 predates both."""
    req = load_requirements()
    assert minimums_for(req, "p5e.48xlarge")["aws_ofi_nccl"].version == "1.11.0"
    assert "v1.11.0" in minimums_for(req, "p5e.48xlarge")["aws_ofi_nccl"].source
    assert minimums_for(req, "p5en.48xlarge")["aws_ofi_nccl"].version == "1.13.0"
    assert minimums_for(req, "p5.48xlarge")["aws_ofi_nccl"].version == "1.8.1"
    assert minimums_for(req, None)["nccl"].version == "2.18.5"
    table = tmp_path / "req.yaml"
    data = yaml.safe_load(DEFAULT_REQUIREMENTS.read_text())
    data["families"]["p5e.48xlarge"] = {"minimums": {"aws_ofi_nccl": "1.12.0", "nccl": "2.0"}, "sources": {"aws_ofi_nccl": "type rule"}}
    data["unknown_type"] = {"min_gpus": 4, "min_efa_devices": 2}
    table.write_text(yaml.safe_dump(data))
    custom = load_requirements(table)
    assert family_entry(custom, "p5e.48xlarge")[1].efa_devices == 32 and family_entry(custom, "p5e.4x") == (
        "unknown type", NodeExpectation(4, 2))
    assert minimums_for(custom, "p5e.48xlarge")["aws_ofi_nccl"] == Minimum("1.12.0", "type rule")
    assert minimums_for(custom, "p5e.48xlarge")["nccl"].version == "2.18.5"  # an entry never lowers a minimum


def test_compute_scan_fails_a_p5e_node_whose_plugin_predates_p5e(tmp_path, monkeypatch):
    """The plugin library is found on LD_LIBRARY_PATH and its version read from its strings (probes.py)."""
    lib = tmp_path / "lib"
    lib.mkdir()
    monkeypatch.setenv("LD_LIBRARY_PATH", str(lib))
    (lib / "libnccl-net.so").write_bytes(b"\x7fELF\0...NET/OFI Initializing aws-ofi-nccl 1.10.0-aws\0...")
    old = by_name(scan("compute", instance_type="p5e.48xlarge"))["aws_ofi_nccl"]
    assert (old.status, old.required) == ("fail", ">= 1.11.0") and "eb584463" in old.detail
    assert by_name(scan("compute", instance_type="p5.48xlarge"))["aws_ofi_nccl"].status == "pass"
    (lib / "libnccl-net.so").write_bytes(b"\x7fELF\0...NET/OFI Initializing aws-ofi-nccl 1.14.2\0...")
    assert by_name(scan("compute", instance_type="p5e.48xlarge"))["aws_ofi_nccl"].status == "pass"


def test_compute_scan_reports_missing_gpu_and_efa_honestly():
    gpus, efa = probe_gpus(), probe_efa()
    rep = scan("compute", instance_type="p5.48xlarge")
    c = by_name(rep)
    assert rep.family == "p5.48xlarge" and c["gpu"].required == ">= 8 GPU(s)"
    if gpus.found is None:  # this machine: no NVIDIA driver
        assert c["gpu"].status == "fail" and c["gpu"].found == "not found" and rep.failed
        assert c["cuda_driver"].status == "fail" and c["cuda_driver"].required == ">= 535.54.03"
    if efa.found is None:
        assert c["efa"].status == "fail" and "infiniband" in c["efa"].detail
        assert c["efa"].required == ">= 32 EFA device(s)"


def test_head_scan_gpu_not_applicable_and_tools_read_for_real():
    rep = scan("head")
    c = by_name(rep)
    if probe_gpus().found is None:
        assert c["gpu"].status == "not-applicable"
    assert c["enroot"].status == ("fail" if shutil.which("enroot") is None else "pass")
    if shutil.which("docker"):
        assert c["docker"].found.lower().startswith("docker version")
    assert c["slurm"].status in ("pass", "warn") if (shutil.which("sinfo") or shutil.which("slurmd")) else "fail"


def test_container_scan_torch_version_and_cpu_nccl():
    import torch

    c = by_name(scan("container"))
    assert c["torch"].status == "pass" and torch.__version__ in c["torch"].found
    if not torch.cuda.is_available():
        assert c["nccl"].status == "fail" and "CUDA not available" in c["nccl"].detail


def test_bad_role_and_bad_table(tmp_path):
    with pytest.raises(ValidateError, match="valid roles are: head, compute, container"):
        scan("login")
    bad = tmp_path / "req.yaml"
    bad.write_text("version: 2\nminimums: {cuda_driver: '1'}\n")
    with pytest.raises(ValidateError, match=r"req.yaml:2: minimums.efa_installer: required key is missing"):
        load_requirements(bad)
    old = yaml.safe_load(DEFAULT_REQUIREMENTS.read_text()) | {"version": 1}
    old["families"]["p5"] = {"gpus": 8, "efa_devices": 32}
    bad.write_text(yaml.safe_dump(old))
    with pytest.raises(ValidateError, match=r"version: this clustertrain reads version 2, not 1; .*remove gpus, efa_devices"):
        load_requirements(bad)
