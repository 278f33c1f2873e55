"""CPU threads and CPU binding of one rank: how many intra-op threads it runs, and on which CPUs.

Why. Under ``srun`` no torchrun starts the ranks, so nothing sets ``OMP_NUM_THREADS`` (torchrun sets it to 1 when it
starts several processes, ``torch/distributed/run.py``), and Slurm binds nothing unless asked: each of a p5's 8 ranks
would size its thread pools for all the node's CPUs (192 vCPUs, ``vcpus`` in ``clustertrain/plan/instances.yaml``)
and 8 x 192 threads would fight over 192 CPUs.

The rule (:func:`threads_per_rank`):

1. ``cluster.threads_per_worker`` when the project sets it;
2. else ``OMP_NUM_THREADS`` from the rank's environment, when it is a positive integer: the batch script
   (``clustertrain/launch/templates/sbatch.sh.j2``) and the local launcher (:mod:`clustertrain.launch.local_ranks`)
   export the share below, and ``launch.env`` may set it;
3. else the node's CPUs divided by the ranks per node: the CPUs are Slurm's ``SLURM_CPUS_ON_NODE`` (what the job was
   given on this node) or, without Slurm, this process's affinity (``os.sched_getaffinity(0)``: a cgroup or
   ``taskset`` limit counts, ``os.cpu_count()`` would not see it).

The count is at most the CPUs the rank may run on, at least 1. The rank exports it as ``OMP_NUM_THREADS`` too, for the
processes it starts (data-loader workers, the async checkpoint writer), and calls ``torch.set_num_threads``.

Binding (GPU ranks, :func:`bind_to_gpu_numa`). The batch script keeps Slurm's binding off (``--cpu-bind=none``, as
aws-ofi-nccl's wiki page "CPU Binding" recommends for NCCL with the plugin: every rank's mask holds all the node's
CPUs), and each rank binds itself to the CPUs of its GPU's NUMA node that it is allowed: the GPU's PCI address
(``torch.cuda.get_device_properties``: ``pci_domain_id``, ``pci_bus_id``, ``pci_device_id``) gives
``/sys/bus/pci/devices/<addr>/numa_node``, whose ``/sys/devices/system/node/node<N>/cpulist`` is intersected with the
current affinity. This is torchrun's ``--numa-binding=node`` (torch 2.13 ``torch/numa/binding.py``, "if in doubt,
use this option"), done in the rank because srun starts it: the threads that exist already are moved too, as torch
does. A node that reports no NUMA node for the GPU (``-1``), or an empty intersection (Slurm gave the rank CPUs
elsewhere), leaves the affinity as it is. ``CLUSTERTRAIN_NUMA_BIND=0`` (e.g. in ``launch.env``) turns binding off.

The instance catalog has each instance's ``vcpus`` but no NUMA layout: the rank reads the layout from ``/sys`` on the
node, which is right for any instance type.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, MutableMapping

SYS = Path("/sys")
#: ``0`` turns the GPU-NUMA binding off
NUMA_BIND_ENV = "CLUSTERTRAIN_NUMA_BIND"


def parse_cpulist(text: str) -> frozenset[int]:
    """A kernel cpulist (``0-47,96-143``; sysfs ``cpulist`` files, ``Cpus_allowed_list``) as a set of CPU numbers."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return frozenset(cpus)


def format_cpulist(cpus: set[int] | frozenset[int]) -> str:
    """The inverse of :func:`parse_cpulist`: ``{0, 1, 2, 5}`` -> ``0-2,5``."""
    ranges: list[list[int]] = []
    for cpu in sorted(cpus):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    out = [str(a) if a == b else f"{a}-{b}" for a, b in ranges]
    return ",".join(out)


def _positive(value: str | None) -> int | None:
    try:
        n = int(value) if value is not None else 0
    except ValueError:
        return None
    return n if n > 0 else None


def node_cpus(affinity: set[int] | frozenset[int], environ: Mapping[str, str] = os.environ) -> int:
    """The CPUs of this node that the job's ranks share: ``SLURM_CPUS_ON_NODE`` under Slurm, else ``len(affinity)``."""
    return _positive(environ.get("SLURM_CPUS_ON_NODE")) or len(affinity)


