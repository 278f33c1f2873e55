"""The rehearsal's verdict: eleven checks over what it observed (:class:`~.observed.Observed`), as pure functions.

:func:`run_checks` returns them in the order of :data:`TITLES` (what each asserts). Each detail line is one
problem and names the model, node, rank, path or script; identical problems are grouped (nodes as a Slurm hostlist,
ranks as ranges) and each check keeps at most :data:`MAX_DETAILS` lines.

Checks 3-10 look only at the jobs that ran (a pending or unsubmitted job is the ``concurrent`` check's failure).
When the jobs were not run (``Observed.skipped``), checks 2-10 are ``ok=None`` with that reason as their detail.
"""

from __future__ import annotations

import re
from collections import defaultdict
from itertools import groupby
from posixpath import normpath

from clustertrain.rehearsal.observed import Check, JobView, Observed

MAX_DETAILS = 20
TITLES = {
    "booted": "every node and the head node booted (OnNodeStart, config, OnNodeConfigured, daemon)",
    "concurrent": "every model's job ran at the same time, on the node count the plan allocates",
    "world": "each job has one record per rank 0..W-1, all agreeing on W = nodes x ranks per node",
    "rendezvous": "every rank met rank 0 at its job's MASTER_ADDR:MASTER_PORT; no two running jobs share one",
    "one_gpu": "each rank sees exactly one GPU (CUDA_VISIBLE_DEVICES lists one per rank of its node)",
    "gpus_unshared": "no GPU is given to two ranks, across all jobs",
    "shares": "jobs on a share of a node each ran on one node with the GPUs, memory and CPUs they ask for, and the "
              "jobs on each node fit it (memory-based scheduling honoured --mem)",
    "dirs": "each model writes its own directories, all on shared file systems",
    "paths": "what a node writes is visible on every node of its job; every read path exists everywhere; the ranks' "
             "cache directories are writable (in the container's view, where the job has an image)",
    "preset": "the NCCL/EFA preset and launch.env reach every rank with the expected values",
    "secrets": "no credential in the scripts or logs, and none reached the ranks' environment",
}
ENDED = ("COMPLETED", "COMPLETING", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
         "BOOT_FAIL", "DEADLINE", "REVOKED")


def run_checks(obs: Observed) -> list[Check]:
    """The eleven checks of :data:`TITLES`, in that order."""
    ran = [j for j in obs.jobs if _ran(j)]
    why = obs.skipped or (None if ran else "no job ran (see concurrent)" if obs.jobs else "no jobs to rehearse")

    def gated(name: str, fn, arg, reason: str | None) -> Check:
        return _check(name, None, [reason]) if reason else fn(arg)

    return [check_booted(obs), gated("concurrent", check_concurrent, obs, obs.skipped),
            gated("world", check_world, ran, why), gated("rendezvous", check_rendezvous, ran, why),
            gated("one_gpu", check_one_gpu, ran, why), gated("gpus_unshared", check_gpus_unshared, ran, why),
            gated("shares", lambda o: check_shares(o, ran), obs, why),
            gated("dirs", check_dirs, obs.jobs, obs.skipped), gated("paths", check_paths, ran, why),
            gated("preset", check_preset, ran, why), check_secrets(obs)]


def _check(name: str, ok: bool | None, details: list[str]) -> Check:
    return Check(name=name, title=TITLES[name], ok=ok, details=cap(details))


def _result(name: str, details: list[str]) -> Check:
    return _check(name, not details, details)


def cap(lines: list[str], limit: int = MAX_DETAILS) -> list[str]:
    """At most ``limit`` lines, then one ``... and N more``."""
    return lines if len(lines) <= limit else [*lines[:limit], f"... and {len(lines) - limit} more"]


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def ranges(numbers) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2,5``."""
    out = []
    for _, run in groupby(enumerate(sorted(set(numbers))), lambda t: t[1] - t[0]):
        nums = [n for _, n in run]
        out.append(str(nums[0]) if len(nums) == 1 else f"{nums[0]}-{nums[-1]}")
    return ",".join(out)


def hostlist(names) -> str:
    """Slurm's compact form: ``gpu-st-x-1 .. gpu-st-x-80`` -> ``gpu-st-x-[1-80]``."""
    groups: dict[str, list[int]] = defaultdict(list)
    plain: list[str] = []
    for name in dict.fromkeys(names):
        m = re.fullmatch(r"(.*?)(\d+)", name)
        if m and str(int(m.group(2))) == m.group(2):
            groups[m.group(1)].append(int(m.group(2)))
        else:
            plain.append(name)
    out = [f"{p}{nums[0]}" if len(nums) == 1 else f"{p}[{ranges(nums)}]" for p, nums in sorted(groups.items())]
    return ",".join(out + sorted(plain))


