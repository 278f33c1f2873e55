"""The image's pins (versions.yaml) and the compatibility table they are checked against (compat.yaml); how a
project names its image (tag, .sqsh, interpreter) and how check/submit treat it; and the recorded scan of a real
GPU host judged against the pins."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

from clustertrain.core.errors import ImageError
from clustertrain.image.check import judge
from clustertrain.image.paths import image_interpreter, image_tag, sqsh_path
from clustertrain.image.versions import (
    DEFAULT_VERSIONS, Pin, check_versions, compat_notes, compat_problems, digest, load_compat, load_versions,
)
from clustertrain.launch.preflight import launch_findings
from clustertrain.launch.sbatch import build_request, render_script
from clustertrain.resolve import load_project
from clustertrain.validate.scan import ScanReport

ROOT = Path(__file__).resolve().parents[3]
P5E = ROOT / "examples" / "p5e-80x7.yaml"
FIXTURES = Path(__file__).parent / "fixtures"


def pins(**changes) -> "object":
    """The shipped pins with ``changes`` (``pins.nccl=...``, ``base.provides.cuda=...``) applied."""
    v = load_versions().model_copy(deep=True)
    for key, version in changes.items():
        where, name = key.rsplit("__", 1)
        table = v.pins if where == "pins" else v.base.provides
        if version is None:
            table.pop(name)
        else:
            old = table.get(name)
            table[name] = Pin(version=version, source="https://example.org/test", date="2026-11-23",
                              provided_by=old.provided_by if old else None)
    return v


def problems(v, megatron=False):
    return compat_problems(v, load_compat(), megatron)


def test_the_shipped_pins_are_compatible_and_each_names_a_source_and_date():
    v, table = load_versions(), load_compat()
    assert problems(v) == [] and problems(v, megatron=True) == []
    every = [*v.base.provides.values(), *v.pins.values(), *v.python.values()]
    assert len(every) >= 20 and all(p.source and len(p.date) == 10 for p in every)
    assert {"cuda", "torch", "nccl", "python"} <= set(v.base.provides)
    assert {"efa_installer", "libfabric", "aws_ofi_nccl", "gdrcopy", "nccl_tests", "megatron_lm"} <= set(v.pins)
    # what the EFA installer ships is pinned as coming from it, at the table's versions
    shipped = table.efa_installer[v.pins["efa_installer"].version]
    assert (v.pins["aws_ofi_nccl"].version, v.pins["libfabric"].version) == (shipped.aws_ofi_nccl, shipped.libfabric)
    assert v.pins["aws_ofi_nccl"].provided_by == v.pins["libfabric"].provided_by == "efa_installer"
    # CUDA 13.1 on the AMI's 580 driver: allowed (minor-version compatibility), and said
    [note] = compat_notes(v, table)
    assert "590.44.01" in note and "580.173.02" in note


@pytest.mark.parametrize("changes,field,words", [
    ({"base__cuda": "14.0"}, "base.provides.cuda", "not in the compatibility table"),
    ({"pins__torch": "2.13.0", "base__cuda": "12.4"}, "pins.torch", "12.6"),        # a base older than the torch pin needs
    ({"base__torch": "2.5.1"}, "base.provides.torch", ">= 2.6"),                    # older than the trainer runs on
    ({"pins__nccl": "2.32.3-1"}, "pins.nccl", "outside what aws-ofi-nccl 1.22.0 was tested with"),
    ({"base__nccl": "2.16.5"}, "base.provides.nccl", "2.17.1"),
    ({"pins__aws_ofi_nccl": "1.21.1"}, "pins.aws_ofi_nccl", "ships 1.22.0"),        # not what installer 1.51.0 ships
    ({"pins__efa_installer": "1.49.0"}, "pins.efa_installer", "not in the compatibility table"),
    ({"pins__libfabric": "1.21.0"}, "pins.libfabric", "ships 2.7.0"),
    ({"pins__gdrcopy": None}, "pins.gdrcopy", "no pin for gdrcopy"),
])
def test_incompatible_or_unknown_pins_name_the_field(changes, field, words):
    found = problems(pins(**changes))
    assert any(f == field and words in m for f, m in found), found


def test_a_cuda_base_newer_than_the_hosts_driver_is_refused():
    table = load_compat().model_copy(deep=True)
    table.host_driver = Pin(version="570.86.15", source="https://example.org/test", date="2026-11-23")
    [(field, message)] = compat_problems(load_versions(), table)
    assert field == "base.provides.cuda" and "needs driver >= 580" in message and "570.86.15" in message
    with pytest.raises(ImageError, match=r"^versions.yaml: base.provides.cuda: CUDA 13.1 needs driver"):
        check_versions(load_versions(), table)


def test_the_table_agrees_with_pyproject():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = {Requirement(r).name.lower(): Requirement(r) for r in meta["dependencies"]}
    assert str(reqs["torch"].specifier) == f">={load_compat().clustertrain_torch_min.version}"
    python = {name.lower(): pin.version for name, pin in load_versions().python.items()}
    assert set(python) == set(reqs) - {"torch", "numpy"}  # the base brings torch and numpy
    for name, version in python.items():
        assert reqs[name].specifier.contains(version), (name, version, reqs[name])


def test_the_tracking_pins_are_the_tracking_extra():
    """The image installs the trackers' clients at the versions of pyproject's `clustertrain[tracking]` extra."""
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["tracking"]
    reqs = {Requirement(r).name.lower(): Requirement(r) for r in extra}
    tracking = {name.lower(): pin.version for name, pin in load_versions().tracking.items()}
    assert set(tracking) == set(reqs) == {"mlflow-skinny", "wandb"}
    for name, version in tracking.items():
        assert reqs[name].specifier.contains(version), (name, version, reqs[name])


def test_a_broken_pins_file_is_one_line_naming_file_and_key(tmp_path):
    raw = yaml.safe_load(DEFAULT_VERSIONS.read_text())
    del raw["pins"]["gdrcopy"]["source"]
    bad = tmp_path / "versions.yaml"
    bad.write_text(yaml.safe_dump(raw))
    with pytest.raises(ImageError) as err:
        load_versions(bad)
    assert str(bad) in str(err.value) and "pins.gdrcopy.source" in str(err.value) and "\n" not in str(err.value)


def test_the_tag_follows_the_pins_and_the_sqsh_lies_in_the_images_directory(tmp_path):
    p = load_project(P5E)
    tag = image_tag(p)
    assert tag.endswith(digest(None, False)) and sqsh_path(p) == Path(f"/fsx/data/images/clustertrain-train-{tag}.sqsh")
    assert image_tag(load_project(P5E, ["image.megatron=true"])) != tag
    mine = tmp_path / "versions.yaml"
    shutil.copy(DEFAULT_VERSIONS, mine)
    mine.write_text(mine.read_text().replace('"1.51.0"', '"1.51.0" ', 1))  # same pins, other bytes: a new image
    assert image_tag(load_project(P5E, [f"image.versions={mine}"])) != tag
    assert image_tag(load_project(P5E, ["image.tag=v7"])) == "v7"
    assert sqsh_path(load_project(P5E, ["image.name=team/train", "image.tag=v7"])).name == "team+train-v7.sqsh"


def test_the_jobs_run_in_the_built_image_with_its_interpreter():
    p = load_project(P5E)
    script = render_script(build_request(p, p.models[0], Path("/fsx/checkpoints/p5e-80x7/model-1"), nodes=11))
    assert f"--container-image={sqsh_path(p)}" in script
    assert f"{load_versions().interpreter} -m clustertrain train" in script and sys.executable not in script
    other = load_project(P5E, ["cluster.container_image=/fsx/data/images/mine.sqsh"])
    assert image_interpreter(other) is None  # another image: its `python`
    text = render_script(build_request(other, other.models[0], Path("/fsx/checkpoints/x"), nodes=11))
    assert "--container-image=/fsx/data/images/mine.sqsh" in text and " python -m clustertrain train" in text
    [f] = [f for f in launch_findings(other) if f.path == "cluster.container_image" and f.level == "warning"
           and "not the image" in f.message]
    assert str(sqsh_path(other)) in f.message


LOCAL = """
name: loc
cluster: {backend: slurm, nodes: 1, gpus_per_node: 0, procs_per_node: 1}
storage: {root: ROOT}
image: {dir: IMAGES}
models:
  - name: tiny
    model: {layers: 2, hidden: 64, heads: 4, seq_len: 64}
    training: {max_steps: 2, micro_batch: 4, global_batch: 8}
