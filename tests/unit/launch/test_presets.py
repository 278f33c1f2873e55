"""NCCL/EFA presets: lookup by instance family and scale, project overrides, and the data file itself."""

from __future__ import annotations

import pytest

from clustertrain.launch.config import LaunchConfig
from clustertrain.launch.presets import PRESETS_FILE, family_of, load_presets, rank_environment

TUNER = "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu/libnccl-ofi-tuner.so"


@pytest.mark.parametrize("itype,family", [("p5.48xlarge", "p5"), ("p5e.48xlarge", "p5e"), ("p5en.48xlarge", "p5en"),
                                          ("p4d.24xlarge", "p4d"), ("ml.p4d.24xlarge", "p4d"), ("P5.48XLARGE", "p5"),
                                          (None, None), ("", None), ("weird", None)])
def test_family_of(itype, family):
    assert family_of(itype) == family


@pytest.mark.parametrize("family", ["p5", "p5e", "p5en", "p4d"])
def test_every_efa_family_gets_the_efa_basics(family):
    env = rank_environment(f"{family}.48xlarge", 2)
    assert env.efa and env.family == family and env.scale == "small"
    for key, value in {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_FORK_SAFE": "1",
                       "NCCL_SOCKET_IFNAME": "^docker,lo,veth", "NCCL_DEBUG": "INFO"}.items():
        assert env.set[key] == value, key
    assert env.prepend["LD_LIBRARY_PATH"] == ["/opt/amazon/efa/lib", "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu"]


def test_scale_switches_at_small_max_nodes():
    assert load_presets()["small_max_nodes"] == 2
    assert rank_environment("p5.48xlarge", 2).set["NCCL_DEBUG"] == "INFO"
    large = rank_environment("p5.48xlarge", 3)
    assert (large.scale, large.set["NCCL_DEBUG"]) == ("large", "WARN")


def test_hopper_families_use_the_tuner_and_buffers_p4d_does_not():
    for family in ("p5", "p5e", "p5en"):
        env = rank_environment(f"{family}.48xlarge", 16).set
        assert (env["NCCL_TUNER_PLUGIN"], env["NCCL_BUFFSIZE"], env["NCCL_P2P_NET_CHUNKSIZE"]) == (TUNER, "8388608", "524288")
    p4d = rank_environment("p4d.24xlarge", 16).set
    assert "NCCL_TUNER_PLUGIN" not in p4d and "NCCL_BUFFSIZE" not in p4d


def test_project_overrides_win_and_null_removes():
    launch = LaunchConfig(env={"NCCL_DEBUG": "TRACE", "NCCL_TUNER_PLUGIN": None, "LD_LIBRARY_PATH": "/x", "EXTRA": "1"})
    env = rank_environment("p5e.48xlarge", 2, launch)
    assert env.set["NCCL_DEBUG"] == "TRACE" and env.set["EXTRA"] == "1" and env.set["LD_LIBRARY_PATH"] == "/x"
    assert "NCCL_TUNER_PLUGIN" not in env.set and "LD_LIBRARY_PATH" not in env.prepend


def test_unknown_or_missing_instance_type_has_no_preset_but_keeps_overrides():
    env = rank_environment("g5.12xlarge", 1, LaunchConfig(env={"A": "b"}))
    assert (env.set, env.prepend, env.efa, env.family) == ({"A": "b"}, {}, False, "g5")
    assert rank_environment(None, 4).set == {}


def test_data_file_names_its_sources_and_what_was_not_copied():
    text = PRESETS_FILE.read_text()
    for marker in ("docs.aws.amazon.com", "aws-ofi-nccl", "awsome-distributed-training", "deliberately NOT copied",
                   "NCCL_PROTO=simple"):
        assert marker in text
    data = load_presets()
    for family, spec in data["families"].items():
        assert set(spec) <= {"efa", "all", "small", "large"}, family
        # every value in the file is a comment-annotated string, not a YAML number that could lose digits
        for layer in ("all", "small", "large"):
            for value in ((spec.get(layer) or {}).get("env") or {}).values():
                assert isinstance(value, str), (family, layer, value)
