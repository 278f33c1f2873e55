"""`clustertrain image check`'s judging, on scan JSON written here from the ScanReport model (the JSON a node's
`clustertrain validate scan --role container --json` prints; no node scanned here), and its planned job."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from clustertrain.core.errors import ImageError
from clustertrain.image.check import (
    PROBE, ImageCheckReport, check_table, compare, judge, matches_pin, pins_for, plan_check, pyxis_missing,
    run_image_check,
)
from clustertrain.image.paths import sqsh_path
from clustertrain.image.versions import load_versions
from clustertrain.resolve import load_project
from clustertrain.validate.scan import CheckResult, ScanReport
from clustertrain.validate.suitedir import SuitePaths
from clustertrain.validate.suitejob import render_job

#: srun of slurm-wlm 22.05.8 (no Pyxis plugin), recorded on the local Slurm cluster of this repository
#: (clustertrain.launch.slurm_cluster.LocalSlurmCluster, 1 node) with `srun --container-image=x true`: exit 255, stderr:
SRUN_NO_PYXIS = "srun: unrecognized option '--container-image=x'\nTry \"srun --help\" for more information\n"

PROJECT = """
name: ic
cluster: {{backend: slurm, nodes: 1, gpus_per_node: {gpus}, partition: gpu, instance_type: p5e.48xlarge{extra}}}
storage: {{root: {root}}}
launch: {{exclusive: true}}
{image}
models:
  - name: tiny
    model: {{layers: 2, hidden: 64, heads: 4, seq_len: 64}}
    training: {{max_steps: 2, micro_batch: 4, global_batch: 32}}
