"""The container configuration the node scripts write (Pyxis, Enroot, Docker) and the directories they create.

Golden files under ``golden/node-config/`` pin the exact text of what lands on the nodes
(``CLUSTERTRAIN_UPDATE_GOLDEN=1 pytest tests/unit/cloud/test_node_config.py`` rewrites them; review the diff).
tests/integration/cloud/test_node_scripts.py runs the scripts and compares what they wrote with the same files."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from clustertrain.cloud import build_cluster_config, model_dirs, render_node_scripts
from clustertrain.cloud.config import CONTAINERS_CACHE_NAME, HEAD_ROOT_VOLUME_GB
from clustertrain.cloud.scripts import ENROOT_SAMPLE_SETTINGS, enroot_block, plugstack_conf, pyxis_conf
from clustertrain.core.errors import ConfigError
from clustertrain.core.storage_layout import BENCH_DIR_NAME, storage_layout
from tests.support.golden import check_golden

GOLDEN = Path(__file__).with_name("golden") / "node-config"

#: the plugstack arguments pyxis@1075199 ``config.c`` accepts, and their values where they are a choice
PYXIS_ARGS = {"runtime_path": None, "execute_entrypoint": None, "container_scope": {"job", "global"},
              "sbatch_support": None, "use_enroot_load": None, "importer": None, "use_squashfuse": None}


def test_pyxis_and_plugstack_match_the_golden_files():
    check_golden(GOLDEN / "plugstack.conf", plugstack_conf())
    check_golden(GOLDEN / "pyxis.conf", pyxis_conf())


def test_pyxis_line_is_a_required_plugin_with_job_scope():
    lines = [ln for ln in pyxis_conf().splitlines() if ln and not ln.startswith("#")]
    assert len(lines) == 1
    words = lines[0].split()
    assert words[:2] == ["required", "/usr/local/lib/slurm/spank_pyxis.so"]
    args = dict(w.split("=", 1) for w in words[2:])
    assert set(args) <= set(PYXIS_ARGS), args
    assert args["container_scope"] == "job" and args["runtime_path"] == "/run/pyxis"
    # plugstack includes the directory pyxis.conf goes to
    assert "include /opt/slurm/etc/plugstack.conf.d/*" in plugstack_conf().splitlines()


def test_enroot_block_matches_the_golden_file_and_the_sample_settings():
    block = enroot_block("/scratch")
    check_golden(GOLDEN / "enroot.conf.block", block)
    settings = dict(ln.split(" ", 1) for ln in block.splitlines()[1:-1])
    # ParallelCluster's sample (cookbook enroot.conf.erb) for what containers may write, the image's root read-only
    assert {k: settings[k] for k, _ in ENROOT_SAMPLE_SETTINGS} == {
        "ENROOT_ROOTFS_WRITABLE": "no", "ENROOT_MOUNT_HOME": "no", "ENROOT_RESTRICT_DEV": "no"}
    assert all(settings[k].startswith("/scratch/enroot/") for k in
               ("ENROOT_RUNTIME_PATH", "ENROOT_CACHE_PATH", "ENROOT_DATA_PATH", "ENROOT_TEMP_PATH"))


def test_scripts_carry_the_configuration_verbatim(scenario):
    scripts = render_node_scripts(scenario)
    head, compute = scripts["head-node.sh"], scripts["compute-node.sh"]
    assert f"PYXIS_CONF={shlex.quote(pyxis_conf())}\n" in head
    assert f"PLUGSTACK_CONF={shlex.quote(plugstack_conf())}\n" in head
    assert f"ENROOT_BLOCK={shlex.quote(enroot_block(scenario.aws.enroot.local_dir))}\n" in compute
    assert "/opt/parallelcluster/examples" not in head  # our own files, not the samples copied


def test_containers_cache_is_on_the_nvme(scenario, make_project):
    assert scenario.aws.enroot.containers_cache == "/scratch/containers-cache"
    assert 'CONTAINERS_CACHE="$LOCAL_DIR"/containers-cache\n' in render_node_scripts(scenario)["compute-node.sh"]

    def nvme(raw):
        raw["aws"]["enroot"] = {"local_dir": "/local nvme".replace(" ", "_")}
    assert make_project(nvme).aws.enroot.containers_cache == f"/local_nvme/{CONTAINERS_CACHE_NAME}"


def test_head_node_gets_docker_and_the_build_volume(scenario, make_project):
    head = build_cluster_config(scenario)["HeadNode"]
    assert head["LocalStorage"]["RootVolume"]["Size"] == HEAD_ROOT_VOLUME_GB == 500
    text = render_node_scripts(scenario)["head-node.sh"]
    assert "DOCKER=yes\n" in text and "DOCKER_DATA_ROOT=/var/lib/docker\n" in text

    def no_docker(raw):
        raw["aws"]["head_node"]["docker"] = False
        raw["aws"]["head_node"]["docker_data_root"] = "/fsx/data/docker"  # not checked when Docker is off
    assert "DOCKER=no\n" in render_node_scripts(make_project(no_docker))["head-node.sh"]

    def hostile(raw):
        raw["aws"]["head_node"]["docker_data_root"] = "/data/docker-root.1"
    assert "DOCKER_DATA_ROOT=/data/docker-root.1\n" in render_node_scripts(make_project(hostile))["head-node.sh"]


@pytest.mark.parametrize("root, message", [
    ("/fsx/checkpoints/docker", "is on the FSx for Lustre mount /fsx/checkpoints"),
    ("relative/docker", "must be an absolute path"),
    ("/var/lib/docker; rm -rf /", "must be an absolute path"),
    ("/var", "is a system directory"),
])
def test_docker_data_root_refusals_name_the_field(make_project, root, message):
    def edit(raw):
        raw["aws"]["head_node"]["docker_data_root"] = root
    with pytest.raises(ConfigError) as err:
        make_project(edit)
    assert "docker_data_root" in str(err.value) and message in str(err.value)


def test_setup_dirs_creates_a_benchmark_directory_on_every_mount(scenario):
    layout = storage_layout(scenario)
    dirs = model_dirs(scenario)
    expected = [f"{m}/p5e-80x7/validation/{BENCH_DIR_NAME}" for m in layout.mounts]
    assert len(expected) == 3 and all(d in dirs for d in expected)
    for d in expected:  # its parents too, below the mount, so each gets the owner and mode
        assert str(Path(d).parent) in dirs and dirs.index(str(Path(d).parent)) < dirs.index(d)
    assert str(layout.bench_dir("/fsx/data")) == "/fsx/data/p5e-80x7/validation/storage-bench"
    text = render_node_scripts(scenario)["setup-dirs.sh"]
    assert all(f"  {d}\n" in text for d in expected)
