"""The trainer's rank value: :mod:`clustertrain.core.ranks`' rules, seen from train/ (the rules themselves are
tested in tests/unit/test_ranks.py)."""

import pytest

from clustertrain.core.ranks import RankError, port_for_job
from clustertrain.core.ranks import RankInfo


def test_torchrun_env_wins_over_slurm():
    env = RankInfo.from_environ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.1",
                                "MASTER_PORT": "1234", "SLURM_PROCID": "7", "SLURM_NTASKS": "16"})
    assert (env.rank, env.world_size, env.local_rank, env.master_addr, env.master_port, env.source) == (
        1, 2, 1, "10.0.0.1", 1234, "torchrun")


def test_slurm_env_derives_master_from_nodelist_and_job_id():
    env = RankInfo.from_environ({"SLURM_PROCID": "9", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
                                "SLURM_TASKS_PER_NODE": "8(x2)", "SLURM_JOB_NODELIST": "p5-st-[03-04]",
                                "SLURM_JOB_ID": "4242"})
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size, env.node_rank, env.source) == (
        9, 16, 1, 8, 1, "slurm")
    assert env.master_addr == "p5-st-03"
    assert env.master_port == port_for_job("4242") == 24242


def test_outside_a_job_is_one_process():
    env = RankInfo.from_environ({"PATH": "/bin"})
    assert (env.rank, env.world_size, env.master_addr, env.master_port, env.source) == (0, 1, "127.0.0.1", 29500, "single")


def test_bad_rank_env_is_a_user_error():
    with pytest.raises(RankError, match="outside world size"):
        RankInfo.from_environ({"RANK": "2", "WORLD_SIZE": "2"})
    with pytest.raises(RankError, match="RANK='x' is not an integer"):
        RankInfo.from_environ({"RANK": "x", "WORLD_SIZE": "2"})


def test_a_peer_that_left_is_recognised_in_gloo_and_nccl_errors():
    from clustertrain.train.entry import _lost_peer

    gloo = RuntimeError("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by "
                        "peer [127.0.0.1]:43213. This is typically caused by a remote worker crashing.\nmore")
    assert _lost_peer(gloo).startswith("[/__w/pytorch") and _lost_peer(gloo).endswith("remote worker crashing.")
    assert _lost_peer(RuntimeError("NCCL error: remote process exited or there was a network error")) != ""
    assert _lost_peer(ValueError("shape mismatch")) == "" and _lost_peer(None) == ""
