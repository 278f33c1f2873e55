"""What a rehearsal observed, as values: the input of :mod:`clustertrain.rehearsal.checks` and the
report (``clustertrain rehearse --json`` prints :meth:`RehearsalReport.as_dict`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


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


@dataclass
class Observed:
    """Everything the checks look at."""

    nodes: list[str]                                   # every emulated node, head node excluded
    boots: dict[str, dict] = field(default_factory=dict)   # node ("head" too) -> boot result (boot.py's format)
    jobs: list[JobView] = field(default_factory=list)
    texts: list[tuple[str, str]] = field(default_factory=list)  # (what, text) of every script and log, for the secrets scan
    skipped: str | None = None                         # why the jobs were not run (a node did not boot)


@dataclass
class Check:
    name: str                      # booted, concurrent, world, rendezvous, one_gpu, gpus_unshared, dirs, paths, preset, secrets
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
