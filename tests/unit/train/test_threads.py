"""CPU threads and NUMA binding of a rank (clustertrain/train/threads.py).

The sysfs readers run on files recorded from this machine (fixtures/sysfs_recorded.txt, one NUMA node, PCI devices
reporting -1) and on a two-socket layout written in the same kernel format (no two-socket machine here; the layout is
the shape of a 192-vCPU, 2-node host, constructed, not recorded). The thread count and the binding also run for real
in subprocesses on this machine; the CUDA binding runs only where a GPU is (``gpu`` marker).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from clustertrain.train.threads import (
    format_cpulist, numa_binding, numa_node_cpus, numa_node_of_pci, parse_cpulist, pci_address, threads_per_rank,
)

FIXTURES = Path(__file__).parent / "fixtures"
ROOT = Path(__file__).resolve().parents[3]
#: constructed (see the module docstring): node 0 = CPUs 0-47 and their SMT siblings 96-143, node 1 the rest
TWO_SOCKETS = {
    "devices/system/node/possible": "0-1",
    "devices/system/node/node0/cpulist": "0-47,96-143",
    "devices/system/node/node1/cpulist": "48-95,144-191",
    "bus/pci/devices/0000:53:00.0/numa_node": "0",
    "bus/pci/devices/0000:a8:00.0/numa_node": "1",
}


def sysfs(root: Path, files: dict[str, str]) -> Path:
    for rel, content in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(content + "\n")
    return root


def recorded() -> dict[str, str]:
    lines = (FIXTURES / "sysfs_recorded.txt").read_text().splitlines()
    assert lines[0].startswith("# Recorded from")
    return dict(line.split("\t", 1) for line in lines if line and not line.startswith("#"))


def test_cpulist_parse_and_format():
    assert parse_cpulist("0-47,96-143\n") == frozenset([*range(0, 48), *range(96, 144)])
    assert parse_cpulist("3") == {3} and parse_cpulist("") == frozenset() and parse_cpulist("0-1,4,6-7") == {0, 1, 4, 6, 7}
    assert format_cpulist({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8"
    assert format_cpulist(parse_cpulist("48-95,144-191")) == "48-95,144-191"


def test_recorded_sysfs_of_this_machine(tmp_path):
    root = sysfs(tmp_path, recorded())
    assert numa_node_cpus(0, root) == {0, 1}
    assert numa_node_cpus(1, root) == frozenset()  # no such node
    assert numa_node_of_pci("0000:00:03.0", root) is None  # the kernel says -1: no NUMA affinity known
    assert numa_binding(numa_node_of_pci("0000:00:03.0", root), {0, 1}, root) is None  # so: no binding
    assert numa_node_of_pci("0000:ff:00.0", root) is None  # no such device


def test_two_socket_binding(tmp_path):
    root = sysfs(tmp_path, TWO_SOCKETS)
    everything = frozenset(range(192))
    assert pci_address(0, 0xA8, 0) == "0000:a8:00.0"
    node = numa_node_of_pci(pci_address(0, 0xA8, 0), root)
    assert node == 1
    assert numa_binding(node, everything, root) == parse_cpulist("48-95,144-191")
    assert numa_binding(0, everything, root) == parse_cpulist("0-47,96-143")
    # Slurm gave the rank 24 CPUs on node 0 only: nothing of node 1 is allowed, so the rank keeps what it has
    assert numa_binding(1, frozenset(range(24)), root) is None
    assert numa_binding(0, frozenset(range(40, 64)), root) == frozenset(range(40, 48))


@pytest.mark.parametrize("affinity, ranks, env, explicit, want", [
    (range(192), 8, {}, None, 24),                              # p5, srun, no Slurm CPU count: the affinity
    (range(192), 8, {"SLURM_CPUS_ON_NODE": "192"}, None, 24),
    (range(96), 8, {"SLURM_CPUS_ON_NODE": "96"}, None, 12),     # SMT off: 96 CPUs
    (range(24), 8, {"SLURM_CPUS_ON_NODE": "192"}, None, 24),    # Slurm bound the rank to its 24 CPUs
    (range(16), 8, {"SLURM_CPUS_ON_NODE": "192"}, None, 16),    # never more threads than allowed CPUs
    (range(192), 8, {"OMP_NUM_THREADS": "6"}, None, 6),         # the batch script's / launch.env's value
    (range(192), 8, {"OMP_NUM_THREADS": "zero"}, None, 24),     # not a number: ignored
    (range(192), 8, {"OMP_NUM_THREADS": "6"}, 4, 4),            # cluster.threads_per_worker wins
    (range(2), 2, {}, None, 1),
    (range(2), 3, {}, None, 1),                                 # at least one
])
def test_threads_per_rank(affinity, ranks, env, explicit, want):
    assert threads_per_rank(frozenset(affinity), ranks, explicit=explicit, environ=env) == want


RANK = textwrap.dedent("""
    import json, os, sys, threading
    started, stop = threading.Event(), threading.Event()
    side = threading.Thread(target=lambda: (started.set(), stop.wait()), daemon=True)
    side.start(); started.wait()  # a thread that exists before the binding
    from clustertrain.train import threads
    if sys.argv[1] == "bind":
        threads.bind_process(frozenset({0}))
    info = threads.setup_rank_cpus(int(sys.argv[2]))
    import torch
    print(json.dumps({"torch": torch.get_num_threads(), "info": info.threads, "omp": os.environ["OMP_NUM_THREADS"],
                      "main": sorted(os.sched_getaffinity(0)), "side": sorted(os.sched_getaffinity(side.native_id)),
                      "child": os.popen("echo $OMP_NUM_THREADS").read().strip()}))
