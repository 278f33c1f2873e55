"""The rehearsal's checks over hand-built observations: each passes on a healthy rehearsal and names the model,
node, rank, path or script of each failure mode."""

from __future__ import annotations

from pathlib import Path

from clustertrain.rehearsal.checks import MAX_DETAILS, TITLES, hostlist, ranges, run_checks
from clustertrain.rehearsal.observed import JobView, Observed, job_allocation

ORDER = ["booted", "concurrent", "world", "rendezvous", "one_gpu", "gpus_unshared", "shares", "dirs", "paths",
         "preset", "secrets"]
ENV = {"NCCL_SOCKET_IFNAME": "lo", "FI_PROVIDER": "efa"}
FAKE_KEY = "AKIA" + "EXAMPLEKEY123456"  # built here so no file holds one


def make_records(model: str, nodes: list[str], rpn: int = 2, port: int = 29500, gpus: bool = True,
                 write: tuple[str, ...] = (), read: tuple[str, ...] = ()) -> list[dict]:
    """One healthy record per rank of a job on ``nodes`` (payload.py's format)."""
    world, out = len(nodes) * rpn, []
    for n, node in enumerate(nodes):
        for local in range(rpn):
            out.append({
                "version": 1, "model": model, "node": node, "job_id": "1", "rank": n * rpn + local, "world": world,
                "local_rank": local, "local_world": rpn, "node_rank": n, "source": "slurm",
                "master_addr": nodes[0], "master_port": port, "job_nodes": nodes,
                "gpus": {"CUDA_VISIBLE_DEVICES": ",".join(map(str, range(rpn))) if gpus else None,
                         "SLURM_JOB_GPUS": None, "SLURM_STEP_GPUS": None, "GPU_DEVICE_ORDINAL": None},
                "env": dict(ENV), "env_names": sorted(ENV), "secrets": [],
                "write": {d: {"exists": True, "error": None, "missing_nodes": []} for d in write},
                "read": {p: True for p in read},
                "rendezvous": {"ok": True, "error": None, "seen": world, "missing": [], "duplicates": []},
                "error": None})
    return out


def make_job(model: str, nodes: list[str], job_id: str, port: int, rpn: int = 2, gpus: int = 2) -> JobView:
    dirs = {"run": f"/fsx/ckpt/p/{model}", "logs": f"/fsx/logs/p/logs/{model}",
            "tensorboard": f"/fsx/logs/p/tb/{model}"}
    read = ("/fsx/data/tokenizers/t.json",)
    return JobView(model=model, planned_nodes=len(nodes), gpus_per_node=gpus, ranks_per_node=rpn, partition="gpu",
                   job_id=job_id, snapshot_state="RUNNING", nodes=list(nodes), job_partition="gpu",
                   expect_env=dict(ENV), write_dirs=list(dirs.values()), read_paths=list(read), dirs=dirs,
                   records=make_records(model, nodes, rpn, port, gpus > 0, tuple(dirs.values()), read))


def healthy() -> Observed:
    nodes = [f"gpu-st-x-{i}" for i in range(1, 5)]
    boots = {n: {"state": "booted", "phases": [], "error": None} for n in [*nodes, "head"]}
    jobs = [make_job("model-a", nodes[:2], "11", 29501), make_job("model-b", nodes[2:], "12", 29502)]
    return Observed(nodes=nodes, boots=boots, jobs=jobs, texts=[("sbatch model-a.sh", "#!/bin/bash\nsrun x\n")])


def by_name(obs: Observed) -> dict:
    return {c.name: c for c in run_checks(obs)}


def failing(obs: Observed, name: str) -> str:
    check = by_name(obs)[name]
    assert check.ok is False, (name, check)
    others = [c.name for c in run_checks(obs) if c.ok is not True and c.name != name]
    return "\n".join(check.details) + "\n--others: " + ",".join(others)


def test_healthy_rehearsal_passes_every_check_in_order():
    checks = run_checks(healthy())
    assert [c.name for c in checks] == ORDER
    assert [c.name for c in checks if c.ok is not True] == []
    assert all(c.title == TITLES[c.name] and "\n" not in c.title for c in checks)


