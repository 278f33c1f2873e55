"""`clustertrain image build`: the printed commands, the refusals, and the whole flow.

Docker and Enroot cannot run here (no Docker daemon, no NGC registry, no Enroot): the flow tests put DOUBLES for
both first on PATH (tests/support/fake_tools.py). The fake enroot writes its output with the REAL mksquashfs,
and the build verifies it with the real superblock reader and unsquashfs.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from clustertrain.cli import app as root_app
from clustertrain.core.errors import ImageError
from clustertrain.image.build import Command, format_command, plan_build, plan_places, run_build
from clustertrain.image.footprint import GB, GIB, root_volume_problem
from clustertrain.image.paths import image_tag
from clustertrain.image.squashfs import verify_sqsh
from clustertrain.resolve import load_project
from tests.support.fake_tools import INTERPRETER, install_fake_docker, install_fake_enroot, need_mksquashfs
from tests.support.projects import tiny_project

ROOT = Path(__file__).resolve().parents[3]
FLAGSHIP = ROOT / "examples" / "p5e-80x7.yaml"
NAME = "clustertrain-train"


def small_pins(tmp_path: Path, gb: str = "0.001") -> Path:
    """The shipped pins with every footprint size set to ``gb``: the flow tests build a few-KB stand-in, and must not
    depend on this machine having the ~60 GB free that the real sizes ask for (the refusals are tested below)."""
    pins = tmp_path / "pins.yaml"
    pins.write_text(re.sub(r"\{gb: [0-9.]+,", f"{{gb: {gb},", (ROOT / "clustertrain" / "image" / "versions.yaml").read_text()))
    return pins


def write_project(tmp_path: Path, image: str = "") -> Path:
    image = image or f"{{dir: {tmp_path / 'images'}, work_dir: {tmp_path / 'work'}, versions: {small_pins(tmp_path)}}}"
    return tiny_project(tmp_path, f"image: {image}", name="imgtest")


def stub_render(project, out_dir: Path):
    """The real recipe is tested in test_recipe.py; the build only needs a context with a Dockerfile."""
    out_dir.mkdir(parents=True)
    (out_dir / "Dockerfile").write_text("FROM scratch\n")
    return None


@pytest.fixture()
def fakes(tmp_path: Path, monkeypatch) -> Path:
    """Fake docker and enroot first on PATH (the rest of PATH keeps mksquashfs/unsquashfs); returns their log."""
    need_mksquashfs()
    log = tmp_path / "tools.log"
    bin_dir = tmp_path / "bin"
    install_fake_docker(bin_dir, log)
    install_fake_enroot(bin_dir, log)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    for var in ("FAKE_DOCKER_INFO_FAIL", "FAKE_DOCKER_BUILD_FAIL", "FAKE_ENROOT_TRUNCATE", "FAKE_ENROOT_PATHS"):
        monkeypatch.delenv(var, raising=False)
    return log


def cli(*args: str):
    return CliRunner().invoke(root_app, ["image", "build", *args])


# -- pure parts ---------------------------------------------------------------------------------------

def test_format_command_quotes_values_and_words_but_keeps_assignments():
    cmd = Command(argv=("enroot", "import", "--output", "/a b/x.sqsh", "dockerd://n:t"), env={"ENROOT_TEMP_PATH": "/w d/tmp"})
    line = format_command(cmd)
    assert line == "ENROOT_TEMP_PATH='/w d/tmp' enroot import --output '/a b/x.sqsh' dockerd://n:t"
    assert shlex.split(line) == ["ENROOT_TEMP_PATH=/w d/tmp", *cmd.argv]


def test_the_work_dir_is_the_argument_then_image_work_dir_then_the_enroot_dir_then_tmp(tmp_path: Path, monkeypatch):
    p = load_project(write_project(tmp_path))
    assert plan_build(p, tmp_path / "arg").work_dir == tmp_path / "arg"
    assert plan_build(p).work_dir == tmp_path / "work"
    flagship = load_project(FLAGSHIP)  # aws.enroot.local_dir /scratch: not on this machine
    if not Path("/scratch").is_dir():
        assert plan_build(flagship).work_dir == Path(tempfile.gettempdir())
    local = tmp_path / "nvme"
    local.mkdir()
    assert plan_build(load_project(FLAGSHIP, [f"aws.enroot.local_dir={local}"])).work_dir == local


# -- dry run ------------------------------------------------------------------------------------------

def flagship_expected(tag: str, notes: list[str]) -> list[str]:
    """The dry run of the flagship with --work-dir /scratch, written out from the layout it documents."""
    ref, uid, gid = f"{NAME}:{tag}", os.getuid(), os.getgid()
    ctx = f"/scratch/clustertrain-image/{tag}"
    sqsh = f"/fsx/data/images/{NAME}-{tag}.sqsh"
    partial = f"/fsx/data/images/.{NAME}-{tag}.sqsh.partial"
    return [
        f"# image {ref} -> {sqsh}",
        *notes,
        "# disk: 41.0 GB for Docker's data root under /var/lib/docker (NGC base 11 pulled + 24 unpacked, build stage 4, "
        "the image's layers 2)",
        "# disk: 26.0 GB for the enroot export under /scratch/enroot/tmp (`docker export | tar` unpacks the image there "
        "for mksquashfs, removed after)",
        "# disk: 26.0 GB for the .sqsh under /fsx/data/images (mksquashfs -noD stores data blocks uncompressed)",
        f"# render the build context (Dockerfile, clustertrain's wheel, versions.json) into {ctx}/ "
        "(`clustertrain image render PROJECT -o DIR` writes the same)",
        f"# build the docker image {ref} on nvcr.io/nvidia/pytorch:26.02-py3",
        f"docker build --pull --tag {ref} --file {ctx}/Dockerfile {ctx}",
        "# import it into a squashfs file beside the final one; enroot refuses an existing output",
        "mkdir -p -- /scratch/enroot/tmp",
        f"rm -f -- {partial}",
        f"ENROOT_CACHE_PATH=/scratch/enroot/cache/group-{gid} ENROOT_DATA_PATH=/scratch/enroot/data/user-{uid} "
        f"ENROOT_TEMP_PATH=/scratch/enroot/tmp enroot import --output {partial} dockerd://{ref}",
        f"# check it (squashfs 4.0, complete, holds {INTERPRETER}), then rename it into place",
        f"mv -f -- {partial} {sqsh}",
        "# remove the build context",
        f"rm -rf -- {ctx}",
    ]


def test_golden_dry_run_of_the_flagship(tmp_path: Path, monkeypatch):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))  # no docker, no enroot: --dry-run says so in notes, and goes on
    project = load_project(FLAGSHIP)
    lines: list[str] = []
    result = run_build(project, dry_run=True, work_dir=Path("/scratch"), echo=lines.append, free_bytes=lambda p: 10**15)
    notes = [f"# note: `image build` needs docker (not found on PATH): build on the head node, where ParallelCluster's "
             "AMI installs Docker and Enroot"]
    if not Path("/fsx/data").is_dir():
        notes.append("# note: /fsx/data (the shared file system of /fsx/data/images) is not mounted on this machine: "
                     "build on the head node, where ParallelCluster's AMI installs Docker and Enroot")
    assert lines == flagship_expected(image_tag(project), notes)
    assert result.size_bytes == 0 and [c.what for c in result.commands] == ["docker build", "enroot import"]


def test_a_dry_run_writes_nothing(tmp_path: Path, fakes: Path):
    p = load_project(write_project(tmp_path))
    lines: list[str] = []
    run_build(p, dry_run=True, echo=lines.append, render=stub_render)
    assert not (tmp_path / "work").exists() and not (tmp_path / "images").exists() and not fakes.exists()
    assert not any(line.startswith("# note:") for line in lines)  # tools on PATH, images dir creatable


def test_dry_run_through_the_cli(tmp_path: Path):
    res = cli(str(FLAGSHIP), "--dry-run", "--work-dir", "/scratch")
    assert res.exit_code == 0, res.output
    tag = image_tag(load_project(FLAGSHIP))
    lines = res.output.splitlines()
    assert f"docker build --pull --tag {NAME}:{tag} --file /scratch/clustertrain-image/{tag}/Dockerfile " \
           f"/scratch/clustertrain-image/{tag}" in lines
    partial = f"/fsx/data/images/.{NAME}-{tag}.sqsh.partial"
    assert any(line.endswith(f"enroot import --output {partial} dockerd://{NAME}:{tag}") for line in lines)
    assert f"mv -f -- {partial} /fsx/data/images/{NAME}-{tag}.sqsh" in lines


# -- refusals -----------------------------------------------------------------------------------------

def test_missing_docker_then_missing_enroot_through_the_cli(tmp_path: Path, monkeypatch):
    project = write_project(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    res = cli(str(project))
    assert res.exit_code == 2 and res.output.count("\n") == 1
    assert res.output.startswith("error: `image build` needs docker (not found on PATH): build on the head node")
    install_fake_docker(bin_dir, tmp_path / "tools.log")
    res = cli(str(project))
    assert res.exit_code == 2 and res.output.startswith("error: `image build` needs enroot (not found on PATH)")
    assert not (tmp_path / "images").exists() and not (tmp_path / "tools.log").exists()


def test_an_unreachable_docker_daemon_is_its_last_stderr_line(tmp_path: Path, fakes: Path, monkeypatch):
    monkeypatch.setenv("FAKE_DOCKER_INFO_FAIL", "permission denied while trying to connect to the Docker daemon socket")
    with pytest.raises(ImageError) as e:
        run_build(load_project(write_project(tmp_path)), render=stub_render, echo=lambda s: None)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("`docker info` failed (exit 1): permission denied while trying to connect")
    assert "docker build" not in fakes.read_text() and not (tmp_path / "work").exists()


def test_the_real_docker_cli_without_a_daemon_is_refused(tmp_path: Path, monkeypatch):
    real = shutil.which("docker")
    if real is None:
        pytest.skip("no docker CLI here")
    if os.system("docker info >/dev/null 2>&1") == 0:
        pytest.skip("a Docker daemon answers here")
    need_mksquashfs()
    bin_dir = tmp_path / "bin"
    install_fake_enroot(bin_dir, tmp_path / "tools.log")  # only enroot is a double: docker is the real CLI
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(ImageError, match=r"^`docker info` failed \(exit \d+\): .*daemon"):
        run_build(load_project(write_project(tmp_path)), render=stub_render, echo=lambda s: None)


def test_an_images_dir_off_the_shared_file_system_is_refused_also_in_a_dry_run():
    project = load_project(FLAGSHIP, ["image.dir=/home/me/images"])
    with pytest.raises(ImageError) as e:
        run_build(project, dry_run=True, echo=lambda s: None)
    assert str(e.value).startswith("image.dir: /home/me/images (training images) is not on a shared file system")


def test_a_file_system_without_room_is_refused_in_a_dry_run_by_its_real_free_space(tmp_path: Path):
    """The real shutil.disk_usage of tmp_path: no disk here has a petabyte free."""
    p = load_project(write_project(tmp_path, f"{{dir: {tmp_path / 'images'}, work_dir: {tmp_path / 'work'}, "
                                             f"versions: {small_pins(tmp_path, '1000000')}}}"))
    with pytest.raises(ImageError) as e:
        run_build(p, dry_run=True, echo=lambda s: None)
    msg = str(e.value)
    export = tmp_path / "work" / "enroot" / "tmp"
    assert "\n" not in msg and msg.startswith(f"{export}: ") and " GB free on its file system, the build needs " in msg
    # the export and the .sqsh share tmp_path's file system: their needs add up (Docker's root too, where it exists)
    assert "the enroot export 2000000.0 GB + the .sqsh 2000000.0 GB" in msg
    assert msg.endswith('pass --work-dir (or set image.work_dir) on a larger disk (docs/image.md, "Disk")')
    assert not (tmp_path / "work").exists() and not (tmp_path / "images").exists()


def test_the_space_check_names_the_place_that_does_not_fit(tmp_path: Path, fakes: Path):
    p = load_project(write_project(tmp_path, f"{{dir: {tmp_path / 'images'}, work_dir: {tmp_path / 'work'}}}"))
    plan = plan_build(p)
    need = sum(pl.need for pl in plan_places(plan)[1:])  # the export and the .sqsh (one file system here)
    assert need == 52 * GB  # the shipped sizes: 24 + 2 unpacked, twice
    with pytest.raises(ImageError, match=r"^\S+: 0\.0 GB free on its file system, the build needs [0-9.]+ GB there \("):
        run_build(p, echo=lambda s: None, render=stub_render, free_bytes=lambda path: 0)
    assert "docker build" not in fakes.read_text() and not (tmp_path / "images").exists()
    lines: list[str] = []
    run_build(p, dry_run=True, echo=lines.append, free_bytes=lambda path: 10**15)
    assert [ln for ln in lines if ln.startswith("# disk: ")][1:] == [
        f"# disk: 26.0 GB for the enroot export under {plan.enroot_temp} (`docker export | tar` unpacks the image there "
        "for mksquashfs, removed after)",
        f"# disk: 26.0 GB for the .sqsh under {plan.sqsh.parent} (mksquashfs -noD stores data blocks uncompressed)"]


def test_a_head_node_root_volume_too_small_for_the_build_is_refused():
    small = load_project(FLAGSHIP, ["aws.head_node.root_volume_gb=60"])
    with pytest.raises(ImageError) as e:
        run_build(small, dry_run=True, echo=lambda s: None, free_bytes=lambda p: 10**15)
    need = 35 * GIB + 41 * GB + 26 * GB  # the AMI, Docker's data root, the export in the temp dir
    assert str(e.value) == (
        f"aws.head_node.root_volume_gb: 60 GiB cannot hold an image build on the head node, which needs "
        f"{need / GIB:.0f} GiB (the AMI's 35 GiB, Docker's data root 41 GB, the enroot export 26 GB); set it to at "
        f"least {-(-need // GIB)} (docs/image.md, \"Disk\")")
    assert root_volume_problem(load_project(FLAGSHIP)) is None  # the flagship's own volume holds it
    # with image.work_dir elsewhere (an NVMe), the export is not on the root volume
    assert root_volume_problem(load_project(FLAGSHIP, ["aws.head_node.root_volume_gb=80", "image.work_dir=/nvme"])) is None


def test_an_existing_image_is_refused_also_in_a_dry_run(tmp_path: Path):
    p = load_project(write_project(tmp_path))
    sqsh = plan_build(p).sqsh
    sqsh.parent.mkdir(parents=True)
    sqsh.write_bytes(b"old")
    with pytest.raises(ImageError) as e:
        run_build(p, dry_run=True, echo=lambda s: None)
    assert str(e.value) == f"{sqsh} exists; pass --force to replace it, or change image.tag"


def test_an_images_dir_that_cannot_be_created_is_refused(tmp_path: Path, fakes: Path):
    (tmp_path / "afile").write_text("x")
    p = load_project(write_project(tmp_path, f"{{dir: {tmp_path / 'afile' / 'images'}}}"))
    with pytest.raises(ImageError) as e:
        run_build(p, render=stub_render, echo=lambda s: None)
    assert str(e.value) == f"image.dir: {tmp_path / 'afile' / 'images'} cannot be created: {tmp_path / 'afile'} is not a directory"
    assert "docker build" not in fakes.read_text()


def test_pins_the_compatibility_table_rejects_are_refused_before_anything(tmp_path: Path, fakes: Path):
    pins = tmp_path / "versions.yaml"
    text = (ROOT / "clustertrain" / "image" / "versions.yaml").read_text()
    pins.write_text(text.replace('aws_ofi_nccl: {version: "1.22.0"', 'aws_ofi_nccl: {version: "0.0.1"'))
    p = load_project(write_project(tmp_path, f"{{dir: {tmp_path / 'images'}, versions: {pins}}}"))
    with pytest.raises(ImageError) as e:
        run_build(p, render=stub_render, echo=lambda s: None)
    assert str(e.value).startswith(f"{pins}: pins.aws_ofi_nccl") and "\n" not in str(e.value)
    assert not fakes.exists() and not (tmp_path / "images").exists()


# -- the whole flow, with doubles for docker and enroot -------------------------------------------------

def test_the_build_runs_docker_then_enroot_and_renames_a_verified_image(tmp_path: Path, fakes: Path):
    p = load_project(write_project(tmp_path))
    plan = plan_build(p)
    lines: list[str] = []
    result = run_build(p, echo=lines.append, render=stub_render)
    work, ref = tmp_path / "work", plan.ref.reference
    assert fakes.read_text().splitlines() == [
        "docker info",
        f"docker build --pull --tag {ref} --file {work}/clustertrain-image/{plan.ref.tag}/Dockerfile "
        f"{work}/clustertrain-image/{plan.ref.tag}",
        f"enroot import --output {plan.partial} dockerd://{ref} CACHE={work}/enroot/cache/group-{os.getgid()} "
        f"DATA={work}/enroot/data/user-{os.getuid()} TEMP={work}/enroot/tmp",
    ]
    assert [format_command(c) for c in plan.commands] == [line for line in lines if not line.startswith(("#", "fake"))]
    assert result.sqsh == plan.sqsh == tmp_path / "images" / f"{NAME}-{plan.ref.tag}.sqsh"
    assert verify_sqsh(result.sqsh, must_contain=[INTERPRETER]).version == (4, 0)
    assert result.size_bytes == result.sqsh.stat().st_size > 0
    assert not plan.partial.exists() and not plan.context.exists()
    assert "fake enroot: wrote " + str(plan.partial) in lines  # the tools' output is passed through


def test_a_second_build_needs_force_and_force_replaces(tmp_path: Path, fakes: Path):
    project_file = write_project(tmp_path)
    p = load_project(project_file)
    sqsh = run_build(p, echo=lambda s: None, render=stub_render).sqsh
    before = sqsh.stat()
    res = cli(str(project_file))  # refused before rendering, so the real recipe is never reached
    assert res.exit_code == 2 and res.output == f"error: {sqsh} exists; pass --force to replace it, or change image.tag\n"
    after = sqsh.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)
    run_build(p, force=True, echo=lambda s: None, render=stub_render)
    assert sqsh.stat().st_ino != before.st_ino and verify_sqsh(sqsh, must_contain=[INTERPRETER])
    assert fakes.read_text().count("enroot import") == 2


def test_a_stale_partial_is_removed_before_enroot_runs(tmp_path: Path, fakes: Path):
    p = load_project(write_project(tmp_path))
    plan = plan_build(p)
    plan.partial.parent.mkdir(parents=True)
    plan.partial.write_bytes(b"left by a killed build")
    run_build(p, echo=lambda s: None, render=stub_render)  # the fake enroot, like the real one, refuses an existing -o
    assert verify_sqsh(plan.sqsh) and not plan.partial.exists()


def test_a_failing_docker_build_names_it_and_leaves_nothing(tmp_path: Path, fakes: Path, monkeypatch):
    monkeypatch.setenv("FAKE_DOCKER_BUILD_FAIL", "ERROR: failed to solve: nvcr.io/nvidia/pytorch:26.02-py3: not found")
    p = load_project(write_project(tmp_path))
    plan = plan_build(p)
    with pytest.raises(ImageError) as e:
        run_build(p, echo=lambda s: None, render=stub_render)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("`docker build` failed (exit 1): ERROR: failed to solve: ")
    assert msg.endswith(format_command(plan.commands[0]))
    assert "enroot" not in fakes.read_text()
    assert not plan.sqsh.exists() and not plan.partial.exists() and not plan.context.exists()


def test_a_truncated_import_fails_verification_and_is_removed(tmp_path: Path, fakes: Path, monkeypatch):
    monkeypatch.setenv("FAKE_ENROOT_TRUNCATE", "1")
    p = load_project(write_project(tmp_path))
    plan = plan_build(p)
    with pytest.raises(ImageError) as e:
        run_build(p, echo=lambda s: None, render=stub_render)
    msg = str(e.value)
    assert msg.startswith(f"{plan.partial} is not a usable Enroot image: truncated: its superblock says ")
    assert "nothing was replaced" in msg and "\n" not in msg
    assert not plan.sqsh.exists() and not plan.partial.exists()


def test_an_image_without_the_interpreter_is_not_renamed(tmp_path: Path, fakes: Path, monkeypatch):
    if shutil.which("unsquashfs") is None:
        pytest.skip("unsquashfs (squashfs-tools) is not installed")
    monkeypatch.setenv("FAKE_ENROOT_PATHS", "/usr/bin/python3")
    p = load_project(write_project(tmp_path))
    plan = plan_build(p)
    with pytest.raises(ImageError, match=f"does not contain {INTERPRETER}"):
        run_build(p, echo=lambda s: None, render=stub_render)
    assert not plan.sqsh.exists() and not plan.partial.exists()


def test_check_errors_on_a_head_node_root_volume_too_small_for_the_build():
    from clustertrain.image.preflight import image_findings

    assert image_findings(load_project(FLAGSHIP)) == []
    [f] = image_findings(load_project(FLAGSHIP, ["aws.head_node.root_volume_gb=60"]))
    assert (f.level, f.path) == ("error", "aws.head_node.root_volume_gb")
    assert f.message.startswith("60 GiB cannot hold an image build on the head node, which needs ")
    assert f.fix.startswith("set it to at least ") and f.fix.endswith('(docs/image.md, "Disk")')