def threads_per_rank(affinity: set[int] | frozenset[int], ranks_per_node: int, *, explicit: int | None = None,
                     environ: Mapping[str, str] = os.environ) -> int:
    """Intra-op threads of one rank allowed ``affinity`` (the module docstring's rule)."""
    if explicit:
        return explicit
    from_env = _positive(environ.get("OMP_NUM_THREADS"))
    if from_env:
        return from_env
    share = node_cpus(affinity, environ) // max(1, ranks_per_node)
    return max(1, min(share, len(affinity) or 1))


def pci_address(domain: int, bus: int, device: int) -> str:
    """The sysfs name of a PCI function 0 (``0000:53:00.0``)."""
    return f"{domain:04x}:{bus:02x}:{device:02x}.0"


def numa_node_of_pci(address: str, sys_root: Path = SYS) -> int | None:
    """The NUMA node the kernel reports for a PCI device; None when it reports none (``-1``) or has no such file."""
    try:
        node = int((sys_root / "bus/pci/devices" / address / "numa_node").read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def numa_node_cpus(node: int, sys_root: Path = SYS) -> frozenset[int]:
    """The CPUs of NUMA node ``node`` (``/sys/devices/system/node/node<N>/cpulist``); empty when it is not there."""
    try:
        return parse_cpulist((sys_root / f"devices/system/node/node{node}/cpulist").read_text())
    except OSError:
        return frozenset()


def numa_binding(node: int | None, affinity: set[int] | frozenset[int], sys_root: Path = SYS) -> frozenset[int] | None:
    """The CPUs to bind to for a GPU on NUMA node ``node``: that node's CPUs this process may use; None (do not
    bind) when the node is unknown or none of its CPUs is allowed."""
    if node is None:
        return None
    cpus = numa_node_cpus(node, sys_root) & frozenset(affinity)
    return cpus or None


def bind_process(cpus: frozenset[int]) -> None:
    """Bind this process's main thread, and every thread that still has the main thread's old affinity, to ``cpus``
    (threads that set their own affinity keep it; threads started later inherit the main thread's)."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return
    for tid in tids:
        try:
            if os.sched_getaffinity(int(tid)) == before:
                os.sched_setaffinity(int(tid), cpus)
        except (OSError, ValueError):
            pass  # the thread ended meanwhile


def bind_to_gpu_numa(gpu_index: int, environ: Mapping[str, str] = os.environ, sys_root: Path = SYS) -> int | None:
    """Bind this process to the allowed CPUs of CUDA device ``gpu_index``'s NUMA node; the node, or None when the
    binding was not made (turned off, no NUMA information, no allowed CPU there)."""
    if environ.get(NUMA_BIND_ENV, "1") == "0":
        return None
    import torch

    props = torch.cuda.get_device_properties(gpu_index)
    node = numa_node_of_pci(pci_address(props.pci_domain_id, props.pci_bus_id, props.pci_device_id), sys_root)
    cpus = numa_binding(node, os.sched_getaffinity(0), sys_root)
    if cpus is None:
        return None
    bind_process(cpus)
    return node


@dataclass(frozen=True)
class RankCpus:
    """What :func:`setup_rank_cpus` did."""

    threads: int
    cpus: frozenset[int]          # the CPUs the rank may run on now
    numa_node: int | None = None  # the GPU's NUMA node it bound itself to (None: not bound)

    def describe(self) -> str:
        where = f"NUMA node {self.numa_node}'s " if self.numa_node is not None else ""
        return f"{self.threads} CPU thread(s) per rank on {where}CPUs {format_cpulist(self.cpus)}"


def setup_rank_cpus(ranks_per_node: int, *, explicit: int | None = None, gpu_index: int | None = None,
                    environ: MutableMapping[str, str] = os.environ, sys_root: Path = SYS) -> RankCpus:
    """Bind a GPU rank to its GPU's NUMA node (``gpu_index``; None: a CPU rank, no binding), then set its threads
    (:func:`threads_per_rank`, counted before the binding) in ``OMP_NUM_THREADS`` and ``torch.set_num_threads``.
    Call it once, early: after ``torch.cuda.set_device``, before the model and the process group."""
    import torch

    allowed = os.sched_getaffinity(0)
    threads = threads_per_rank(allowed, ranks_per_node, explicit=explicit, environ=environ)
    node = bind_to_gpu_numa(gpu_index, environ, sys_root) if gpu_index is not None else None
    cpus = frozenset(os.sched_getaffinity(0))
    threads = max(1, min(threads, len(cpus))) if not explicit else threads
    environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)
    return RankCpus(threads, cpus, node)
