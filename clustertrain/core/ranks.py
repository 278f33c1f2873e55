"""Rank wiring, in one place: who a process is in a distributed job, and where its ranks meet.

Leaf module (stdlib and :mod:`clustertrain.core.errors` only): ``train/`` imports it on compute nodes,
``validate/`` and ``launch/`` (and, through :func:`batch_lines`, the batch-script templates) use the
same rules.

Where the rank comes from (:func:`detect_ranks`, :meth:`RankInfo.from_environ`), first match wins:

* torchrun style (torchrun, the local launcher): ``RANK``, ``WORLD_SIZE``; ``LOCAL_RANK`` (default:
  ``RANK``), ``LOCAL_WORLD_SIZE`` (default: ``WORLD_SIZE``), ``GROUP_RANK`` (the node, default 0);
* Slurm (``srun`` starts the ranks, no torchrun): ``SLURM_PROCID``, ``SLURM_NTASKS``;
  ``SLURM_LOCALID`` (default 0), ``SLURM_NODEID`` (default 0), the tasks on this node from
  ``SLURM_TASKS_PER_NODE`` (``2(x3),1``) at ``SLURM_NODEID``, else ``SLURM_NTASKS_PER_NODE``;
* neither: not in a distributed job (a single process).

Rendezvous: ``MASTER_ADDR`` if set, else the first host of ``SLURM_STEP_NODELIST`` (where srun puts
rank 0) or ``SLURM_JOB_NODELIST``, else 127.0.0.1. ``MASTER_PORT`` if set, else :func:`port_for_job`
of ``SLURM_JOB_ID``, else 29500 (torchrun's default). A batch script sets both before ``srun``
(:func:`batch_lines`: the first node's ``NodeAddr``, as emulated node names need not resolve).

The port rule: ``20000 + job id % 10000``, so 20000-29999 — above the privileged ports, below
Linux's ephemeral range (``net.ipv4.ip_local_port_range``, default 32768-60999, where an outgoing
connection could already hold the port), the same on every node of a job, and different for the
10000 jobs that follow one another. Whole-node jobs never share a node (``--exclusive``), so that is enough for them.

Jobs that share a node (``models[].plan.gpus``, one node each) need more: two of them running at once with job ids
10000 apart would meet on one port. Their rule (:func:`shared_node_port`, ``batch_lines(shared_node=True)``) is
``20000 + (job id % 625) x 16 + the job's first GPU``, the first GPU being the first of ``SLURM_JOB_GPUS`` — the
job's global GPU ids, "not relative to any device cgroup, even if devices are constrained", set in batch jobs (Slurm's
sbatch man page, OUTPUT ENVIRONMENT VARIABLES). Jobs on one node hold disjoint GPUs, so their first GPUs differ and
so do their ports, whatever their ids (up to 16 GPUs a node; still 20000-29999). A share of CPU workers (no GPUs,
no ``SLURM_JOB_GPUS``) keeps the job-id rule. Ports that a rank binds itself (NCCL's and gloo's sockets, the async
checkpoint writers' store, :mod:`clustertrain.train.checkpoint_async` ``_free_port``) ask the kernel for port 0,
which it picks from the ephemeral range, never from 20000-29999 and never one that is in use.

Slurm hostlists (``node[01-03,7],gpu-[1-2]-x,other``): :func:`expand_hostlist`, the same list as
``scontrol show hostnames`` (zero padding kept, several bracket groups multiply).
"""

from __future__ import annotations

import itertools
import os
import re
from dataclasses import dataclass
from typing import Mapping

from clustertrain.core.errors import ClusterTrainError

PORT_BASE = 20000
PORT_SPAN = 10000
#: shared-node jobs: GPUs a node may have (the port's low part), and job-id slots above them (SHARED_SLOTS x GPU_SLOTS
#: = PORT_SPAN: the same 20000-29999)
GPU_SLOTS = 16
SHARED_SLOTS = PORT_SPAN // GPU_SLOTS
DEFAULT_PORT = 29500  # torchrun's, for a job that is not a Slurm job and names no MASTER_PORT
#: What a process reads to find its rank and its peers; also what a container must take from the host
#: (Pyxis ``--container-env``), so an image's own values cannot rewire the ranks.
RANK_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_JOB_ID",
                  "SLURM_NODEID", "SLURM_TASKS_PER_NODE", "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST")
