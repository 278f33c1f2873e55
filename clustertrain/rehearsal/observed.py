"""What a rehearsal observed, as values: the input of :mod:`clustertrain.rehearsal.checks` and the
report (``clustertrain rehearse --json`` prints :meth:`RehearsalReport.as_dict`)."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from clustertrain.core.ranks import expand_hostlist


@dataclass
class JobView:
    """One model's job: what the plan and the batch script asked for, what Slurm did, what its ranks recorded."""

    model: str
    planned_nodes: int                 # the plan's allocation (clustertrain.plan.node_counts.nodes_for)
    gpus_per_node: int                 # cluster.gpus_per_node (what --gpus-per-node asks for)
    ranks_per_node: int                # cluster.ranks_per_node (--ntasks-per-node)
    partition: str | None              # cluster.partition
    job_id: str | None = None          # None: the submission failed (see submit_error)
    submit_error: str | None = None
    snapshot_state: str | None = None  # Slurm's state when the rehearsal took its snapshot (all jobs started or stuck)
    reason: str | None = None          # Slurm's Reason= for a job that was still pending then
    nodes: list[str] = field(default_factory=list)     # where Slurm placed it
    job_partition: str | None = None   # the partition Slurm ran it in
    final_state: str | None = None     # COMPLETED, FAILED, CANCELLED ... (CANCELLED: the rehearsal cancelled a pending job)
    exit_code: int | None = None
    expect_env: dict[str, str] = field(default_factory=dict)   # the NCCL/EFA preset + launch.env: what must reach every rank
    write_dirs: list[str] = field(default_factory=list)        # directories the job writes (run dir, logs, checkpoints...)
    read_paths: list[str] = field(default_factory=list)        # what it reads (tokenizer, image, container mount sources)
    dirs: dict[str, str] = field(default_factory=dict)         # kind (run, logs, checkpoints, tensorboard) -> directory
    off_shared: list[str] = field(default_factory=list)        # "path (field)" of each write dir that is on no FSx mount
    container: dict = field(default_factory=dict)              # the Pyxis flags the script passes (recorded, not applied)
    records: list[dict] = field(default_factory=list)          # the ranks' records (payload.py's format)
    output_tail: str = ""                                      # last lines of the job's Slurm output file
    #: a job on a share of one node (models[].plan.gpus): what its script asks for (clustertrain.plan.packing.JobShare:
    #: gpus, mem_mb, cpus_per_gpu); empty for a job on whole nodes
    share: dict = field(default_factory=dict)
    #: what Slurm allocated while it ran (:func:`job_allocation` of ``scontrol -d -o show job``); empty if not seen
    alloc: dict = field(default_factory=dict)


@dataclass
class Observed:
    """Everything the checks look at."""

    nodes: list[str]                                   # every emulated node, head node excluded
    boots: dict[str, dict] = field(default_factory=dict)   # node ("head" too) -> boot result (boot.py's format)
    jobs: list[JobView] = field(default_factory=list)
    texts: list[tuple[str, str]] = field(default_factory=list)  # (what, text) of every script and log, for the secrets scan
    skipped: str | None = None                         # why the jobs were not run (a node did not boot)
    capacity: dict[str, dict] = field(default_factory=dict)  # node -> {"cpus", "mem_mb", "gpus"} its slurm.conf line declares
    planned_shared_nodes: int | None = None            # nodes the plan packs the shared-node models on (None: not known)


@dataclass
class Check:
    name: str                      # booted, concurrent, world, rendezvous, one_gpu, gpus_unshared, shares, dirs, paths, preset, secrets
    title: str                     # one line: what the check asserts
    ok: bool | None                # None: not run (see details)
    details: list[str] = field(default_factory=list)   # one line per problem (naming the model, node, path, script)


@dataclass
class RehearsalReport:
    project: str
    nodes: int
    gpus: int
    wall_s: float
    checks: list[Check]
    jobs: list[dict] = field(default_factory=list)     # per model: model, job_id, planned_nodes, nodes (placed), state, reason
    kept: str | None = None                            # the rehearsal directory when --keep left it running

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def as_dict(self) -> dict:
        return {"project": self.project, "ok": self.ok, "nodes": self.nodes, "gpus": self.gpus, "wall_s": self.wall_s,
                "checks": [asdict(c) for c in self.checks], "jobs": self.jobs, "kept": self.kept}


def job_allocation(line: str) -> dict:
    """What Slurm allocated to a job, from one line of ``scontrol -d -o show job ID`` (Slurm 22.05): ``{"mem_mb":
    the job's TRES mem in MB, "cpus": NumCPUs, "oversubscribe": OverSubscribe (NO for --exclusive), "nodes": {node:
    {"cpus": n, "mem_mb": m, "gpus": [indices]}}}`` -- the per-node part from its ``Nodes=X CPU_IDs=.. Mem=M
    GRES=gpu:t:N(IDX:a-b,c)`` entries (``-d``); {} for an empty line."""
    if not line.strip():
        return {}
    def word(name: str) -> str:
        m = re.search(rf"(?:^|\s){re.escape(name)}=(\S*)", line)
        return m.group(1) if m else ""
    mem = re.search(r"(?:^|[\s,=])mem=(\d+(?:\.\d+)?)([KMGT]?)", word("AllocTRES") or word("TRES"))
    scale = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 * 1024}
    out: dict = {"mem_mb": int(float(mem.group(1)) * scale[mem.group(2)]) if mem else None,
                 "cpus": int(word("NumCPUs")) if word("NumCPUs").isdigit() else None,
                 "oversubscribe": word("OverSubscribe") or None, "nodes": {}}
    for m in re.finditer(r"(?:^|\s)Nodes=(\S+) CPU_IDs=(\S+) Mem=(\d+)(?: GRES=(\S*))?", line):
        cpus = sum(int(b) - int(a) + 1 if b else 1 for a, b in re.findall(r"(\d+)(?:-(\d+))?", m.group(2)))
        gpus = [k for a, b in re.findall(r"(\d+)(?:-(\d+))?", ",".join(re.findall(r"IDX:([0-9,-]+)", m.group(4) or "")))
                for k in range(int(a), int(b or a) + 1)]
        for node in expand_hostlist(m.group(1)):
            out["nodes"][node] = {"cpus": cpus, "mem_mb": int(m.group(3)), "gpus": gpus}
    return out
