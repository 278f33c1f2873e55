"""`clustertrain validate suite` on the local Slurm for a CPU project WITH a container image (issue 37 item 5). The
local Slurm has no Pyxis (srun refuses ``--container-*``), so the smoke, collectives and storage steps run in the
stand-in view of clustertrain/launch/container_view.py given the very options Pyxis would get (a read-only root,
only the mounts writable, HOME not mounted) with this machine's interpreter, as training's ranks do there
(tests/integration/launch/test_twin_slurm.py); the node-answers step stays on the bare node. The image is a
placeholder file on the project's storage: nothing reads it here (the view stands in for it)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.slurm import client_env, local_slurm_cluster

pytestmark = pytest.mark.slow

PROJECT = """
name: vv
cluster: {{backend: slurm, nodes: 2, gpus_per_node: 0, procs_per_node: 1, container_image: {image}}}
storage: {{root: {root}}}
launch: {{exclusive: false}}
models:
  - name: tiny
    model: {{layers: 2, hidden: 64, heads: 4, seq_len: 64}}
    training: {{max_steps: 2, micro_batch: 4, global_batch: 8}}
"""
SWEEP = ["--max-bytes", "64K", "--iters", "2", "--warmup", "1", "--storage-size", "4M", "--storage-files", "100"]
VIEW = "clustertrain.launch.container_view"
#: the containerised steps of each job (index into its srun lines); the others run on the bare node
IN_VIEW = {"smoke": [1, 2], "collectives": [0], "storage-1": [0]}


@pytest.fixture(scope="module")
def local_slurm(tmp_path_factory):
    yield from local_slurm_cluster(tmp_path_factory.mktemp("slurm"), nodes=2)


def verdicts(report: dict, job: str) -> dict[str, str]:
    return {r["check"]: r["verdict"] for r in report["rows"] if r["job"] == job}


def test_suite_steps_run_in_the_container_view_and_pass(local_slurm, tmp_path):
    root = tmp_path / "fsx"
    image = root / "images" / "vv.sqsh"
    image.parent.mkdir(parents=True)
    image.write_text("stand-in: the local Slurm has no Pyxis; the suite's steps run in the container view\n")
    project = tmp_path / "vv.yaml"
    project.write_text(PROJECT.format(image=json.dumps(str(image)), root=json.dumps(str(root))))
    proc = subprocess.run([sys.executable, "-m", "clustertrain", "validate", "suite", str(project), "--nodes", "2",
                           "--json", "--timeout", "120", "--op-timeout", "20", *SWEEP],
                          capture_output=True, text=True, env=client_env(local_slurm), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    report = json.loads(proc.stdout)
    assert report["failed"] is False and report["thresholds"] == "cpu"
    jobs = {j["name"]: j for j in report["jobs"]}
    assert list(jobs) == ["smoke", "gpu-efa", "collectives", "nccl-tests", "storage-1"]

    # every containerised step in the view, given Pyxis's options; srun itself gets none of them
    for name, steps in IN_VIEW.items():
        lines = [shlex.split(ln) for ln in Path(jobs[name]["script"]).read_text().splitlines() if ln.startswith("srun ")]
        for i, argv in enumerate(lines):
            if i not in steps:  # the node answers on the bare node
                assert VIEW not in argv and not any(a.startswith("--container") for a in argv), (name, i, argv)
                continue
            at = argv.index(VIEW)
            assert argv[at - 2:at] == [sys.executable, "-m"], argv  # this machine's interpreter runs the view
            assert not any(a.startswith("--container") for a in argv[:at]), argv
            cut = argv.index("--", at)
            view_opts = argv[at + 1:cut]
            assert f"--container-image={image}" in view_opts and "--no-container-mount-home" in view_opts
            assert f"--container-workdir={Path(jobs[name]['script']).parents[1] / 'results' / name}" in view_opts
            assert f"--container-mounts={root}:{root}" in view_opts
            assert argv[cut + 1] == sys.executable or argv[cut + 1:cut + 3] == ["bash", "-c"], argv

    # the rows: each passes, or says it cannot apply on CPU
    smoke = verdicts(report, "smoke")
    assert smoke["job"] == smoke["nodes"] == smoke["interpreter"] == "pass"
    # the image-role scan ran in the view on both nodes; what it failed is only what cannot apply on CPU (no NCCL,
    # aws-ofi-nccl or libfabric on this host: its exit 1 is the smoke job's "FAILED, exit 1", judged by the rows)
    results = Path(jobs["smoke"]["script"]).parents[1] / "results" / "smoke"
    scans = [json.loads((results / f"scan-{i}.json").read_text()) for i in range(2)]
    assert {s["role"] for s in scans} == {"container"}
    failed = {c["name"] for s in scans for c in s["checks"] if c["status"] == "fail"}
    assert failed <= {"nccl", "aws_ofi_nccl", "libfabric"} and all(smoke[c] == "not-applicable" for c in failed), failed
    [py] = [r for r in report["rows"] if r["check"] == "interpreter"]
    assert py["found"].startswith(f"{sys.executable} (Python ") and f"in image {image}" in py["threshold"]
    na = {c for c, v in smoke.items() if v == "not-applicable"}
    assert na == {c for c in ("gpu", "cuda_driver", "efa", "efa_installer", "libfabric", "aws_ofi_nccl", "nccl",
                              "cuda", "shared_fs") if c in smoke}, smoke
    assert {smoke[c] for c in smoke if c not in na} == {"pass"}, smoke
    skipped = {r["job"]: r["detail"] for r in report["rows"] if r["verdict"] == "not-applicable" and r["check"] == "job"}
    assert skipped == {"gpu-efa": "not applicable: gpus_per_node=0", "nccl-tests": "not applicable: gpus_per_node=0"}
    coll = verdicts(report, "collectives")
    assert coll == {"job": "pass", "ranks": "pass", **{f"{op} correctness": "pass" for op in
                    ("all_reduce", "all_gather", "broadcast", "reduce", "reduce_scatter", "alltoall")},
                    "busbw": "not-applicable", "transport": "not-applicable"}  # gloo on CPU: no band, no EFA
    storage = verdicts(report, "storage-1")
    assert storage[f"write {root}"] == storage[f"read {root}"] == storage[f"metadata {root}"] == "pass"
    assert {v for c, v in storage.items() if c != "bench"} == {"pass"}
