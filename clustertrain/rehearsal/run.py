"""The whole rehearsal: :func:`rehearse` (``clustertrain rehearse PROJECT``).

1. Refuse what cannot be rehearsed, before anything starts (one :class:`LaunchError` line, exit 2): not a Slurm
   project, no ``aws:`` section, a model the plan cannot place or that needs more nodes than its partition has,
   more nodes than :data:`~clustertrain.rehearsal.shape.MAX_NODES`, a rendezvous port already taken on
   this machine, no permission to create mount namespaces. Models that fit one by one but not together are
   rehearsed: Slurm's pending reason is the finding.
2. Lay out the rehearsal directory ``R`` (mode 0700; layout below), start the emulated cluster
   (:class:`~clustertrain.rehearsal.cluster.RehearsalCluster`): the head node, then every compute node,
   each booting through the project's own node scripts.
3. Submit every model's real batch script on the head node, at once (:mod:`clustertrain.rehearsal.jobs`).
4. Watch ``squeue`` until every job's rank 0 holds (it has run) or the job is stuck pending or ended; that moment
   is the snapshot the ``concurrent`` check reads. Then release the ranks, cancel what still pends, wait.
5. Check (:func:`~clustertrain.rehearsal.checks.run_checks`) and tear everything down unless ``keep``.

Rehearsal directory::

    R/slurm/            the Slurm state dir (clustertrain.launch.slurm_cluster_paths)
    R/boot/             spec.json, <node>.json boot results, <node>/<phase>-<script>.log
    R/s3/<bucket>/<key> the node scripts where the cluster config's CustomActions point (the upload)
    R/bin/aws           the stand-in for the AWS CLI on the nodes: ``aws s3 cp s3://...`` from R/s3 only
    R/shared/<name>/    the one directory behind each SharedStorage mount; R/shared/home behind /home
    R/nodes/<node>/     mount point of each node's private root (empty outside the node)
    R/jobs/<model>.json the payload's job spec; R/submission.pkl the head node's part
    R/records/<model>/  one record per rank; R/holding/<model> rank 0 holds; R/release lets them go
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from clustertrain.core.errors import LaunchError
from clustertrain.rehearsal.cluster import HEAD, HeadBootFailed, RehearsalCluster
from clustertrain.rehearsal.observed import JobView, Observed, RehearsalReport
from clustertrain.rehearsal.shape import MAX_NODES, Shape, cluster_shape

if TYPE_CHECKING:
    from clustertrain.rehearsal.jobs import RehearsalJob
    from clustertrain.project import Project

AWS_SHIM = """#!/bin/bash
# Stand-in for the AWS CLI on the nodes of a clustertrain rehearsal (there is no AWS here): it serves
# `aws s3 cp s3://BUCKET/KEY DEST` from the rehearsal's copy of the uploaded node scripts, nothing else.
set -euo pipefail
S3_ROOT={root}
args=()
for a in "$@"; do case "$a" in --only-show-errors|--quiet|--no-progress) ;; *) args+=("$a") ;; esac; done
if [[ ${{#args[@]}} -eq 4 && ${{args[0]}} == s3 && ${{args[1]}} == cp && ${{args[2]}} == s3://* ]]; then
  exec cp -- "$S3_ROOT/${{args[2]#s3://}}" "${{args[3]}}"
fi
echo "aws (clustertrain rehearse stand-in): only 'aws s3 cp s3://BUCKET/KEY DEST' is emulated, not: aws $*" >&2
exit 1
"""
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED"}


@dataclass
class RehearseOptions:
    keep: bool = False                  # leave the cluster running and the directory in place
    dir: Path | None = None             # the rehearsal directory (default: a new temporary one)
    mount_timeout_s: int = 2            # CLUSTERTRAIN_MOUNT_TIMEOUT_S for the node scripts
    hold_s: float = 120.0               # how long rank 0 holds at most
    rendezvous_s: float = 60.0
    settle_s: float = 3.0               # a pending job counts as stuck after this long with every other job holding
    snapshot_timeout_s: float = 180.0
    edit_config: Callable[[dict], dict] | None = None   # test hook: change the cluster config before the boot
    edit_script: Callable[[str], str] | None = None     # test hook: change each batch script before sbatch


def require_slurm(project: "Project") -> None:
    if project.cluster.backend != "slurm":
        raise LaunchError(f"cluster.backend is {project.cluster.backend!r}: `clustertrain rehearse` rehearses Slurm "
                          "submissions; set cluster.backend: slurm (or --set cluster.backend=slurm)")


def preflight(project: "Project", shape: Shape, nodes: dict[str, int], directory: Path | None = None) -> None:
    """Step 1 of the module docstring (everything but the plan); ``directory``: the ``--dir`` asked for."""
    require_slurm(project)
    if directory is not None and directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise LaunchError(f"--dir {directory} exists and is not an empty directory: name a new one (a rehearsal "
                          "starts from nothing; stop a kept one with `clustertrain local-slurm down --state-dir "
                          f"{directory}/slurm` and remove it)")
    if shape.node_count > MAX_NODES:
        raise LaunchError(f"the cluster has {shape.node_count} nodes; one machine emulates at most {MAX_NODES}: "
                          f"rehearse a smaller copy with --nodes {MAX_NODES} or fewer")
    queue = shape.queue(project.cluster.partition or "") if project.cluster.partition else shape.queues[0]
    if queue is None:
        raise LaunchError(f"cluster.partition {project.cluster.partition!r} is none of the aws.queues "
                          f"({', '.join(q.name for q in shape.queues)}); set it to the queue the jobs run in")
    for model, n in nodes.items():
        if n > len(queue.nodes):
            raise LaunchError(f"{model} needs {n} nodes but the {queue.name} partition has {len(queue.nodes)}: the job "
                              f"could never start; raise aws.queues max_count or lower the model's nodes")
    for i, model in enumerate(nodes, start=1):
        from clustertrain.core.ranks import port_for_job, shared_node_port

        # a job on a share of a node: its port follows its first GPU, which Slurm picks (any of the node's)
        shared = project.shares_node(project.model(model))
        ports = [shared_node_port(i, g) for g in range(project.cluster.gpus_per_node)] if shared and \
            project.cluster.gpus_per_node else [port_for_job(i)]
        for port in ports:
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as rank 0 (and torch's TCPStore) binds it
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    raise LaunchError(f"port {port} on 127.0.0.1 is taken: {model}'s job (job {i} of the rehearsal's "
                                      f"fresh cluster) needs it for its rendezvous (MASTER_PORT); stop what listens "
                                      "there") from None
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        raise LaunchError("cannot create a mount namespace (unshare: "
                          f"{probe.stderr.strip() or probe.returncode}); the rehearsal needs root (CAP_SYS_ADMIN)")


def planned_shared_nodes(project: "Project") -> int | None:
    """How many nodes the plan packs the shared-node models on (:func:`clustertrain.plan.packing.pack`), for the
    ``shares`` check's "no more nodes than planned"; None when no model shares a node."""
    from clustertrain.plan.packing import pack

    count = pack(project).count
    return count or None


def plan_nodes(project: "Project") -> dict[str, int]:
    """Each model's node count; a plan that cannot place a model is refused (oversubscription is rehearsed)."""
    from clustertrain.plan.node_counts import nodes_for
    from clustertrain.plan.plan import make_plan
    from clustertrain.plan.preflight import submit_blockers

    plan = make_plan(project)
    errors = [f for f in submit_blockers(project, None, plan) if f.path != "plan.cluster_nodes"]
    if errors:
        raise LaunchError(f"the plan does not fit: {errors[0].path}: {errors[0].message}; fix: {errors[0].fix}")
    return nodes_for(project, plan)


def _layout(rdir: Path, shape: Shape, cluster: RehearsalCluster, opts: RehearseOptions) -> None:
    from clustertrain.core.run_paths import write_atomic

    for name in ("boot", "s3", "bin", "shared/home", "jobs", "records", "holding"):
        (rdir / name).mkdir(parents=True, exist_ok=True)
    for url, text in shape.scripts.items():
        write_atomic(rdir / "s3" / url.removeprefix("s3://"), text, mode=0o755)
    write_atomic(rdir / "bin" / "aws", AWS_SHIM.format(root=_q(str(rdir / "s3"))), mode=0o755)
    for name in shape.shared:
        (rdir / "shared" / name).mkdir(exist_ok=True)

    def actions(items) -> dict:
        out: dict[str, list] = {}
        for a in items:
            out.setdefault(a.hook, []).append({"script": str(rdir / "s3" / a.url.removeprefix("s3://")), "name": a.name,
                                               "args": list(a.args)})
        return out

    kinds = {HEAD: {"head": True, "ephemeral": None, "actions": actions(shape.head_actions)}}
    kinds.update({q.name: {"head": False, "ephemeral": q.ephemeral, "actions": actions(q.actions)} for q in shape.queues})
    nodes = {n: q.name for q in shape.queues for n in q.nodes}
    nodes[HEAD] = HEAD
    p = cluster.paths
    links = {str(p.short_root): str(p.root)} if p.socket_root == p.short_root else {}
    shared = [{"name": n, "source": str(rdir / "shared" / n), "target": d} for n, d in shape.shared.items()]
    shared.append({"name": "home", "source": str(rdir / "shared" / "home"), "target": "/home"})
    spec = {"version": 1, "dir": str(rdir), "timeout_s": opts.mount_timeout_s,
            "path": f"{rdir / 'bin'}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "env": {"CLUSTERTRAIN_MOUNT_TIMEOUT_S": str(opts.mount_timeout_s), "SLURM_CONF": str(p.conf)},
            "links": links, "software": software_dirs(), "user": {"name": shape.user, "uid": 1000} if shape.user else None,
            "shared": shared, "nodes": nodes, "kinds": kinds, "record": str(p.record)}
    write_atomic(cluster.spec_path, json.dumps(spec, indent=1))


def software_dirs() -> list[str]:
    """The interpreter and clustertrain running the rehearsal, where a node's fresh /tmp or /run would hide them
    (a checkout or virtual environment under /tmp): the outermost of those directories."""
    import sys

    import clustertrain

    found = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable)),
                                            str(Path(clustertrain.__file__).resolve().parents[1]))}
    hidden = sorted(p for p in found if p.startswith(("/tmp/", "/run/")))
    return [p for p in hidden if not any(p != q and p.startswith(q + "/") for q in hidden)]