def nodes_phrase(names) -> str:
    """``gpu-1`` or ``gpu-[1-3] (3 nodes)``."""
    unique = list(dict.fromkeys(names))
    return hostlist(unique) if len(unique) == 1 else f"{hostlist(unique)} ({len(unique)} nodes)"


def _ran(job: JobView) -> bool:
    return job.job_id is not None and bool(job.records or job.nodes or job.snapshot_state not in (None, "PENDING"))


def _ranked(job: JobView) -> list[dict]:
    """The records of ranks that found their rank (the others are the world check's errors)."""
    return [r for r in job.records if not r.get("error") and isinstance(r.get("rank"), int)]


def _who(recs: list[dict]) -> str:
    """``88 ranks (0-87) on gpu-[1-11] (11 nodes)``."""
    return f"{plural(len(recs), 'rank')} ({ranges(r['rank'] for r in recs)}) on {nodes_phrase(_node(r) for r in recs)}"


def _node(rec: dict) -> str:
    return str(rec.get("node", "?"))


def _job(job: JobView) -> str:
    return f"{job.model} (job {job.job_id})"


def check_booted(obs: Observed) -> Check:
    groups: dict[str, list[tuple[str, str]]] = defaultdict(list)   # normalized error -> [(node, error)]
    for node in dict.fromkeys([*obs.nodes, "head"]):
        boot = obs.boots.get(node)
        if boot is None:
            error = "no boot result (the node never started its boot)"
        elif boot.get("state") == "booted":
            continue
        elif boot.get("state") == "failed":
            error = boot.get("error") or "failed without an error message"
        else:
            phases = boot.get("phases") or []
            last = phases[-1].get("phase") if phases else None
            error = f"still {boot.get('state')}" + (f" after phase {last}" if last else " (no phase finished)")
        key = re.sub(r" after \d+(\.\d+)?s", "", error).replace(node, "<node>")
        groups[key].append((node, error))
    details = []
    for key, hits in groups.items():
        details.append(f"{hits[0][0]}: {hits[0][1]}" if len(hits) == 1
                       else f"{nodes_phrase(n for n, _ in hits)}: {key}")
    return _result("booted", details)


def check_concurrent(obs: Observed) -> Check:
    details = [] if obs.jobs else ["no jobs to rehearse"]
    for job in obs.jobs:
        state = job.snapshot_state
        if job.job_id is None or job.submit_error:
            details.append(f"{job.model} not submitted: {job.submit_error or 'no job id'}")
        elif state == "PENDING":
            details.append(f"{_job(job)} pending: Reason={job.reason or 'unknown'}")
        elif state == "RUNNING":
            if len(job.nodes) != job.planned_nodes:
                details.append(f"{_job(job)} ran on {plural(len(job.nodes), 'node')}, the plan allocates "
                               f"{job.planned_nodes}")
            if job.partition and job.job_partition != job.partition:
                details.append(f"{_job(job)} ran in partition {job.job_partition or '(unknown)'}, the script asks "
                               f"for {job.partition}")
        elif state is None:
            details.append(f"{_job(job)} not seen by Slurm at the snapshot")
        elif state.split()[0].rstrip("+") in ENDED:
            last = (job.output_tail.strip().splitlines() or ["(no output)"])[-1].strip()
            details.append(f"{_job(job)} ended {state} before all jobs ran: {last}")
        else:
            details.append(f"{_job(job)} was {state} at the snapshot, not RUNNING")
    return _result("concurrent", details)


