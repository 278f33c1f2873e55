"""NCCL/EFA presets: lookup by instance family, scale and OS, project overrides, and the data file itself.

The preset holds only what the current aws-ofi-nccl asks users to set (its doc/efa-env-var.md and
src/platform-aws.cpp): the old preset set FI_PROVIDER, FI_EFA_USE_DEVICE_RDMA, FI_EFA_FORK_SAFE, NCCL_BUFFSIZE,
NCCL_P2P_NET_CHUNKSIZE (all set by the plugin itself on p5/p5e) and an NCCL_TUNER_PLUGIN path that does not
exist on alinux2023 (and makes the plugin skip its own tuner setup)."""

from __future__ import annotations

import pytest

from clustertrain.launch.config import LaunchConfig
from clustertrain.launch.presets import PRESETS_FILE, discouraged, load_presets, preset_of, rank_environment
from clustertrain.plan.catalog import read_catalog

PLUGIN_SETS = ("FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA", "FI_EFA_FORK_SAFE", "NCCL_BUFFSIZE", "NCCL_P2P_NET_CHUNKSIZE",
               "NCCL_TUNER_PLUGIN", "NCCL_PROTO", "NCCL_ALGO")


@pytest.mark.parametrize("itype,preset", [("p5.48xlarge", ("p5", True)), ("p5e.48xlarge", ("p5e", True)),
                                          ("p5en.48xlarge", ("p5en", True)), ("p4d.24xlarge", ("p4d", True)),
                                          ("p4de.24xlarge", ("p4d", True)), ("ml.p4d.24xlarge", ("p4d", True)),
                                          ("P5.48XLARGE", ("p5", True)), ("g5.12xlarge", (None, True)),
                                          ("c6i.4xlarge", (None, False)), ("p5.4xlarge", (None, False)),
                                          (None, (None, False)), ("", (None, False)), ("weird", (None, False))])
def test_preset_and_efa_come_from_the_instance_catalog(itype, preset):
    assert preset_of(itype) == preset


def test_catalog_presets_and_preset_families_match():
    """Every nccl_preset the catalog names exists here, every family here is some instance's preset."""
    named = {i.nccl_preset for i in read_catalog().instances.values() if i.nccl_preset}
    assert named == set(load_presets()["families"])


@pytest.mark.parametrize("itype,family", [("p5.48xlarge", "p5"), ("p5e.48xlarge", "p5e"), ("p5en.48xlarge", "p5en"),
                                          ("p4d.24xlarge", "p4d"), ("p4de.24xlarge", "p4d")])
@pytest.mark.parametrize("nodes", [2, 14])
def test_no_efa_family_sets_what_the_plugin_sets_itself(itype, family, nodes):
    env = rank_environment(itype, nodes, os="alinux2023")
    assert env.efa and env.family == family
    assert not set(PLUGIN_SETS) & set(env.set), env.set
    assert env.set["NCCL_SOCKET_IFNAME"] == "^docker,lo,veth"


@pytest.mark.parametrize("os,libdir", [("alinux2023", "lib64"), ("rhel9", "lib64"), ("rocky8", "lib64"),
                                       ("ubuntu2204", "lib"), ("ubuntu2404", "lib")])
def test_library_directories_follow_the_os_package_layout(os, libdir):
    env = rank_environment("p5e.48xlarge", 11, os=os)
    assert env.prepend["LD_LIBRARY_PATH"] == [f"/opt/amazon/efa/{libdir}", f"/opt/amazon/ofi-nccl/{libdir}"]
    assert not any("x86_64-linux-gnu" in d for d in env.prepend["LD_LIBRARY_PATH"])  # the pre-1.17 Debian layout


def test_nothing_is_prepended_in_a_container_or_when_the_os_is_unknown():
    assert rank_environment("p5e.48xlarge", 11, os="alinux2023", container=True).prepend == {}
    assert rank_environment("p5e.48xlarge", 11).prepend == {}


def test_every_aws_os_has_a_layout():
    from typing import get_args

    from clustertrain.cloud.config import AwsConfig

    oses = get_args(AwsConfig.model_fields["os"].annotation)
    assert set(oses) == set(load_presets()["os_layout"]), "add the new aws.os value to os_layout in nccl_presets.yaml"


def test_scale_switches_at_small_max_nodes():
    assert load_presets()["small_max_nodes"] == 2
    assert rank_environment("p5.48xlarge", 2).set["NCCL_DEBUG"] == "INFO"
    large = rank_environment("p5.48xlarge", 3)
    assert (large.scale, large.set["NCCL_DEBUG"]) == ("large", "WARN")


def test_project_overrides_win_and_null_removes():
    launch = LaunchConfig(env={"NCCL_DEBUG": "TRACE", "NCCL_SOCKET_IFNAME": None, "LD_LIBRARY_PATH": "/x", "EXTRA": "1"})
    env = rank_environment("p5e.48xlarge", 2, launch, os="ubuntu2204")
    assert env.set["NCCL_DEBUG"] == "TRACE" and env.set["EXTRA"] == "1" and env.set["LD_LIBRARY_PATH"] == "/x"
    assert "NCCL_SOCKET_IFNAME" not in env.set and "LD_LIBRARY_PATH" not in env.prepend


def test_unknown_or_missing_instance_type_has_no_preset_but_keeps_overrides():
    env = rank_environment("g5.12xlarge", 1, LaunchConfig(env={"A": "b"}), os="alinux2023")  # EFA, but no preset
    assert (env.set, env.prepend, env.efa, env.family) == ({"A": "b"}, {}, False, None)
    assert rank_environment("p5.4xlarge", 1).family is None  # a family's other sizes are not guessed
    assert rank_environment(None, 4).set == {}


def test_data_file_names_its_sources_and_what_it_does_not_set():
    text = PRESETS_FILE.read_text()
    for marker in ("doc/efa-env-var.md", "src/platform-aws.cpp", "aws-ofi-nccl.spec", "debian-template/rules",
                   "awsome-distributed-training", "Deliberately NOT set"):
        assert marker in text
    header = text.split("version: 2")[0]
    for name in PLUGIN_SETS:  # each variable the preset no longer sets is explained
        assert name in header, name
    data = load_presets()
    assert set(discouraged()) >= {"NCCL_TUNER_PLUGIN", "FI_PROVIDER", "NCCL_BUFFSIZE"}
    for family, spec in data["families"].items():
        assert set(spec) <= {"all", "small", "large"}, family  # settings only: EFA is an instance fact (the catalog)
        for layer in ("all", "small", "large"):
            for value in ((spec.get(layer) or {}).get("env") or {}).values():
                assert isinstance(value, str), (family, layer, value)
