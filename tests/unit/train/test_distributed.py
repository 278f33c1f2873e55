from clustertrain.train.distributed import RankEnv, expand_hostlist, first_host, port_for_job

import pytest

from clustertrain.errors import ConfigError


def test_torchrun_env_wins_over_slurm():
    env = RankEnv.from_environ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.1",
                                "MASTER_PORT": "1234", "SLURM_PROCID": "7", "SLURM_NTASKS": "16"})
    assert (env.rank, env.world_size, env.local_rank, env.master_addr, env.master_port, env.source) == (
        1, 2, 1, "10.0.0.1", 1234, "torchrun")


def test_slurm_env_derives_master_from_nodelist_and_job_id():
    env = RankEnv.from_environ({"SLURM_PROCID": "9", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1",
                                "SLURM_JOB_NODELIST": "p5-st-[03-04]", "SLURM_JOB_ID": "4242"})
    assert (env.rank, env.world_size, env.local_rank, env.source) == (9, 16, 1, "slurm")
    assert env.master_addr == "p5-st-03"
    assert env.master_port == port_for_job("4242") == 24242


def test_hostlist_expansion():
    assert expand_hostlist("node[1-3,5],gpu-[01-02],cpu1") == ["node1", "node2", "node3", "node5", "gpu-01", "gpu-02", "cpu1"]
    assert first_host("queue1-dy-p5-[10-12]") == "queue1-dy-p5-10"
    assert first_host("") is None


def test_bad_rank_env_is_a_user_error():
    with pytest.raises(ConfigError, match="outside world size"):
        RankEnv.from_environ({"RANK": "2", "WORLD_SIZE": "2"})
    with pytest.raises(ConfigError, match="must be integers"):
        RankEnv.from_environ({"RANK": "x", "WORLD_SIZE": "2"})