#: torchrun-style variables; a batch script unsets them so that srun's SLURM_* variables decide.
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")
#: what a rank's error says when it failed because a peer died first (gloo, NCCL): a consequence, not the cause
PEER_FAILED_RE = re.compile(r"remote worker crash|Connection closed by peer|Connection reset by peer|"
                            r"remote process exited|peer process", re.IGNORECASE)


class RankError(ClusterTrainError):
    """The rank variables or a Slurm hostlist are malformed."""


@dataclass(frozen=True)
class RankInfo:
    """One process's place in a distributed job."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    master_addr: str
    master_port: int
    source: str  # "torchrun", "slurm" or "single"

    @classmethod
    def from_environ(cls, env: Mapping[str, str] | None = None) -> "RankInfo":
        """:func:`detect_ranks`, or a single process (rank 0 of 1 on 127.0.0.1) outside a distributed job."""
        env = os.environ if env is None else env
        found = detect_ranks(env)
        if found is not None:
            return found
        return cls(0, 1, 0, 1, 0, "127.0.0.1", _int(env, "MASTER_PORT", DEFAULT_PORT), "single")

    def environ(self) -> dict[str, str]:
        """The torchrun-style variables that make a child process this rank (the local launcher's)."""
        return {"RANK": str(self.rank), "WORLD_SIZE": str(self.world_size), "LOCAL_RANK": str(self.local_rank),
                "LOCAL_WORLD_SIZE": str(self.local_world_size), "GROUP_RANK": str(self.node_rank),
                "MASTER_ADDR": self.master_addr, "MASTER_PORT": str(self.master_port)}


def detect_ranks(env: Mapping[str, str] | None = None) -> RankInfo | None:
    """The distributed job this process is part of (see the module docstring), or None outside one."""
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        source = "torchrun"
        rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE")
        local = _int(env, "LOCAL_RANK", rank)
        local_world = _int(env, "LOCAL_WORLD_SIZE", world)
        node = _int(env, "GROUP_RANK", 0)
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        source = "slurm"
        rank, world = _int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS")
        local = _int(env, "SLURM_LOCALID", 0)
        node = _int(env, "SLURM_NODEID", 0)
        local_world = _tasks_on_node(env, node, world)
    else:
        return None
    if not 0 <= rank < world:
        raise RankError(f"rank environment: rank {rank} is outside world size {world}")
    if not 0 <= local < local_world:
        raise RankError(f"rank environment: local rank {local} is outside the {local_world} rank(s) of this node")
    addr = env.get("MASTER_ADDR") or first_host(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or "")
    if env.get("MASTER_PORT"):
        port = _int(env, "MASTER_PORT")
    elif env.get("SLURM_JOB_ID"):
        port = port_for_job(env["SLURM_JOB_ID"])
    else:
        port = DEFAULT_PORT
    if not 0 < port < 65536:
        raise RankError(f"rank environment: MASTER_PORT={port} is not a TCP port (1-65535)")
    return RankInfo(rank, world, local, local_world, node, addr or "127.0.0.1", port, source)


def port_for_job(job_id: str | int) -> int:
    """The rendezvous port of Slurm job ``job_id``: ``PORT_BASE + job id % PORT_SPAN`` (20000-29999)."""
    text = str(job_id).strip()
    if not text.isdigit():
        raise RankError(f"rank environment: SLURM_JOB_ID={text!r} is not a job number")
    return PORT_BASE + int(text) % PORT_SPAN


def shared_node_port(job_id: str | int, first_gpu: int | None) -> int:
    """The rendezvous port of a job on a share of one node (see the module docstring): ``PORT_BASE + (job id %
    SHARED_SLOTS) x GPU_SLOTS + first_gpu``; :func:`port_for_job` without GPUs (``first_gpu`` None)."""
    if first_gpu is None:
        return port_for_job(job_id)
    if not 0 <= first_gpu < GPU_SLOTS:
        raise RankError(f"rank environment: GPU id {first_gpu} is outside 0-{GPU_SLOTS - 1}; the shared-node port rule "
                        f"covers nodes of up to {GPU_SLOTS} GPUs")
    return PORT_BASE + (port_for_job(job_id) - PORT_BASE) % SHARED_SLOTS * GPU_SLOTS + first_gpu


def batch_lines(shared_node: bool = False) -> list[str]:
    """The bash lines a batch script runs before ``srun``: drop inherited torchrun variables (srun's
    SLURM_* decide the ranks), then export MASTER_ADDR (the first node's NodeAddr, else its name) and
    MASTER_PORT (:func:`port_for_job`'s rule; with ``shared_node``, :func:`shared_node_port`'s where the job has
    GPUs) — what :func:`detect_ranks` derives on the ranks."""
    lines = [
        f"unset {' '.join(TORCHRUN_VARIABLES)}",
        'first_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "MASTER_ADDR=$(scontrol show node \"$first_node\" -o | sed -n 's/.*NodeAddr=\\([^ ]*\\).*/\\1/p')",
        'export MASTER_ADDR="${MASTER_ADDR:-$first_node}"',
        f"export MASTER_PORT=$(({PORT_BASE} + SLURM_JOB_ID % {PORT_SPAN}))",
    ]
    if shared_node:  # a share of one node: co-located jobs hold disjoint GPUs, so their first GPUs differ
        lines += ['first_gpu="${SLURM_JOB_GPUS:-}"; first_gpu="${first_gpu%%,*}"',
                  f'case "$first_gpu" in ""|*[!0-9]*) ;; *) [ "$first_gpu" -lt {GPU_SLOTS} ] && '
                  f'export MASTER_PORT=$(({PORT_BASE} + SLURM_JOB_ID % {SHARED_SLOTS} * {GPU_SLOTS} + first_gpu)) ;; esac']
    return lines


def expand_hostlist(expr: str) -> list[str]:
    """Expand a Slurm hostlist: ``node[1-3,5]`` -> node1 node2 node3 node5; keeps zero padding
    (``gpu-[01-02]``); commas outside brackets separate hosts; several bracket groups multiply
    (``rack[1-2]-n[01-02]``). A malformed list raises :class:`RankError` naming it."""
    hosts: list[str] = []
    for item in _split_top(expr.strip(), expr):
        choices: list[list[str]] = []
        for part in re.split(r"(\[[^\[\]]*\])", item):
            if part.startswith("["):
                choices.append(_expand_range(part[1:-1], expr))
            elif "[" in part or "]" in part:
                raise RankError(f"hostlist {expr!r}: unbalanced brackets; expected forms like node[1-3,5]")
            elif part:
                choices.append([part])
        hosts.extend("".join(combo) for combo in itertools.product(*choices))
    return hosts


def first_host(expr: str) -> str | None:
    """The first host of a Slurm hostlist, or None for an empty one."""
    hosts = expand_hostlist(expr) if expr.strip() else []
    return hosts[0] if hosts else None


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    value = env.get(name, "")
    if value == "" and default is not None:
        return default
    try:
        return int(value)
    except ValueError:
        raise RankError(f"rank environment: {name}={value!r} is not an integer; unset it or fix the launcher") from None


def _tasks_on_node(env: Mapping[str, str], node: int, world: int) -> int:
    """Tasks on node ``node`` from ``SLURM_TASKS_PER_NODE`` (``2(x3),1`` = 2, 2, 2, 1)."""
    spec = env.get("SLURM_TASKS_PER_NODE", "")
    counts: list[int] = []
    for piece in filter(None, spec.split(",")):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", piece.strip())
        if not m:
            raise RankError(f"rank environment: SLURM_TASKS_PER_NODE={spec!r} is not like 2(x3),1")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    if node < len(counts):
        return counts[node]
    return _int(env, "SLURM_NTASKS_PER_NODE", world)


def _split_top(expr: str, whole: str) -> list[str]:
    items, depth, cur = [], 0, ""
    for ch in expr:
        depth += (ch == "[") - (ch == "]")
        if depth not in (0, 1):
            raise RankError(f"hostlist {whole!r}: unbalanced brackets; expected forms like node[1-3,5]")
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    if depth:
        raise RankError(f"hostlist {whole!r} has an unclosed '['; expected forms like node[1-3,5]")
    return [i for i in [*items, cur] if i]


def _expand_range(body: str, whole: str) -> list[str]:
    out = []
    for piece in body.split(","):
        lo, dash, hi = piece.partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()) or (hi and int(hi) < int(lo)):
            raise RankError(f"hostlist {whole!r}: bad range {piece!r}; expected forms like node[1-3,5]")
        width = len(lo)
        out.extend(str(i).zfill(width) for i in range(int(lo), int(hi or lo) + 1))
    return out