def check_world(jobs: list[JobView]) -> Check:
    details = []
    for job in jobs:
        want = job.planned_nodes * job.ranks_per_node
        if len(job.records) != want:
            details.append(f"{_job(job)}: {len(job.records)} rank records, expected {want} "
                           f"({job.planned_nodes} nodes x {job.ranks_per_node} ranks)")
        errors: dict[str, list[str]] = defaultdict(list)
        for rec in (r for r in job.records if r.get("error")):
            errors[str(rec["error"])].append(_node(rec))
        for err, nodes in errors.items():
            details.append(f"{job.model}: {plural(len(nodes), 'rank')} on {nodes_phrase(nodes)} failed: {err}")
        ranked = _ranked(job)
        placed = len(job.nodes) * job.ranks_per_node if job.nodes else want
        worlds: dict[int, list[dict]] = defaultdict(list)
        seen: dict[int, list[str]] = defaultdict(list)
        for rec in ranked:
            seen[rec["rank"]].append(_node(rec))
            if rec.get("world") not in (want, placed) or want != placed:
                worlds[rec.get("world")].append(rec)
        for world, recs in worlds.items():
            details.append(f"{job.model}: {_who(recs)} report world {world}, the plan has {want}"
                           + (f" and Slurm placed {placed}" if placed != want else ""))
        missing = sorted(set(range(want)) - set(seen))
        if missing:
            details.append(f"{job.model}: no record from {plural(len(missing), 'rank')} ({ranges(missing)}) of {want}")
        extra = sorted(r for r in seen if not 0 <= r < want)
        if extra:
            details.append(f"{job.model}: ranks outside 0..{want - 1}: {ranges(extra)}")
        for rank, nodes in sorted(seen.items()):
            if len(nodes) > 1:
                details.append(f"{job.model}: rank {rank} recorded {len(nodes)} times (on {', '.join(nodes)})")
    return _result("world", details)


def _rendezvous_of(job: JobView) -> tuple | None:
    rank0 = [r for r in _ranked(job) if r["rank"] == 0]
    pairs = [(r.get("master_addr"), r.get("master_port")) for r in (rank0 or _ranked(job))]
    return max(set(pairs), key=pairs.count) if pairs else None


def check_rendezvous(jobs: list[JobView]) -> Check:
    details = []
    for job in jobs:
        ranked = _ranked(job)
        pairs: dict[str, list[int]] = defaultdict(list)
        for rec in ranked:
            pairs[f"{rec.get('master_addr')}:{rec.get('master_port')}"].append(rec["rank"])
        if len(pairs) > 1:
            details.append(f"{job.model}: ranks disagree on the rendezvous: " + ", ".join(
                f"{addr} (ranks {ranges(r)})" for addr, r in sorted(pairs.items(), key=lambda kv: min(kv[1]))))
        if ranked and not any(r["rank"] == 0 for r in ranked):
            details.append(f"{job.model}: no record from rank 0, which hosts the rendezvous")
        failures: dict[str, list[dict]] = defaultdict(list)
        for rec in ranked:
            rdv = rec.get("rendezvous") or {}
            if rdv.get("ok"):
                continue
            error = rdv.get("error") or ("no rendezvous result" if not rdv else "failed without an error")
            if rec["rank"] == 0:
                details.append(f"{job.model}: rank 0 on {_node(rec)}: {error}")
            else:
                failures[error].append(rec)
        for error, recs in failures.items():
            details.append(f"{job.model}: {_who(recs)}: {error}")
    running = [(j, _rendezvous_of(j)) for j in jobs if j.snapshot_state == "RUNNING"]
    for i, (a, pa) in enumerate(running):
        for b, pb in running[i + 1:]:
            if pa is not None and pa == pb:
                details.append(f"{_job(a)} and {_job(b)} ran at the same time with the same rendezvous "
                               f"{pa[0]}:{pa[1]}")
    return _result("rendezvous", details)


def _devices(rec: dict) -> list[str] | None:
    cvd = (rec.get("gpus") or {}).get("CUDA_VISIBLE_DEVICES")
    return [d.strip() for d in cvd.split(",")] if cvd and cvd.strip() else None


def gpu_of(rec: dict) -> tuple[str, str] | None:
    """The (node, device) a rank uses: its node and the node's index of ``CUDA_VISIBLE_DEVICES``'s entry at its local
    rank. Where Slurm confines devices (cgroup ``ConstrainDevices``, as on ParallelCluster) ``CUDA_VISIBLE_DEVICES``
    counts from 0 in every job, so two jobs on one node both see "0": the node's index is then the same position
    of ``SLURM_STEP_GPUS`` (else ``SLURM_JOB_GPUS``), which Slurm gives as the node's indices (Slurm's srun/sbatch
    man pages, OUTPUT ENVIRONMENT VARIABLES)."""
    devices, local = _devices(rec), rec.get("local_rank")
    if devices is None or not isinstance(local, int) or not 0 <= local < len(devices):
        return None
    gpus = rec.get("gpus") or {}
    node_ids = [d.strip() for d in str(gpus.get("SLURM_STEP_GPUS") or gpus.get("SLURM_JOB_GPUS") or "").split(",")
                if d.strip()]
    return _node(rec), node_ids[local] if len(node_ids) == len(devices) else devices[local]