def _q(text: str) -> str:
    import shlex

    return shlex.quote(text)


def host_path(path: str, rdir: Path, shape: Shape) -> Path | None:
    """Where a node's path on a shared file system lies on this machine (None: on a node's own disk)."""
    from clustertrain.core.storage_layout import mount_of

    mounts = {d: n for n, d in shape.shared.items()} | {"/home": "home"}
    top = mount_of(path, list(mounts))
    if top is None:
        return None
    return rdir / "shared" / mounts[top] / os.path.relpath(path, top)


def _squeue(cluster: RehearsalCluster) -> dict[str, dict]:
    from clustertrain.launch.slurmcli import run_slurm
    from clustertrain.core.ranks import expand_hostlist

    proc = run_slurm(["squeue", "-h", "-o", "%i|%T|%r|%N|%P"], env=cluster.env(), check=False, timeout=30)
    out = {}
    for line in proc.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 5:
            job, state, reason, nodes, partition = parts
            out[job] = {"state": state, "reason": reason if reason not in ("None", "") else None,
                        "nodes": expand_hostlist(nodes) if nodes else [], "partition": partition}
    return out


def _watch(cluster: RehearsalCluster, rdir: Path, ids: dict[str, str], opts: RehearseOptions) -> dict[str, dict]:
    """Step 4: the snapshot (model -> squeue's view, ``ran``: its rank 0 held)."""
    deadline = time.monotonic() + opts.snapshot_timeout_s
    stuck_since: float | None = None
    last: dict[str, dict] = {}
    while True:
        queue = _squeue(cluster)
        snap: dict[str, dict] = {}
        busy = pending = False
        for model, job in ids.items():
            view = {**queue.get(job, {"state": "ENDED", "reason": None, "nodes": last.get(model, {}).get("nodes", []),
                                      "partition": None}), "ran": (rdir / "holding" / model).exists()}
            if view["nodes"] or model not in last:
                last[model] = view
            snap[model] = view
            if view["ran"] or view["state"] in ENDED or view["state"] == "ENDED":
                continue
            if view["state"] == "PENDING":
                pending = True
            else:
                busy = True
        now = time.monotonic()
        if not busy and not pending:
            return snap
        if not busy and pending:
            stuck_since = stuck_since or now
            if now - stuck_since >= opts.settle_s:
                return snap
        else:
            stuck_since = None
        if now > deadline:
            return snap
        time.sleep(0.3)