def test_helpers_compact_nodes_and_ranks():
    assert hostlist([f"q-st-x-{i}" for i in (3, 1, 2, 7)] + ["head"]) == "q-st-x-[1-3,7],head"
    assert ranges([5, 0, 1, 2, 9, 10]) == "0-2,5,9-10"


def test_booted_groups_identical_errors_and_names_the_script():
    obs = healthy()
    for i, n in enumerate(obs.nodes[:3]):
        obs.boots[n] = {"state": "failed", "error": f"OnNodeStart script compute-node.sh exited 1 after {i}.5s: "
                        f"mount /fsx/data failed on {n}"}
    del obs.boots["head"]
    details = failing(obs, "booted")
    assert "gpu-st-x-[1-3] (3 nodes): OnNodeStart script compute-node.sh exited 1: mount /fsx/data failed on <node>" \
        in details
    assert "head: no boot result" in details and "gpu-st-x-4" not in details


def test_booted_single_failure_keeps_its_own_error():
    obs = healthy()
    obs.boots["gpu-st-x-2"] = {"state": "failed", "error": "OnNodeConfigured script cfg.sh exited 3 after 1.0s: boom"}
    obs.boots["gpu-st-x-4"] = {"state": "booting", "phases": [{"phase": "init"}], "error": None}
    details = by_name(obs)["booted"].details
    assert details == ["gpu-st-x-2: OnNodeConfigured script cfg.sh exited 3 after 1.0s: boom",
                       "gpu-st-x-4: still booting after phase init"]


def test_concurrent_failure_modes():
    obs = healthy()
    a, b = obs.jobs
    a.nodes = a.nodes[:1]
    b.job_partition = "cpu"
    pending = JobView("model-c", 2, 2, 2, "gpu", job_id="13", snapshot_state="PENDING", reason="Resources")
    unsubmitted = JobView("model-d", 2, 2, 2, "gpu", submit_error="sbatch: error: invalid partition")
    ended = JobView("model-e", 2, 2, 2, "gpu", job_id="15", snapshot_state="FAILED", nodes=["gpu-st-x-1"],
                    output_tail="starting\nImportError: no module named x\n")
    obs.jobs += [pending, unsubmitted, ended]
    details = failing(obs, "concurrent")
    assert "model-a (job 11) ran on 1 node, the plan allocates 2" in details
    assert "model-b (job 12) ran in partition cpu, the script asks for gpu" in details
    assert "model-c (job 13) pending: Reason=Resources" in details
    assert "model-d not submitted: sbatch: error: invalid partition" in details
    assert "model-e (job 15) ended FAILED before all jobs ran: ImportError: no module named x" in details


def test_world_counts_missing_duplicate_and_wrong_world():
    obs = healthy()
    a, b = obs.jobs
    a.records = [r for r in a.records if r["rank"] != 3]
    b.records[1]["rank"] = 0
    for r in b.records:
        r["world"] = 2
    b.records.append({"model": "model-b", "node": "gpu-st-x-4", "error": "SLURM_PROCID is not an integer"})
    details = failing(obs, "world")
    assert "model-a (job 11): 3 rank records, expected 4 (2 nodes x 2 ranks)" in details
    assert "model-a: no record from 1 rank (3) of 4" in details
    assert "model-b: rank 0 recorded 2 times (on gpu-st-x-3, gpu-st-x-3)" in details
    assert "model-b: 4 ranks (0,2-3) on gpu-st-x-[3-4] (2 nodes) report world 2, the plan has 4" in details
    assert "model-b: 1 rank on gpu-st-x-4 failed: SLURM_PROCID is not an integer" in details