def check_one_gpu(jobs: list[JobView]) -> Check:
    if not any(j.gpus_per_node > 0 for j in jobs):
        return _check("one_gpu", True, ["no GPUs requested (gpus_per_node is 0)"])
    details = []
    for job in (j for j in jobs if j.gpus_per_node > 0):
        groups: dict[str, list[dict]] = defaultdict(list)
        for rec in _ranked(job):
            gpus = rec.get("gpus") or {}
            devices = _devices(rec)
            if devices is None:
                word = "unset" if gpus.get("CUDA_VISIBLE_DEVICES") is None else "empty"
                allocated = gpus.get("SLURM_JOB_GPUS") or gpus.get("SLURM_STEP_GPUS")
                why = (f"Slurm allocated GPUs {allocated} but did not set it" if allocated
                       else "the batch script requests none (--gpus-per-node / --gres)")
                groups[f"saw no GPU (CUDA_VISIBLE_DEVICES {word}): {why}"].append(rec)
                continue
            listed = f"CUDA_VISIBLE_DEVICES={','.join(devices)}"
            if rec.get("local_world") != len(devices):
                groups[f"see {plural(len(devices), 'GPU')} for {rec.get('local_world')} ranks on their node "
                       f"({listed})"].append(rec)
            if not isinstance(rec.get("local_rank"), int) or rec["local_rank"] >= len(devices):
                groups[f"have a local rank beyond the {plural(len(devices), 'GPU')} they see ({listed})"].append(rec)
        details += [f"{job.model}: {_who(recs)} {problem}" for problem, recs in groups.items()]
    return _result("one_gpu", details)


def check_gpus_unshared(jobs: list[JobView]) -> Check:
    if not any(j.gpus_per_node > 0 for j in jobs):
        return _check("gpus_unshared", True, ["no GPUs requested (gpus_per_node is 0)"])
    users: dict[tuple[str, str], list[tuple[str, int]]] = defaultdict(list)
    for job in jobs:
        for rec in _ranked(job):
            gpu = gpu_of(rec)
            if gpu is not None:
                users[gpu].append((job.model, rec["rank"]))
    if not users:
        return _check("gpus_unshared", None, ["no rank saw a GPU: nothing to compare (see one_gpu)"])
    shared: dict[tuple[str, ...], list[tuple[str, str]]] = defaultdict(list)   # models -> [(node, gpu)]
    for gpu, who in users.items():
        if len(who) > 1:
            shared[tuple(sorted({m for m, _ in who}))].append(gpu)
    details = []
    for models, gpus in shared.items():
        node, dev = gpus[0]
        example = " and ".join(f"{m} rank {r}" for m, r in users[(node, dev)])
        whose = f"ranks of {models[0]}" if len(models) == 1 else " and ".join(models)
        details.append(f"{whose} share {plural(len(gpus), 'GPU')} on {nodes_phrase(n for n, _ in gpus)}, "
                       f"e.g. {node} GPU {dev}: {example}")
    return _result("gpus_unshared", details)