def _allocations(cluster: RehearsalCluster, ids: dict[str, str]) -> dict[str, dict]:
    """Model -> what Slurm allocated to its job (:func:`~clustertrain.rehearsal.observed.job_allocation` of
    ``scontrol -d -o show job``), read while the jobs are held (the ``shares`` check compares it with the plan)."""
    from clustertrain.launch.slurmcli import run_slurm
    from clustertrain.rehearsal.observed import job_allocation

    out = {}
    for model, job in ids.items():
        proc = run_slurm(["scontrol", "-d", "-o", "show", "job", job], env=cluster.env(), check=False, timeout=30)
        out[model] = job_allocation(proc.stdout if proc.returncode == 0 else "")
    return out


def _wait_empty(cluster: RehearsalCluster, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while _squeue(cluster) and time.monotonic() < deadline:
        time.sleep(0.3)


def _tail(path: Path | None, lines: int = 5) -> str:
    if path is None:
        return ""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _run_jobs(project: "Project", cluster: RehearsalCluster, rdir: Path, shape: Shape, nodes: dict[str, int],
              opts: RehearseOptions, texts: list[tuple[str, str]]) -> list[JobView]:
    import sys

    from clustertrain.check import SECRET_NAME_RE, SECRET_RE
    from clustertrain.rehearsal.jobs import rehearsal_job, write_submission
    from clustertrain.launch.slurm_query import JobGone, query_job

    jobs: list[RehearsalJob] = []
    for entry in project.models:
        job = rehearsal_job(project, entry, nodes[entry.name], rdir, SECRET_NAME_RE.pattern, SECRET_RE.pattern,
                            opts.hold_s, opts.rendezvous_s)
        if opts.edit_script is not None:
            job.script = opts.edit_script(job.script)
        (rdir / "records" / entry.name).mkdir(parents=True, exist_ok=True)
        (rdir / "jobs" / f"{entry.name}.json").write_text(json.dumps(job.spec, indent=1))
        texts.append((f"batch script of {entry.name}", job.script))
        jobs.append(job)
    write_submission(jobs, rdir / "submission.pkl")
    env = {**os.environ, **cluster.env()}
    proc = subprocess.run(cluster.head_command([sys.executable, "-m", "clustertrain.rehearsal.jobs",
                                                str(rdir / "submission.pkl")]),
                          env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise LaunchError(f"submitting on the emulated head node failed: {proc.stderr.strip().splitlines()[-1:]}")
    answers = json.loads(proc.stdout.strip().splitlines()[-1])
    ids = {m: a["job_id"] for m, a in answers.items() if "job_id" in a}
    snapshot = _watch(cluster, rdir, ids, opts)
    allocs = _allocations(cluster, {m: j for m, j in ids.items() if snapshot.get(m, {}).get("ran")})
    (rdir / "release").touch()
    stuck = [ids[m] for m, v in snapshot.items() if not v["ran"] and v["state"] == "PENDING"]
    if stuck:
        from clustertrain.launch.slurmcli import run_slurm

        run_slurm(["scancel", *stuck], env=cluster.env(), check=False)
    _wait_empty(cluster, opts.rendezvous_s + 30)
    views = []
    for job in jobs:
        view, model = job.view, job.view.model
        answer = answers.get(model, {})
        view.submit_error = answer.get("error")
        view.job_id = answer.get("job_id")
        if view.job_id:
            snap = snapshot.get(model, {})
            view.snapshot_state = "RUNNING" if snap.get("ran") else snap.get("state")
            view.reason, view.nodes, view.job_partition = snap.get("reason"), list(snap.get("nodes") or []), snap.get("partition")
            view.alloc = allocs.get(model, {})
            try:
                final = query_job(view.job_id, cluster.env(), jobcomp_path=cluster.paths.jobcomp)
                view.final_state, view.exit_code = final.state, final.exit_code
                view.nodes = view.nodes or list(final.nodes)
                if view.snapshot_state == "ENDED":
                    view.snapshot_state = final.state
            except (JobGone, LaunchError):
                pass
            out = host_path(str(job.request.output_for(view.job_id)), rdir, shape)
            view.output_tail = _tail(out)
            if out is not None and out.exists():
                texts.append((f"output of {model} (job {view.job_id})", out.read_text(errors="replace")))
        for rec in sorted((rdir / "records" / model).glob("*.json")):
            text = rec.read_text()
            texts.append((f"record {rec.name} of {model}", text))
            try:
                view.records.append(json.loads(text))
            except ValueError:
                pass
        views.append(view)
    return views


def rehearse(project: "Project", opts: RehearseOptions | None = None, log: Callable[[str], None] = lambda _: None) -> RehearsalReport:
    """The rehearsal of ``project`` (see the module docstring); ``log`` gets one line per step."""
    from clustertrain.cloud.pcluster import build_cluster_config
    from clustertrain.rehearsal.checks import run_checks

    opts = opts or RehearseOptions()
    start = time.monotonic()
    require_slurm(project)
    config = build_cluster_config(project)
    if opts.edit_config is not None:
        config = opts.edit_config(config)
    shape = cluster_shape(project, config)
    nodes = plan_nodes(project)
    preflight(project, shape, nodes, None if opts.dir is None else Path(opts.dir).absolute())
    created = opts.dir is None
    # a short name: Slurm's step sockets (<dir>/slurm/spool/<node>/<node>_<job>.<step>) must fit in 107 bytes
    rdir = Path(tempfile.mkdtemp(prefix="ctr-")) if created else Path(opts.dir).absolute()
    rdir.mkdir(parents=True, exist_ok=True, mode=0o700)
    rdir.chmod(0o700)
    cluster = RehearsalCluster(rdir, shape.groups, boot_timeout=opts.mount_timeout_s + 90.0,
                               memory_scheduling=shape.memory_scheduling)
    texts: list[tuple[str, str]] = [(f"node script {url.rsplit('/', 1)[-1]}", t) for url, t in shape.scripts.items()]
    obs = Observed(nodes=cluster.node_names, planned_shared_nodes=planned_shared_nodes(project),
                   capacity={n: {"cpus": g.cpus, "mem_mb": g.memory_mb, "gpus": g.gpus} for g in shape.groups
                             for n in g.names})
    kept = None
    try:
        _layout(rdir, shape, cluster, opts)
        log(f"booting the head node and {shape.node_count} compute nodes in {rdir}")
        try:
            cluster.up()
        except HeadBootFailed:
            obs.skipped = "the head node did not boot: no job was submitted"
        obs.boots = cluster.boot_results()
        failed = sorted(cluster.failed_nodes())
        if failed and not obs.skipped:
            obs.skipped = f"{len(failed)} compute node(s) did not boot: no job was submitted"
        for log_file in sorted((rdir / "boot").glob("*/*.log")):
            texts.append((f"boot log {log_file.parent.name}/{log_file.name}", log_file.read_text(errors="replace")))
        if not obs.skipped:
            log(f"submitting {len(project.models)} jobs on the head node")
            obs.jobs = _run_jobs(project, cluster, rdir, shape, nodes, opts, texts)
        obs.texts = texts
        checks = run_checks(obs)
    finally:
        if opts.keep:
            kept = str(rdir)
        else:
            cluster.down()
            reap(rdir)
            if created:
                shutil.rmtree(rdir, ignore_errors=True)
    jobs = [{"model": j.model, "job_id": j.job_id, "planned_nodes": j.planned_nodes, "nodes": list(j.nodes),
             "state": j.snapshot_state or ("NOT SUBMITTED" if j.submit_error else None), "reason": j.reason}
            for j in obs.jobs]
    gpus = sum(g.count * g.gpus for g in shape.groups)
    return RehearsalReport(project.name, shape.node_count, gpus, round(time.monotonic() - start, 1), checks, jobs, kept)


def leftovers(rdir: Path) -> tuple[list[int], list[str]]:
    """Processes still naming the rehearsal directory, and mounts under it in this machine's namespace."""
    import psutil

    me, text = os.getpid(), str(rdir)
    procs = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if p.pid != me and any(text in arg for arg in (p.info["cmdline"] or [])):
                procs.append(p.pid)
        except psutil.Error:
            continue
    with open("/proc/self/mountinfo") as f:
        mounts = [line.split()[4] for line in f if line.split()[4].startswith(text)]
    return procs, mounts


def reap(rdir: Path) -> None:
    """Kill what is left of the rehearsal (boot drivers, payloads) after the cluster stopped."""
    import psutil

    procs, _ = leftovers(rdir)
    for pid in procs:
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            pass
    psutil.wait_procs([p for p in (_proc(pid) for pid in procs) if p], timeout=5)


def _proc(pid: int):
    import psutil

    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None