def test_rendezvous_rank0_error_and_grouped_peer_failures():
    obs = healthy()
    a = obs.jobs[0]
    a.records[0]["rendezvous"] = {"ok": False, "error": "rank 0 cannot listen on gpu-st-x-1:29501: Address in use"}
    for r in a.records[1:]:
        r["rendezvous"] = {"ok": False, "error": "could not reach rank 0 at gpu-st-x-1:29501 within 60s: refused"}
    details = failing(obs, "rendezvous")
    assert "model-a: rank 0 on gpu-st-x-1: rank 0 cannot listen on gpu-st-x-1:29501: Address in use" in details
    assert "model-a: 3 ranks (1-3) on gpu-st-x-[1-2] (2 nodes): could not reach rank 0" in details
    assert "model-b" not in details.split("--others")[0]


def test_rendezvous_disagreement_and_shared_port():
    obs = healthy()
    a, b = obs.jobs
    a.records[3]["master_port"] = 1234
    for r in b.records:
        r["master_addr"], r["master_port"] = "gpu-st-x-1", 29501
    details = failing(obs, "rendezvous")
    assert "model-a: ranks disagree on the rendezvous: gpu-st-x-1:29501 (ranks 0-2), gpu-st-x-1:1234 (ranks 3)" \
        in details
    assert "model-a (job 11) and model-b (job 12) ran at the same time with the same rendezvous gpu-st-x-1:29501" \
        in details


def test_one_gpu_unset_devices_names_the_missing_request():
    obs = healthy()
    for r in obs.jobs[0].records:
        r["gpus"]["CUDA_VISIBLE_DEVICES"] = None
    details = failing(obs, "one_gpu")
    assert ("model-a: 4 ranks (0-3) on gpu-st-x-[1-2] (2 nodes) saw no GPU (CUDA_VISIBLE_DEVICES unset): "
            "the batch script requests none (--gpus-per-node / --gres)") in details
    assert "model-b" not in details.split("--others")[0]


def test_one_gpu_more_devices_than_ranks_and_local_rank_beyond():
    obs = healthy()
    for r in obs.jobs[0].records:
        r["gpus"]["CUDA_VISIBLE_DEVICES"] = "0,1,2,3,4,5,6,7"
    for r in obs.jobs[1].records:
        r["gpus"]["CUDA_VISIBLE_DEVICES"] = "0"
    details = failing(obs, "one_gpu")
    assert "model-a: 4 ranks (0-3) on gpu-st-x-[1-2] (2 nodes) see 8 GPUs for 2 ranks on their node" in details
    assert "model-b: 2 ranks (1,3) on gpu-st-x-[3-4] (2 nodes) have a local rank beyond the 1 GPU they see" in details


def test_gpu_checks_pass_without_gpus():
    obs = healthy()
    for job in obs.jobs:
        job.gpus_per_node = 0
        for r in job.records:
            r["gpus"]["CUDA_VISIBLE_DEVICES"] = None
    checks = by_name(obs)
    for name in ("one_gpu", "gpus_unshared"):
        assert checks[name].ok is True and "no GPUs requested" in checks[name].details[0]


def test_gpus_unshared_names_both_models_and_ranks():
    obs = healthy()
    b = obs.jobs[1]
    for r in b.records:
        r["node"] = {"gpu-st-x-3": "gpu-st-x-1", "gpu-st-x-4": "gpu-st-x-2"}[r["node"]]
    details = failing(obs, "gpus_unshared")
    assert ("model-a and model-b share 4 GPUs on gpu-st-x-[1-2] (2 nodes), e.g. gpu-st-x-1 GPU 0: "
            "model-a rank 0 and model-b rank 0") in details


def test_gpus_unshared_within_one_job():
    obs = healthy()
    for r in obs.jobs[0].records:
        r["gpus"]["CUDA_VISIBLE_DEVICES"], r["local_world"], r["local_rank"] = "0", 1, 0
    details = failing(obs, "gpus_unshared")
    assert "ranks of model-a share 2 GPUs on gpu-st-x-[1-2] (2 nodes), e.g. gpu-st-x-1 GPU 0: model-a rank 0 and " \
           "model-a rank 1" in details


