"""The control plane's environment in the batch script: GLOO_SOCKET_IFNAME beside NCCL_SOCKET_IFNAME (computed on the
node, since gloo takes no ^exclusions), OMP_NUM_THREADS per rank, and --cpu-bind=none for GPU steps.

The rendered lines run for real in bash here (this machine's /proc/net/route, arithmetic with Slurm's variables),
and torch's gloo runs with the computed interface and with NCCL's exclusion list (torch.distributed: run under
``flock /tmp/ct-heavy.lock``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from clustertrain.launch.config import LaunchConfig
from clustertrain.launch.presets import NODE_RULES, node_env_lines, rank_environment
from clustertrain.launch.sbatch import build_request, container_env_names, render_script, srun_command
from clustertrain.project import validate_project


def project(**cluster):
    cluster = {"backend": "slurm", "nodes": 2, "gpus_per_node": 8, "instance_type": "p5.48xlarge", **cluster}
    world = cluster["nodes"] * (cluster["gpus_per_node"] or cluster.get("procs_per_node", 2))
    return validate_project({
        "name": "proj", "cluster": cluster, "storage": {"root": "/fsx"},
        "models": [{"name": "m1", "model": {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 64},
                    "training": {"max_steps": 10, "micro_batch": 8, "global_batch": 8 * world}}],
    })


def default_route_interface() -> str | None:
    """The kernel routing table read in Python: the default route with the lowest metric."""
    rows = [line.split() for line in Path("/proc/net/route").read_text().splitlines()[1:]]
    defaults = sorted((int(r[6]), r[0]) for r in rows if len(r) > 6 and r[1] == "00000000")
    return defaults[0][1] if defaults else None


def run_lines(lines: list[str], env: dict[str, str], show: str) -> str:
    script = "\n".join(["set -uo pipefail", *lines, f'echo "${{{show}-<unset>}}"'])
    proc = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.mark.parametrize("itype", ["p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge", "p4d.24xlarge"])
def test_gloo_interface_rule_wherever_nccl_has_one(itype):
    env = rank_environment(itype, 11, os="alinux2023")
    assert "NCCL_SOCKET_IFNAME" in env.set and env.on_node == {"GLOO_SOCKET_IFNAME": "default_route_interface"}
    assert "GLOO_SOCKET_IFNAME" not in env.set  # never NCCL's '^docker,lo,veth': gloo reads names only
    assert rank_environment("c6i.4xlarge", 2).on_node == {}  # no preset, no NCCL_SOCKET_IFNAME, no rule


def test_launch_env_replaces_or_removes_the_rule():
    assert rank_environment("p5.48xlarge", 2, LaunchConfig(env={"GLOO_SOCKET_IFNAME": "ens32"})).set[
        "GLOO_SOCKET_IFNAME"] == "ens32"
    removed = rank_environment("p5.48xlarge", 2, LaunchConfig(env={"GLOO_SOCKET_IFNAME": None}))
    assert "GLOO_SOCKET_IFNAME" not in removed.set and removed.on_node == {}


def test_rendered_rule_finds_this_machines_interface():
    lines = node_env_lines(rank_environment("p5.48xlarge", 2))
    want = default_route_interface()
    env = {"PATH": os.environ["PATH"], "GLOO_SOCKET_IFNAME": "stale-from-the-submitting-shell"}
    assert run_lines(lines, env, "GLOO_SOCKET_IFNAME") == (want or "<unset>")
    assert want is None or want != "lo"


def test_rule_without_a_default_route_leaves_the_variable_unset(tmp_path):
    table = tmp_path / "route"  # a routing table with only a local subnet (the format of /proc/net/route)
    table.write_text("Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
                     "eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n")
    rule = NODE_RULES["default_route_interface"].replace("/proc/net/route", str(table))
    env = {"PATH": os.environ["PATH"], "GLOO_SOCKET_IFNAME": "stale"}
    out = run_lines([f"GLOO_SOCKET_IFNAME=$({rule})",
                     'if [ -n "$GLOO_SOCKET_IFNAME" ]; then export GLOO_SOCKET_IFNAME; else unset GLOO_SOCKET_IFNAME; fi'],
                    env, "GLOO_SOCKET_IFNAME")
    assert out == "<unset>"
    table.write_text(table.read_text() + "ens6\t00000000\t010200C0\t0003\t0\t0\t1024\t00000000\t0\t0\t0\n"
                                          "ens5\t00000000\t010200C0\t0003\t0\t0\t512\t00000000\t0\t0\t0\n")
    assert run_lines([f"GLOO_SOCKET_IFNAME=$({rule})", "export GLOO_SOCKET_IFNAME"], env, "GLOO_SOCKET_IFNAME") == "ens5"


def omp_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(("OMP_NUM_THREADS=", "export OMP_NUM_THREADS="))]


@pytest.mark.parametrize("cpus, want", [("192", "24"), ("96", "12"), ("4", "1"), (None, "1")])
def test_threads_per_rank_computed_on_the_node(cpus, want):
    p = project()
    text = render_script(build_request(p, p.models[0], Path("/fsx/proj/m1")))
    env = {"PATH": os.environ["PATH"], **({"SLURM_CPUS_ON_NODE": cpus} if cpus else {})}
    assert run_lines(omp_lines(text), env, "OMP_NUM_THREADS") == want


def test_threads_per_rank_from_the_project():
    p = project(threads_per_worker=6, cpus_per_task=12)
    text = render_script(build_request(p, p.models[0], Path("/fsx/proj/m1")))
    assert omp_lines(text) == ["export OMP_NUM_THREADS=6"]
    p = project(cpus_per_task=12)
    assert omp_lines(render_script(build_request(p, p.models[0], Path("/fsx/proj/m1")))) == ["export OMP_NUM_THREADS=12"]
    own = build_request(p, p.models[0], Path("/fsx/proj/m1"), launch=LaunchConfig(env={"OMP_NUM_THREADS": "3"}))
    assert omp_lines(render_script(own)) == ["export OMP_NUM_THREADS=3"]  # launch.env's value, once


def test_cpu_bind_none_for_gpu_steps_unless_the_project_binds():
    p = project()
    assert "--cpu-bind=none" in srun_command(build_request(p, p.models[0], Path("/fsx/proj/m1")))
    own = build_request(p, p.models[0], Path("/fsx/proj/m1"), launch=LaunchConfig(srun_args=["--cpu-bind=cores"]))
    argv = srun_command(own)
    assert "--cpu-bind=none" not in argv and "--cpu-bind=cores" in argv
    cpu = project(gpus_per_node=0, procs_per_node=2, instance_type=None)
    assert not any(a.startswith("--cpu-bind") for a in srun_command(build_request(cpu, cpu.models[0], Path("/x"))))


def test_container_keeps_the_host_values():
    names = container_env_names(rank_environment("p5e.48xlarge", 2, container=True))
    assert {"GLOO_SOCKET_IFNAME", "OMP_NUM_THREADS", "NCCL_SOCKET_IFNAME"} <= set(names)


GLOO = textwrap.dedent("""
    import datetime, socket, sys, torch, torch.distributed as dist
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, 1, True, timeout=datetime.timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    x = torch.ones(1); dist.all_reduce(x); print("ok", x.item())
""")


@pytest.mark.skipif(default_route_interface() is None, reason="no default route here")
def test_gloo_takes_the_computed_name_and_rejects_nccls_exclusions():
    """torch's gloo: the computed interface works; NCCL's '^docker,lo,veth' is read as interface names and fails."""
    def gloo(ifname: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "GLOO_SOCKET_IFNAME": ifname}
        return subprocess.run([sys.executable, "-c", GLOO], env=env, capture_output=True, text=True, timeout=120)

    good = gloo(default_route_interface())
    assert good.returncode == 0 and "ok 1.0" in good.stdout, good.stderr[-1500:]
    bad = gloo("^docker,lo,veth")
    assert bad.returncode != 0 and re.search(r"address for.*\^docker|\^docker", bad.stderr), bad.stderr[-1500:]


def test_local_launcher_gives_each_rank_its_share(tmp_path):
    """Real rank processes from the local launcher: OMP_NUM_THREADS is the affinity's CPUs / ranks (a shell's stray
    value does not leak in), and the rank's torch uses it (clustertrain.train.threads.setup_rank_cpus)."""
    from clustertrain.launch.local_ranks import reap_ranks, start_local_ranks

    code = ("import json, os, sys; from clustertrain.train.threads import setup_rank_cpus; import torch; "
            "omp = os.environ['OMP_NUM_THREADS']; setup_rank_cpus(int(os.environ['WORLD_SIZE'])); "
            "open(sys.argv[1] + os.environ['RANK'], 'w').write(json.dumps([omp, torch.get_num_threads()]))")
    import json

    old = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "77"  # a stray value in the launching shell
    try:
        procs = start_local_ranks([sys.executable, "-c", code, str(tmp_path / "out")], 2, lambda r: tmp_path / f"{r}.log",
                                  extra_env={"PYTHONPATH": str(Path(__file__).resolve().parents[3])})
    finally:
        os.environ.pop("OMP_NUM_THREADS") if old is None else os.environ.__setitem__("OMP_NUM_THREADS", old)
    reap_ranks(procs.values(), grace=120)
    want = max(1, len(os.sched_getaffinity(0)) // 2)
    for rank in (0, 1):
        assert procs[rank].returncode == 0, (tmp_path / f"{rank}.log").read_text()[-1500:]
        assert json.loads((tmp_path / f"out{rank}").read_text()) == [str(want), want]