""")


def run_rank(mode: str, ranks: int, affinity: set[int] | None = None) -> dict:
    import json

    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "SLURM_CPUS_ON_NODE")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-c", RANK, mode, str(ranks)], env=env, capture_output=True, text=True,
                          timeout=120, preexec_fn=(lambda: os.sched_setaffinity(0, affinity)) if affinity else None)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_rank_threads_for_real():
    """A real rank process: torch's thread count is what the rule computed from its affinity (not os.cpu_count),
    exported to what it starts."""
    allowed = os.sched_getaffinity(0)
    out = run_rank("count", 1)
    assert out["torch"] == out["info"] == len(allowed) and out["omp"] == out["child"] == str(len(allowed))
    if len(allowed) >= 2:
        one = run_rank("count", 1, affinity={min(allowed)})  # taskset-like limit: one CPU though the machine has more
        assert one["torch"] == 1 and one["main"] == [min(allowed)]
        assert run_rank("count", 2)["torch"] == len(allowed) // 2


@pytest.mark.skipif(0 not in os.sched_getaffinity(0) or len(os.sched_getaffinity(0)) < 2, reason="needs CPUs 0 and 1")
def test_bind_moves_existing_threads():
    out = run_rank("bind", 1)
    assert out["main"] == [0] and out["side"] == [0]  # the thread started before the binding moved too
    assert out["torch"] == 1  # counted before the binding (2 CPUs, 1 rank) but capped at the one CPU it may use


@pytest.mark.gpu
def test_gpu_rank_binds_to_its_numa_node():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    code = textwrap.dedent("""
        import json, os, torch
        from clustertrain.train import threads
        torch.cuda.set_device(0)
        before = os.sched_getaffinity(0)
        info = threads.setup_rank_cpus(torch.cuda.device_count(), gpu_index=0)
        p = torch.cuda.get_device_properties(0)
        node = threads.numa_node_of_pci(threads.pci_address(p.pci_domain_id, p.pci_bus_id, p.pci_device_id))
        want = threads.numa_binding(node, before)
        print(json.dumps({"node": info.numa_node, "want_node": node if want else None, "cpus": sorted(info.cpus),
                          "want": sorted(want or before), "threads": torch.get_num_threads(), "info": info.threads}))
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("OMP_NUM_THREADS", None)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    import json

    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["node"] == out["want_node"] and out["cpus"] == out["want"] and out["threads"] == out["info"] >= 1