def check_shares(obs: Observed, jobs: list[JobView]) -> Check:
    """Jobs on a share of one node (``JobView.share``) against what Slurm allocated (``JobView.alloc``): one node,
    the share's GPUs, ``--mem`` and CPUs, not exclusive; then every node's jobs (shared or whole-node) within what
    the node declares, no GPU index in two jobs, no exclusive job beside another; and no more nodes for the shared
    jobs than the plan packs them on (``Observed.planned_shared_nodes``, where known). Slurm places the jobs itself,
    so the plan's grouping need not be reproduced node for node: this asserts that Slurm could co-locate them."""
    shared = [j for j in jobs if j.share]
    if not shared:
        return _check("shares", True, ["no model runs on a share of a node"])
    details = []
    for job in shared:
        a, want = job.alloc, job.share
        if not a:
            details.append(f"{_job(job)}: Slurm's allocation was not seen while it ran")
            continue
        nodes = sorted(a.get("nodes") or {})
        if len(nodes) != 1:
            details.append(f"{_job(job)} ran on {plural(len(nodes), 'node')}; a share of a node is on one node")
        if a.get("oversubscribe") == "NO":
            details.append(f"{_job(job)} holds its node exclusively (OverSubscribe=NO): the script asks for --exclusive")
        if want.get("mem_mb") is not None and a.get("mem_mb") != want["mem_mb"]:
            details.append(f"{_job(job)}: Slurm allocated {a.get('mem_mb')} MB, the share asks for {want['mem_mb']} MB "
                           "(--mem): is memory-based scheduling on (SelectTypeParameters=CR_CPU_Memory)?")
        if job.gpus_per_node > 0:
            got = sorted({g for n in (a.get("nodes") or {}).values() for g in n.get("gpus", [])})
            if len(got) != want.get("gpus"):
                details.append(f"{_job(job)}: Slurm allocated GPUs {got or 'none'}, the share asks for {want.get('gpus')}")
        per_gpu = want.get("cpus_per_gpu")
        if per_gpu is not None and a.get("cpus") is not None and a["cpus"] < per_gpu * want.get("gpus", 1):
            details.append(f"{_job(job)}: Slurm allocated {a['cpus']} CPUs, the share asks for "
                           f"{per_gpu} x {want.get('gpus')}")
    on_node: dict[str, list[tuple[JobView, dict]]] = defaultdict(list)
    for job in jobs:
        for node, part in ((job.alloc or {}).get("nodes") or {}).items():
            on_node[node].append((job, part))
    for node, parts in sorted(on_node.items()):
        cap = obs.capacity.get(node) or {}
        for key, word in (("gpus", "GPUs"), ("cpus", "CPUs"), ("mem_mb", "MB of memory")):
            used = sum(len(p["gpus"]) if key == "gpus" else p.get(key) or 0 for _, p in parts)
            if cap.get(key) is not None and used > cap[key]:
                details.append(f"{node}: its jobs hold {used} {word}, the node has {cap[key]} "
                               f"({', '.join(_job(j) for j, _ in parts)})")
        seen: dict[int, str] = {}
        for job, part in parts:
            for gpu in part.get("gpus", []):
                if gpu in seen and seen[gpu] != job.model:
                    details.append(f"{node}: GPU {gpu} allocated to both {seen[gpu]} and {job.model}")
                seen.setdefault(gpu, job.model)
        if len(parts) > 1:
            alone = [j for j, _ in parts if (j.alloc or {}).get("oversubscribe") == "NO"]
            details += [f"{node}: {_job(j)} is exclusive but shares the node with another job" for j in alone]
    used_nodes = {n for j in shared for n in ((j.alloc or {}).get("nodes") or {})}
    if obs.planned_shared_nodes is not None and len(used_nodes) > obs.planned_shared_nodes:
        details.append(f"the shared-node models ran on {plural(len(used_nodes), 'node')} ({hostlist(used_nodes)}), "
                       f"the plan packs them on {obs.planned_shared_nodes}")
    return _result("shares", details)


def _inside(inner: str, outer: str) -> bool:
    return inner != outer and inner.startswith(outer.rstrip("/") + "/")


def check_dirs(jobs: list[JobView]) -> Check:
    details = []
    for i, a in enumerate(jobs):
        for b in jobs[i + 1:]:
            a_dirs = {normpath(p): k for k, p in a.dirs.items()}
            b_dirs = {normpath(p): k for k, p in b.dirs.items()}
            a_all = {**{normpath(p): "write" for p in a.write_dirs}, **a_dirs}
            b_all = {**{normpath(p): "write" for p in b.write_dirs}, **b_dirs}
            for path in sorted((set(a_all) & set(b_dirs)) | (set(a_dirs) & set(b_all))):
                details.append(f"{a.model} and {b.model} both write {path} ({a.model} {a_all[path]}, "
                               f"{b.model} {b_all[path]})")
            for pa, ka in a_dirs.items():
                for pb, kb in b_dirs.items():
                    if _inside(pa, pb) or _inside(pb, pa):
                        details.append(f"{a.model} {ka} {pa} and {b.model} {kb} {pb}: one is inside the other")
    for job in jobs:
        for entry in job.off_shared:
            details.append(f"{job.model}: {entry} is on no shared file system: the other nodes never see it")
    return _result("dirs", details)


