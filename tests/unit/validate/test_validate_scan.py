"""Scans run for real on this machine (CPU-only, no EFA) and must say so honestly."""

from __future__ import annotations

import shutil

import pytest

from clustertrain.validate import ValidateError, load_requirements, scan
from clustertrain.validate.probes import probe_efa, probe_gpus


def by_name(report):
    return {c.name: c for c in report.checks}


def test_requirements_table_has_the_seed_minimums():
    req = load_requirements()
    m = req.minimums
    assert (m.cuda_driver, m.efa_installer, m.cuda, m.nccl, m.aws_ofi_nccl) == ("535.54.03", "1.26.1", "12.2", "2.18.5", "1.8.1")
    assert req.families["p5"].gpus == 8 and req.families["p5e"].gpus == 8
    assert req.roles["head"]["slurm"] == "required" and req.roles["head"]["gpu"] == "absent"


def test_compute_scan_reports_missing_gpu_and_efa_honestly():
    gpus, efa = probe_gpus(), probe_efa()
    rep = scan("compute", instance_type="p5.48xlarge")
    c = by_name(rep)
    assert rep.family == "p5" and c["gpu"].required == ">= 8 GPU(s)"
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
    bad.write_text("version: 1\nminimums: {cuda_driver: '1'}\n")
    with pytest.raises(ValidateError, match="req.yaml: minimums"):
        load_requirements(bad)
