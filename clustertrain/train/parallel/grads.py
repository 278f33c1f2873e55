"""Gradient-norm clipping over parameters that live on different meshes: with FSDP × TP, the
tensor-parallel weights are DTensors on the 2-D mesh while replicated norms are sharded on ``dp``
only. ``torch.nn.utils.get_total_norm`` cannot stack norms of different meshes, so each group's
norm is taken by DTensor (the norm of the global tensor), the groups' norms are combined, and
every group is scaled with ``clip_grads_with_norm_``. Pipeline stages add their squared norms over the
pipeline group first."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import torch


def clip_grad_norm_(parameters: Iterable[torch.Tensor], max_norm: float, pp_group=None) -> torch.Tensor:
    """Clip in place to ``max_norm`` (inf: only measure); return the global L2 norm (a plain tensor). ``pp_group``:
    the pipeline ranks whose stages hold the rest of the model (their squared norms are summed)."""
    groups: dict[object, list[torch.Tensor]] = defaultdict(list)
    for p in parameters:
        if p.grad is not None:
            key = (p.grad.device_mesh, tuple(p.grad.placements)) if hasattr(p.grad, "device_mesh") else None
            groups[key].append(p)
    norms = []
    for params in groups.values():
        norm = torch.nn.utils.get_total_norm([p.grad for p in params], norm_type=2.0)
        norms.append(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    total = torch.linalg.vector_norm(torch.stack(norms)) if norms else torch.zeros(())
    if pp_group is not None:
        import torch.distributed as dist

        squared = total.float() ** 2
        dist.all_reduce(squared, group=pp_group)
        total = squared.sqrt()
    if max_norm != float("inf"):
        for params in groups.values():
            torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total