def test_dirs_shared_run_dir_nested_and_off_shared():
    obs = healthy()
    a, b = obs.jobs
    b.dirs["run"] = a.dirs["run"]
    b.dirs["tensorboard"] = a.dirs["logs"] + "/tb"
    a.off_shared = ["/scratch/model-a (storage.checkpoints)"]
    details = failing(obs, "dirs")
    assert "model-a and model-b both write /fsx/ckpt/p/model-a (model-a run, model-b run)" in details
    assert "model-a logs /fsx/logs/p/logs/model-a and model-b tensorboard /fsx/logs/p/logs/model-a/tb: one is " \
           "inside the other" in details
    assert "model-a: /scratch/model-a (storage.checkpoints) is on no shared file system" in details


def test_paths_unshared_write_dir_and_missing_read():
    obs = healthy()
    a = obs.jobs[0]
    run = a.dirs["run"]
    for r in a.records:
        other = "gpu-st-x-2" if r["node"] == "gpu-st-x-1" else "gpu-st-x-1"
        r["write"][run]["missing_nodes"] = [other]
    for r in a.records:
        if r["node"] == "gpu-st-x-2":
            r["read"]["/fsx/data/tokenizers/t.json"] = False
    b = obs.jobs[1]
    for r in b.records:
        r["write"][b.dirs["logs"]]["missing_nodes"] = ["gpu-st-x-3"] if r["node"] == "gpu-st-x-4" else []
        if r["node"] == "gpu-st-x-3":
            r["write"][b.dirs["logs"]]["error"] = "Permission denied"
    details = failing(obs, "paths")
    assert "model-a: /fsx/ckpt/p/model-a written on gpu-st-x-[1-2] (2 nodes) is not visible on 1 other node of its " \
           "job each" in details
    assert "model-a: /fsx/data/tokenizers/t.json not visible on gpu-st-x-2 (read)" in details
    assert "model-b: /fsx/logs/p/logs/model-b written on gpu-st-x-3 is not visible on 1 other node of its job" \
        in details
    assert "model-b: /fsx/logs/p/logs/model-b on gpu-st-x-3: Permission denied (write)" in details


def test_paths_write_dir_that_does_not_exist():
    obs = healthy()
    tb = obs.jobs[1].dirs["tensorboard"]
    for r in obs.jobs[1].records:
        r["write"][tb]["exists"] = False
    details = failing(obs, "paths")
    assert "model-b: /fsx/logs/p/tb/model-b does not exist on gpu-st-x-[3-4] (2 nodes) (write)" in details


def test_preset_names_variable_expected_and_seen():
    obs = healthy()
    for r in obs.jobs[0].records:
        if r["node"] == "gpu-st-x-2":
            del r["env"]["FI_PROVIDER"]
        r["env"]["NCCL_SOCKET_IFNAME"] = "eth0"
    details = failing(obs, "preset")
    assert "model-a: FI_PROVIDER expected 'efa', 2 ranks of 4 saw unset (on gpu-st-x-2)" in details
    assert "model-a: NCCL_SOCKET_IFNAME expected 'lo', 4 ranks of 4 saw 'eth0' (on gpu-st-x-[1-2] (2 nodes))" \
        in details


def test_secrets_in_texts_and_in_rank_environment():
    obs = healthy()
    obs.texts.append(("boot log gpu-st-x-1 OnNodeStart-compute-node.sh", f"key={FAKE_KEY}\n"))
    obs.texts.append(("sbatch model-b.sh", "-----BEGIN RSA PRIVATE KEY-----\n"))
    obs.jobs[0].records[0]["secrets"] = ["AWS_SECRET_ACCESS_KEY"]
    details = failing(obs, "secrets")
    assert "boot log gpu-st-x-1 OnNodeStart-compute-node.sh: holds what looks like an AWS access key" in details
    assert "sbatch model-b.sh: holds what looks like" in details
    assert FAKE_KEY not in details
    assert ("model-a: variables that look like credentials reached the ranks: AWS_SECRET_ACCESS_KEY (from the "
            "submitting shell: sbatch exports it by default)") in details