"""


def project(tmp_path: Path, image: str = "image: {{dir: {images}, megatron: true}}", gpus: int = 8, extra: str = ""):
    path = tmp_path / "ic.yaml"
    path.write_text(PROJECT.format(root=json.dumps(str(tmp_path / "fsx")), gpus=gpus, extra=extra,
                                   image=image.format(images=json.dumps(str(tmp_path / "images")))))
    return load_project(path)


def scan_json(**found: tuple[str, str, str | None]) -> ScanReport:
    """A scan as a node prints it: name -> (status, found, version), serialised and read back like scan.json."""
    checks = [CheckResult(name=n, status=s, found=f, required=">= 1", version=v) for n, (s, f, v) in found.items()]
    report = ScanReport(role="container", instance_type="p5e.48xlarge", family="p5e", checks=checks,
                        failed=any(c.status == "fail" for c in checks))
    return ScanReport.model_validate_json(report.model_dump_json())


GOOD = dict(cuda=("pass", "13.1.1 (/usr/local/cuda)", "13.1.1"), nccl=("pass", "2.29.7", "2.29.7"),
            aws_ofi_nccl=("pass", "1.22.0-aws (/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so)", "1.22.0-aws"),
            libfabric=("pass", "2.7.0amzn2.0", "2.7.0amzn2.0"), torch=("pass", "torch 2.11.0a0+eb65b36", "2.11.0a0+eb65b36"),
            megatron=("pass", "megatron-core 0.16.1", "0.16.1"))


def test_pins_match_on_their_own_precision():
    assert matches_pin("13.1", "13.1.1") and matches_pin("2.29", "2.29.7") and matches_pin("1.22.0", "1.22.0-aws")
    assert matches_pin("core_v0.16.1", "0.16.1") and matches_pin("2.7.0", "2.7.0amzn2.0")
    assert not matches_pin("13.1", "13.0") and not matches_pin("13.1.1", "13.1") and not matches_pin("2.29", "2.3")
    assert not matches_pin("abc", "1.0")  # a pin without a number matches nothing


def test_the_pinned_image_passes_every_row(tmp_path):
    p = project(tmp_path)
    rows, failed, message = judge(p, scan_json(**GOOD), container=True)
    assert [(r.component, r.pinned, r.verdict) for r in rows] == [
        ("cuda", "13.1", "pass"), ("nccl", "2.29", "pass"), ("aws_ofi_nccl", "1.22.0", "pass"),
        ("libfabric", "2.7.0", "pass"), ("torch", "2.11.0a0", "pass"), ("megatron", "core_v0.16.1", "pass")]
    assert not failed and message == "the pinned versions, in the image"


def test_a_version_other_than_the_pin_warns_and_a_failed_scan_check_fails(tmp_path):
    p = project(tmp_path)
    scan = scan_json(**{**GOOD, "nccl": ("pass", "2.30.1", "2.30.1"),
                        "aws_ofi_nccl": ("fail", "not found", None), "torch": ("warn", "torch (no metadata)", None)})
    rows, failed, message = judge(p, scan, container=True)
    by = {r.component: r for r in rows}
    assert (by["nccl"].verdict, by["nccl"].found) == ("warn", "2.30.1") and "not the pinned 2.29" in by["nccl"].detail
    assert by["aws_ofi_nccl"].verdict == "fail" and by["aws_ofi_nccl"].status == "fail"
    assert by["torch"].verdict == "warn" and "version unreadable" in by["torch"].detail
    assert failed and "1 component(s) missing" in message
    table = check_table(ImageCheckReport(project="ic", image="x.sqsh", container=True, directory=str(tmp_path),
                                         rows=rows, failed=failed, message=message))
    assert "nccl           2.29           2.30.1" in table and table.splitlines()[-1].startswith("verdict: FAILED: 1 comp")


def test_a_pinned_component_missing_fails_even_where_the_scan_only_recommends_it(tmp_path):
    row = compare("megatron", "core_v0.16.1", CheckResult(name="megatron", status="warn", found="not found",
                                                          required="installed"))
    assert row.verdict == "fail" and row.detail.startswith("pinned core_v0.16.1, but not in the image")
    assert compare("megatron", None, None).verdict == "warn"  # a check the scan does not have: said, not hidden


def test_scans_without_the_version_field_are_read_from_their_found_text(tmp_path):
    legacy = json.dumps({"role": "container", "instance_type": None, "family": "x", "failed": False, "checks": [
        {"name": "cuda", "status": "pass", "found": "13.1.0 (nvcc)", "required": ">= 12.2"}]})
    [c] = ScanReport.model_validate_json(legacy).checks
    assert compare("cuda", "13.1", c).verdict == "pass"


def test_no_pins_without_an_image_section_or_for_another_image(tmp_path):
    bare = project(tmp_path, image="", extra=", container_image: /fsx/other.sqsh")
    rows, failed, _ = judge(bare, scan_json(**GOOD), container=True)
    assert {r.pinned for r in rows} == {"not pinned"} and [r.component for r in rows][-1] == "torch" and not failed
    other = project(tmp_path, extra=", container_image: /fsx/other.sqsh")
    assert pins_for(other, container=True) == {} and pins_for(other, container=False)["nccl"] == "2.29"
    assert pins_for(project(tmp_path))["megatron"] == load_versions().pins["megatron_lm"].version


def test_pyxis_missing_is_told_from_srun_s_own_message(tmp_path):
    p = project(tmp_path)
    assert pyxis_missing(SRUN_NO_PYXIS) and not pyxis_missing("srun: error: Unable to allocate resources")
    rows, failed, message = judge(p, None, container=True, errors="job started\n" + SRUN_NO_PYXIS, missing="job FAILED")
    assert (rows, failed) == ([], True) and message.startswith("Pyxis is not installed or enabled on this cluster")
    assert "--no-container" in message and "clustertrain cluster scripts" in message
    _, _, other = judge(p, None, container=True, errors="enroot: error", missing="job FAILED, exit 1: enroot: error")
    assert other == "no scan result: job FAILED, exit 1: enroot: error"


def test_the_job_scans_in_the_image_with_pyxis_flags_on_one_node(tmp_path):
    p = project(tmp_path)
    sqsh_path(p).parent.mkdir(parents=True)
    sqsh_path(p).write_bytes(b"hsqs")  # stands in for the built image: no enroot here, and nothing reads it
    paths = SuitePaths(tmp_path / "suite")
    job = plan_check(p, paths, container=True, timeout_s=300)
    script = render_job(job, paths)
    assert job.job_name == "ic-image-check" and (job.nodes, job.ntasks_per_node) == (1, 1)
    assert "#SBATCH --gpus-per-node=8" in script and '#SBATCH --partition="gpu"' in script and "#SBATCH --exclusive" in script
    res = paths.results("image-check")
    [step, probe] = job.steps
    assert f"--container-image={sqsh_path(p)}" in step and "--no-container-mount-home" in step
    assert f"--container-mounts={res}:{res}" in step
    assert step[-10:] == ("/opt/clustertrain/venv/bin/python", "-m", "clustertrain", "validate", "scan", "--role",
                          "container", "--json", "--instance-type", "p5e.48xlarge")
    assert shlex.join(step[step.index("/opt/clustertrain/venv/bin/python"):]) in script
    # the second step: a one-rank NCCL init in the image, its log beside the scan, under the training NCCL preset
    assert f"--container-image={sqsh_path(p)}" in probe and f"--output={res}/nccl-init.log" in probe
    assert list(probe[probe.index("env"):]) == ["env", "NCCL_DEBUG=INFO", "NCCL_DEBUG_SUBSYS=INIT,NET", "FI_LOG_LEVEL=info",
                                          "/opt/clustertrain/venv/bin/python", "-c", PROBE]
    assert shlex.join(probe[probe.index("env"):]) in script
    assert job.env.efa and "export NCCL_SOCKET_IFNAME=" in script  # p5e: the EFA preset, as training has it
    host = plan_check(p, paths, container=False, timeout_s=300).steps
    assert len(host) == 1 and not any(w.startswith("--container") for w in host[0])
    assert "/opt/clustertrain/venv/bin/python" not in host[0]
    assert len(plan_check(project(tmp_path, gpus=0), paths, container=True, timeout_s=300).steps) == 1  # no GPU


def test_the_probe_is_valid_python_that_inits_nccl_on_one_rank():
    compile(PROBE, "<probe>", "exec")
    assert "init_process_group('nccl', store=dist.HashStore(), rank=0, world_size=1)" in PROBE
    assert "dist.all_reduce(t)" in PROBE


def test_nothing_to_check_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ImageError, match=r"no image to check: .*--no-container"):
        run_image_check(project(tmp_path, image=""))
    with pytest.raises(ImageError, match=r"does not exist.*clustertrain image build"):
        run_image_check(project(tmp_path))  # the image: section's .sqsh was never built
    assert not (tmp_path / "fsx").exists()


# -- the transport: a one-rank NCCL init in the image ----------------------------------------------------------

VALIDATE_FIXTURES = Path(__file__).parents[1] / "validate" / "fixtures"
H200_NO_EFA = (VALIDATE_FIXTURES / "nccl-init-1rank-h200-no-efa.log").read_text()  # REAL: a lent H200, no EFA
ONE_RANK_EFA = (VALIDATE_FIXTURES / "nccl-init-1rank-efa-p5e.log").read_text()      # from the documented formats


def test_the_real_socket_fallback_fails_the_image_check_naming_it(tmp_path):
    p = project(tmp_path)  # p5e.48xlarge: EFA expected
    rows, failed, message = judge(p, scan_json(**GOOD), container=True, nccl_log=H200_NO_EFA)
    by = {r.component: r for r in rows}
    assert [r.verdict for r in rows[:6]] == ["pass"] * 6  # the versions are as pinned: the file is there...
    assert (by["transport"].verdict, by["transport"].found) == ("fail", "Socket on 1/1 process(es)")  # ...the transport is not
    assert by["gdrcopy"].verdict == "fail"
    assert failed and message.startswith("NCCL in the image: transport: Socket on 1/1 process(es); gdrcopy: not logged "
                                          "(NCCL fell back to TCP sockets (NET/Socket) on vm: EFA is not used")
    assert "'Using network Socket' after 'NET/Plugin: Could not find: libnccl-net.so'" in message
    table = check_table(ImageCheckReport(project="ic", image="x.sqsh", container=True, directory=str(tmp_path),
                                         rows=rows, failed=failed, message=message))
    assert table.splitlines()[-1].startswith("verdict: FAILED: NCCL in the image: transport: Socket")


def test_efa_and_gdrcopy_in_the_one_rank_init_pass(tmp_path):
    rows, failed, message = judge(project(tmp_path), scan_json(**GOOD), container=True, nccl_log=ONE_RANK_EFA)
    assert [(r.component, r.verdict) for r in rows[6:]] == [
        ("transport", "pass"), ("aws-ofi-nccl (NCCL log)", "pass"), ("gdrcopy", "pass")]
    assert not failed and message == "the pinned versions, in the image"


def test_a_probe_that_left_no_log_fails(tmp_path):
    rows, failed, message = judge(project(tmp_path), scan_json(**GOOD), container=True, nccl_log="")
    assert failed and {r.component: r.found for r in rows}["transport"] == "not logged"
    # without a GPU no init step is planned (nccl_log None): the scan alone decides
    assert judge(project(tmp_path, gpus=0), scan_json(**GOOD), container=True)[1] is False