def check_paths(jobs: list[JobView]) -> Check:
    details = []
    for job in jobs:
        ranked = _ranked(job)
        for path in dict.fromkeys([*job.write_dirs, *(p for r in ranked for p in (r.get("write") or {}))]):
            absent, unwritable = [], defaultdict(list)
            missed: dict[str, set[str]] = defaultdict(set)    # writer node -> viewer nodes that do not see its marker
            for rec in ranked:
                node = _node(rec)
                entry = (rec.get("write") or {}).get(path) or {"exists": True, "error": "the rank did not check it"}
                if not entry.get("exists"):
                    absent.append(node)
                if entry.get("error"):
                    unwritable[str(entry["error"])].append(node)
                for writer in entry.get("missing_nodes") or []:
                    if writer != node:
                        missed[writer].add(node)
            if absent:
                details.append(f"{job.model}: {path} does not exist on {nodes_phrase(absent)} (write)")
            details += [f"{job.model}: {path} on {nodes_phrase(nodes)}: {err} (write)" for err, nodes in unwritable.items()]
            by_count: dict[int, list[str]] = defaultdict(list)
            for writer, viewers in missed.items():
                by_count[len(viewers)].append(writer)
            for count, writers in sorted(by_count.items(), reverse=True):
                each = "" if len(writers) == 1 else " each"
                details.append(f"{job.model}: {path} written on {nodes_phrase(writers)} is not visible on "
                               f"{plural(count, 'other node')} of its job{each}")
        for path in dict.fromkeys([*job.read_paths, *(p for r in ranked for p in (r.get("read") or {}))]):
            unseen = [_node(r) for r in ranked if (r.get("read") or {}).get(path) is not True]
            if unseen:
                details.append(f"{job.model}: {path} not visible on {nodes_phrase(unseen)} (read)")
        failed: dict[str, list[str]] = defaultdict(list)  # "dir: error" -> nodes (local rank 0's cache probe)
        for rec in ranked:
            for d, err in (rec.get("caches") or {}).items():
                if err:
                    failed[f"{d}: {err}"].append(_node(rec))
        details += [f"{job.model}: cache directory {what} on {nodes_phrase(nodes)} (programs in the container write "
                    "caches under HOME, which Pyxis does not mount, in a read-only image: point HOME, XDG_CACHE_HOME "
                    "and TRITON_CACHE_DIR at a mounted directory)" for what, nodes in failed.items()]
    return _result("paths", details)


def check_preset(jobs: list[JobView]) -> Check:
    details = []
    for job in jobs:
        ranked = _ranked(job)
        for name, expected in job.expect_env.items():
            seen: dict[str | None, list[dict]] = defaultdict(list)
            for rec in ranked:
                value = (rec.get("env") or {}).get(name)
                if value != expected:
                    seen[value].append(rec)
            for value, recs in seen.items():
                details.append(f"{job.model}: {name} expected {expected!r}, {plural(len(recs), 'rank')} of "
                               f"{len(ranked)} saw {'unset' if value is None else repr(value)} "
                               f"(on {nodes_phrase(_node(r) for r in recs)})")
    return _result("preset", details)


def check_secrets(obs: Observed) -> Check:
    from clustertrain.check import SECRET_RE

    details = []
    for what, text in obs.texts:
        if SECRET_RE.search(text):
            details.append(f"{what}: holds what looks like an AWS access key or a private key")
    for job in obs.jobs:
        if SECRET_RE.search(job.output_tail or ""):
            details.append(f"{job.model}: the job's output holds what looks like an AWS access key or a private key")
        names = {n for rec in job.records for n in rec.get("secrets") or []}
        if any(SECRET_RE.search(str(v)) for rec in job.records for v in (rec.get("env") or {}).values()):
            names.add("(a recorded variable's value)")
        theirs, ours = sorted(names - set(job.expect_env)), sorted(names & set(job.expect_env))
        where = ([f"{', '.join(theirs)} (from the submitting shell: sbatch exports it by default)"] if theirs else []) \
            + ([f"{', '.join(ours)} (set by the project's launch.env)"] if ours else [])
        if where:
            details.append(f"{job.model}: variables that look like credentials reached the ranks: {'; '.join(where)}")
    return _result("secrets", details)