def test_checks_reuse_the_credential_patterns_of_clustertrain_check():
    import clustertrain.rehearsal.checks as checks

    source = Path(checks.__file__).read_text()
    assert "from clustertrain.check import SECRET_RE" in source and "AKIA" not in source


def test_skipped_rehearsal_marks_the_job_checks_not_run():
    obs = healthy()
    obs.boots["gpu-st-x-1"] = {"state": "failed", "error": "OnNodeStart script compute-node.sh exited 1 after 1s: x"}
    obs.skipped = "the jobs were not run: 1 node did not boot"
    obs.texts.append(("sbatch model-a.sh", FAKE_KEY))
    checks = run_checks(obs)
    assert [c.name for c in checks] == ORDER
    middle = checks[1:10]
    assert all(c.ok is None and c.details == [obs.skipped] for c in middle)
    assert checks[0].ok is False and checks[10].ok is False


def test_no_job_ran_leaves_the_job_checks_not_run():
    obs = healthy()
    for job in obs.jobs:
        job.snapshot_state, job.reason, job.nodes, job.records = "PENDING", "Priority", [], []
    checks = by_name(obs)
    assert checks["concurrent"].ok is False
    for name in ("world", "rendezvous", "one_gpu", "gpus_unshared", "paths", "preset"):
        assert checks[name].ok is None and checks[name].details == ["no job ran (see concurrent)"], name
    assert checks["dirs"].ok is True


def test_details_are_capped():
    obs = healthy()
    names = [f"gpu-st-x-{i}" for i in range(1, 41)]
    obs.nodes = names
    obs.boots = {n: {"state": "failed", "error": f"OnNodeStart script s{i}.sh exited 1"} for i, n in enumerate(names)}
    obs.boots["head"] = {"state": "booted"}
    details = by_name(obs)["booted"].details
    assert len(details) == MAX_DETAILS + 1 and details[-1] == f"... and {40 - MAX_DETAILS} more"
    assert details[0] == "gpu-st-x-1: OnNodeStart script s0.sh exited 1"


# -- models that share a node --------------------------------------------------------------------------------------

#: one line of `scontrol -d -o show job` for a 1-GPU share, captured on the local Slurm 22.05 (CR_CPU_Memory)
SHARE_LINE = ("JobId=1 JobName=shared-twin-model-a JobState=RUNNING NodeList=node1 BatchHost=node1 NumNodes=1 NumCPUs=24 "
              "NumTasks=1 CPUs/Task=24 ReqB:S:C:T=0:0:*:* TRES=cpu=24,mem=93388M,node=1,billing=24 Socks/Node=* "
              "NtasksPerN:B:S:C=1:0:*:* CoreSpec=* JOB_GRES=gpu:a10g:1   Nodes=node1 CPU_IDs=0-23 Mem=93388 "
              "GRES=gpu:a10g:1(IDX:0) MinCPUsNode=24 MinMemoryNode=93388M MinTmpDiskNode=0 OverSubscribe=OK")


def test_job_allocation_reads_scontrols_detail_line():
    assert job_allocation(SHARE_LINE) == {"mem_mb": 93388, "cpus": 24, "oversubscribe": "OK",
                                          "nodes": {"node1": {"cpus": 24, "mem_mb": 93388, "gpus": [0]}}}
    two = job_allocation("NumCPUs=384 TRES=cpu=384,mem=3G,node=2 OverSubscribe=NO   Nodes=n[1-2] CPU_IDs=0-191 "
                         "Mem=1536 GRES=gpu:h100:8(IDX:0-7) MinCPUsNode=1")
    assert two["mem_mb"] == 3072 and two["oversubscribe"] == "NO" and sorted(two["nodes"]) == ["n1", "n2"]
    assert two["nodes"]["n2"] == {"cpus": 192, "mem_mb": 1536, "gpus": list(range(8))}
    assert job_allocation("") == {}


