"""The rank payload on its own: three ranks (threads with their own Slurm environments) meet at a real TCP
rendezvous and record what they saw; one directory is visible to one node only, one port is taken."""

from __future__ import annotations

import json
import socket
import threading

from clustertrain.check import SECRET_NAME_RE, SECRET_RE
from clustertrain.rehearsal.payload import run


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spec_for(tmp_path, write, read=(), hold_s=0.0, rendezvous_s=10.0) -> dict:
    (tmp_path / "records").mkdir(exist_ok=True)
    return {"model": "m", "records": str(tmp_path / "records"), "holding": str(tmp_path / "holding"),
            "release": str(tmp_path / "release"), "hold_s": hold_s, "rendezvous_s": rendezvous_s, "write": [str(w) for w in write],
            "read": [str(r) for r in read], "expect_env": ["NCCL_DEBUG"], "secret_name_re": SECRET_NAME_RE.pattern,
            "secret_value_re": SECRET_RE.pattern}


def rank_env(rank: int, node: str, port: int, **extra: str) -> dict[str, str]:
    # ranks 0, 1 on node1; rank 2 on node2
    return {"SLURM_PROCID": str(rank), "SLURM_NTASKS": "3", "SLURM_LOCALID": str(rank % 2 if rank < 2 else 0),
            "SLURM_NODEID": "0" if rank < 2 else "1", "SLURM_TASKS_PER_NODE": "2,1", "SLURM_JOB_ID": "7",
            "SLURM_JOB_NODELIST": "node[1-2]", "SLURMD_NODENAME": node, "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port), "CUDA_VISIBLE_DEVICES": "0,1", "NCCL_DEBUG": "WARN", **extra}


def run_ranks(spec: dict, envs: list[dict]) -> list[int]:
    codes = [None] * len(envs)

    def one(i):
        codes[i] = run(spec, envs[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(envs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return codes


def records(tmp_path) -> dict[int, dict]:
    return {r["rank"]: r for r in (json.loads(p.read_text()) for p in (tmp_path / "records").glob("rank-*.json"))}


def test_three_ranks_meet_and_see_each_others_markers(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    port = free_port()
    envs = [rank_env(0, "node1", port), rank_env(1, "node1", port), rank_env(2, "node2", port)]
    assert run_ranks(spec_for(tmp_path, [shared], read=[shared, tmp_path / "absent"]), envs) == [0, 0, 0]
    recs = records(tmp_path)
    assert sorted(recs) == [0, 1, 2]
    assert recs[0]["rendezvous"] == {"ok": True, "error": None, "seen": 3, "missing": [], "duplicates": []}
    assert all(r["rendezvous"]["ok"] for r in recs.values())
    assert recs[2]["local_world"] == 1 and recs[0]["local_world"] == 2 and recs[1]["node_rank"] == 0
    assert all(r["write"][str(shared)]["missing_nodes"] == [] for r in recs.values())  # both nodes' markers seen
    assert recs[1]["read"] == {str(shared): True, str(tmp_path / "absent"): False}
    assert recs[0]["env"]["NCCL_DEBUG"] == "WARN" and recs[0]["gpus"]["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert (tmp_path / "holding").exists()  # rank 0 held (hold_s=0: at once released)


def test_a_node_whose_marker_is_not_seen_and_a_leaked_secret_are_recorded(tmp_path):
    here = tmp_path / "dir"
    here.mkdir()
    port = free_port()
    # a job on node[1-2] whose node2 marker never appears (as for a directory off the shared file system)
    envs = [rank_env(r, "node1", port, SLURM_NTASKS="2", SLURM_TASKS_PER_NODE="2",
                     **({"AWS_SECRET_ACCESS_KEY": "s3cr3t-value"} if r else {})) for r in (0, 1)]
    assert run_ranks(spec_for(tmp_path, [here]), envs) == [0, 0]
    recs = records(tmp_path)
    assert recs[0]["write"][str(here)]["missing_nodes"] == ["node2"]
    assert recs[1]["secrets"] == ["AWS_SECRET_ACCESS_KEY"] and recs[0]["secrets"] == []
    assert "s3cr3t-value" not in (tmp_path / "records" / "rank-1.json").read_text()


def test_a_taken_port_is_rank_zeros_error_and_peers_give_up(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        envs = [rank_env(0, "node1", port), rank_env(2, "node2", port)]
        run_ranks(spec_for(tmp_path, [], rendezvous_s=1.0), envs)
    recs = records(tmp_path)
    assert "cannot listen" in recs[0]["rendezvous"]["error"] and recs[0]["rendezvous"]["ok"] is False
    assert recs[2]["rendezvous"]["ok"] is False and "could not reach rank 0" in recs[2]["rendezvous"]["error"]