"""


def test_a_missing_image_is_an_error_where_it_can_be_seen_and_a_warning_where_it_cannot(tmp_path):
    path = tmp_path / "loc.yaml"
    path.write_text(LOCAL.replace("ROOT", str(tmp_path / "runs")).replace("IMAGES", str(tmp_path / "images")))
    p = load_project(path)
    [f] = [f for f in launch_findings(p) if f.path == "image"]
    assert f.level == "error" and str(sqsh_path(p)) in f.message and "clustertrain image build" in f.fix
    sqsh_path(p).parent.mkdir(parents=True)
    sqsh_path(p).write_bytes(b"hsqs")
    assert [f for f in launch_findings(p) if f.path == "image"] == []
    # the flagship planned away from the cluster: /fsx/data is not mounted here, so it is not verified
    [f] = [f for f in launch_findings(load_project(P5E)) if f.path == "image"]
    assert f.level == "warning" and "not mounted on this machine" in f.message


def test_submit_with_a_missing_image_exits_2_before_sbatch(tmp_path):
    """`sbatch` here is a recording stand-in on PATH: it must never be called. (The refusal comes from the
    preflight, before any Slurm client runs; the real-Slurm submit paths are tests/integration/launch.)"""
    path = tmp_path / "loc.yaml"
    path.write_text(LOCAL.replace("ROOT", str(tmp_path / "runs")).replace("IMAGES", str(tmp_path / "images")))
    bin_dir, called = tmp_path / "bin", tmp_path / "sbatch-called"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f"#!/bin/sh\ntouch {called}\necho 'Submitted batch job 1'\n")
    (bin_dir / "sbatch").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "clustertrain", "submit", str(path)], capture_output=True, text=True,
                          env=env, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("error: submit refused") and "image:" in proc.stderr and "does not exist" in proc.stderr
    assert "Traceback" not in proc.stderr and not called.exists()


def test_a_real_gpu_hosts_scan_judged_against_the_pins():
    """Recorded on an H200 (see the fixture's first line): CUDA 13.0 and NCCL 2.28.9 from torch 2.11's build, no
    EFA software — a bare GPU host, not the image: the versions differ from the pins (warn), the plugin is absent (fail)."""
    scan = ScanReport.model_validate(json.loads((FIXTURES / "scan-container-h200-host.txt").read_text().split("\n", 1)[1]))
    rows, failed, message = judge(load_project(P5E), scan, container=True)
    by = {r.component: r for r in rows}
    assert failed and [r.component for r in rows] == ["cuda", "nccl", "aws_ofi_nccl", "libfabric", "torch"]
    assert (by["cuda"].pinned, by["cuda"].version, by["cuda"].verdict) == ("13.1", "13.0", "warn")
    assert (by["nccl"].pinned, by["nccl"].version, by["nccl"].verdict) == ("2.29", "2.28.9", "warn")
    assert (by["aws_ofi_nccl"].found, by["aws_ofi_nccl"].verdict) == ("not found", "fail")
    assert (by["torch"].version, by["torch"].verdict) == ("2.11.0", "pass")  # pin 2.11.0a0 at its precision


@pytest.mark.parametrize("override,words", [
    ("image.name=Team/Train", "image.name: image name 'Team/Train' is not a docker image name"),
    ("image.tag=-v1", "image.tag: image tag '-v1' is not a docker tag"),
])
def test_an_image_name_or_tag_docker_rejects_is_one_line_and_nothing_is_built(tmp_path, override, words):
    out = tmp_path / "ctx"
    proc = subprocess.run([sys.executable, "-m", "clustertrain", "image", "render", str(P5E), "-o", str(out),
                           "--set", override], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and words in proc.stderr, proc.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_check_reports_incompatible_pins_and_a_credential_in_a_pin(tmp_path):
    from clustertrain.check import run_check

    raw = yaml.safe_load(DEFAULT_VERSIONS.read_text())
    raw["pins"]["nccl"] = {"version": "2.32.3-1", "source": "https://github.com/NVIDIA/nccl/releases", "date": "2026-10-01"}
    bad = tmp_path / "versions.yaml"
    bad.write_text(yaml.safe_dump(raw))
    report = run_check(load_project(P5E, [f"image.versions={bad}"]))
    [(section, f)] = report.errors
    assert (section, f.path) == ("image", "image.versions: pins.nccl") and "aws-ofi-nccl 1.22.0" in f.message
    raw["pins"].pop("nccl")
    raw["pins"]["gdrcopy"]["source"] = "https://AKIAABCDEFGHIJKLMNOP@github.com/NVIDIA/gdrcopy"  # an access key id
    bad.write_text(yaml.safe_dump(raw))
    report = run_check(load_project(P5E, [f"image.versions={bad}"]))
    assert [(s, f.path) for s, f in report.errors] == [("secrets", "image versions.json")]