def shared_node() -> Observed:
    """Two 2-GPU shares (half the memory and CPUs each) of one 4-GPU node, as Slurm allocated them."""
    obs = healthy()
    obs.nodes = ["gpu-st-x-1"]
    obs.boots = {n: {"state": "booted", "phases": [], "error": None} for n in ["gpu-st-x-1", "head"]}
    obs.capacity = {"gpu-st-x-1": {"cpus": 48, "mem_mb": 1000, "gpus": 4}}
    obs.planned_shared_nodes = 1
    for job, gpus, port in zip(obs.jobs, ([0, 1], [2, 3]), (29501, 29502)):
        job.nodes, job.planned_nodes = ["gpu-st-x-1"], 1
        job.records = make_records(job.model, ["gpu-st-x-1"], 2, port, True, tuple(job.write_dirs), tuple(job.read_paths))
        for r in job.records:  # no cgroup confinement: CUDA_VISIBLE_DEVICES holds the node's indices
            r["gpus"]["CUDA_VISIBLE_DEVICES"] = r["gpus"]["SLURM_JOB_GPUS"] = ",".join(map(str, gpus))
        job.share = {"gpus": 2, "mem_mb": 500, "cpus_per_gpu": 12}
        job.alloc = {"mem_mb": 500, "cpus": 24, "oversubscribe": "OK",
                     "nodes": {"gpu-st-x-1": {"cpus": 24, "mem_mb": 500, "gpus": gpus}}}
    return obs


def test_shares_pass_when_two_shares_fill_one_node():
    checks = by_name(shared_node())
    assert [n for n, c in checks.items() if c.ok is not True] == []
    assert checks["shares"].details == []
    assert by_name(healthy())["shares"].details == ["no model runs on a share of a node"]


def test_shares_name_memory_not_honoured_an_overfull_node_and_a_shared_gpu():
    obs = shared_node()
    a, b = obs.jobs
    a.alloc["mem_mb"] = 1000                       # CR_Core: --mem not scheduled, the job got the whole node's
    a.alloc["nodes"]["gpu-st-x-1"]["mem_mb"] = 1000
    b.alloc["nodes"]["gpu-st-x-1"]["gpus"] = [1, 2]
    b.alloc["oversubscribe"] = "NO"
    details = failing(obs, "shares")
    assert "model-a (job 11): Slurm allocated 1000 MB, the share asks for 500 MB (--mem): is memory-based " \
           "scheduling on (SelectTypeParameters=CR_CPU_Memory)?" in details
    assert "gpu-st-x-1: its jobs hold 1500 MB of memory, the node has 1000 (model-a (job 11), model-b (job 12))" in details
    assert "gpu-st-x-1: GPU 1 allocated to both model-a and model-b" in details
    assert "model-b (job 12) holds its node exclusively (OverSubscribe=NO): the script asks for --exclusive" in details


def test_shares_name_a_share_on_two_nodes_and_more_nodes_than_planned():
    obs = shared_node()
    b = obs.jobs[1]
    b.alloc["nodes"] = {"gpu-st-x-2": {"cpus": 24, "mem_mb": 500, "gpus": [0, 1]},
                        "gpu-st-x-3": {"cpus": 24, "mem_mb": 500, "gpus": [0, 1]}}
    details = failing(obs, "shares")
    assert "model-b (job 12) ran on 2 nodes; a share of a node is on one node" in details
    assert "the shared-node models ran on 3 nodes (gpu-st-x-[1-3]), the plan packs them on 1" in details


def test_gpus_unshared_uses_the_nodes_indices_where_devices_are_confined():
    """With cgroup ConstrainDevices both jobs see CUDA_VISIBLE_DEVICES=0,1; SLURM_JOB_GPUS tells them apart."""
    obs = shared_node()
    for job in obs.jobs:
        for r in job.records:
            r["gpus"]["CUDA_VISIBLE_DEVICES"] = "0,1"
    assert by_name(obs)["gpus_unshared"].ok is True
    for r in obs.jobs[1].records:
        r["gpus"]["SLURM_JOB_GPUS"] = "0,1"
    assert "model-a and model-b share 2 GPUs on gpu-st-x-1" in failing(obs, "gpus_unshared")
