"""The ranks' step-boundary agreement (:class:`clustertrain.train.control.Control`) on real gloo processes: a stop
request on one rank is agreed by every rank one boundary later, the committed async save is the minimum every
rank has finished, and CPU ranks make no second process group (the default gloo group is the control group)."""

from __future__ import annotations

import socket

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

pytestmark = pytest.mark.slow


def _rank(rank: int, world: int, port: int, out) -> None:
    from clustertrain.train.control import Control

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    control = Control()
    names = control.gather_objects(f"node{rank}")
    answers = []
    for boundary in range(4):
        answers.append(control.finish())
        # rank 1 asks to stop at boundary 2; rank r finished writing the save of step 10*boundary - r
        control.start(stop_requested=rank == 1 and boundary == 2, finished_step=10 * boundary - rank)
    answers.append(control.finish())
    groups = len(dist.distributed_c10d._world.pg_map)
    dist.destroy_process_group()
    out.put((rank, names, answers, control.group, groups))


def test_agreement_one_boundary_late_on_the_default_gloo_group():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, 3, port, out)) for r in range(3)]
    for p in procs:
        p.start()
    results = sorted(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    for rank, names, answers, group, groups in results:
        assert names == ["node0", "node1", "node2"]
        # boundary 0 has nothing in flight; boundary b answers what was started at b-1: stop only after boundary 2,
        # and the save step is the minimum over ranks (rank 2 is the slowest: 10*(b-1) - 2)
        assert answers == [(False, -1), (False, -2), (False, 8), (True, 18), (False, 28)]
        assert group is None and groups == 1  # the default group carries it: no second all-pairs gloo group
