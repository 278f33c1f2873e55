"""The parallel layout of one model's ranks: the one description the planner and the trainer read.

``models[].parallelism`` (:class:`~clustertrain.train.config.ParallelismConfig`) says what the user
asks for; :func:`resolve_layout` turns it into a :class:`ParallelLayout` for a world size, and
:func:`layout_problems` lists why it cannot work, each problem naming its field. Pure Python: the
planner and ``clustertrain check`` import it without torch.

Rank order: ``rank = dp_rank * tp + tp_rank`` (tp innermost), the order of
``init_device_mesh(..., (dp, tp), mesh_dim_names=("dp", "tp"))``. With Slurm's block distribution
(ranks fill a node before the next), a tensor-parallel group of ``tp <= GPUs per node`` consecutive
ranks sits on one node, so its per-layer collectives use NVLink, not the network.

Data: the ranks of one tensor-parallel group read the same micro-batch; the data-parallel rank
picks it. Step ``n`` consumes samples ``[n * global_batch, (n + 1) * global_batch)`` whatever the
layout, so a run resumed with another layout continues at exactly the same sample.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from clustertrain.train.config import ArchConfig, ParallelismConfig

#: the vocabulary padding when ``model.vocab`` is unset (:func:`clustertrain.train.model.padded_vocab`)
VOCAB_PAD = 64


@dataclass(frozen=True)
class ParallelLayout:
    """A resolved layout: every degree a number, dtypes decided."""

    world: int
    dp: int
    tp: int = 1
    pp: int = 1
    zero_stage: int = 0
    reshard_after_forward: bool = True
    recompute: str = "none"
    sequence_parallel: bool = False
    compile: bool = False
    param_dtype: str = "fp32"
    reduce_dtype: str = "fp32"

    @property
    def fsdp(self) -> bool:
        return self.zero_stage == 3

    def dp_rank(self, rank: int) -> int:
        return rank // (self.tp * self.pp)

    def tp_rank(self, rank: int) -> int:
        return rank % self.tp

    def describe(self) -> str:
        """``fsdp 2 x tp 2 +sp, recompute selective, bf16 params / fp32 reduce`` — for logs and reports."""
        parts = [f"{'fsdp' if self.fsdp else 'ddp'} {self.dp}"]
        if self.tp > 1:
            parts.append(f"tp {self.tp}" + (" +sp" if self.sequence_parallel else ""))
        text = " x ".join(parts)
        extras = []
        if self.recompute != "none":
            extras.append(f"recompute {self.recompute}")
        if self.compile:
            extras.append("compiled")
        extras.append(f"{self.param_dtype} params" + (f" / {self.reduce_dtype} reduce" if self.fsdp else ""))
        return text + ", " + ", ".join(extras)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class LayoutError(ValueError):
    """An impossible layout: ``field`` (e.g. ``parallelism.tp``) and one line saying why and what to do."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def param_dtype_for(par: "ParallelismConfig", on_gpu: bool) -> str:
    if par.param_dtype == "auto":
        return "bf16" if on_gpu else "fp32"
    return par.param_dtype


def structure_problems(arch: "ArchConfig", par: "ParallelismConfig") -> list[tuple[str, str]]:
    """(field, problem) for a tp that cannot split this architecture (independent of the world size)."""
    tp, out = par.tp, []
    if tp == 1:
        return out
    if arch.heads % tp:
        out.append(("parallelism.tp", f"tp={tp} does not divide model.heads={arch.heads}; valid tp: {_divisors(arch.heads)}"))
    if arch.ffn_dim % tp:
        out.append(("parallelism.tp", f"tp={tp} does not divide the MLP width {arch.ffn_dim} (model.ffn_hidden); "
                                      f"choose a tp that divides both heads and {arch.ffn_dim}"))
    if arch.vocab is not None and arch.vocab % tp:
        out.append(("model.vocab", f"vocab={arch.vocab} is not divisible by tp={tp} (the embedding and output layer are "
                                   f"split by vocabulary rows); round it up to {(arch.vocab + tp - 1) // tp * tp}"))
    if arch.vocab is None and VOCAB_PAD % tp:
        out.append(("parallelism.tp", f"tp={tp} does not divide the vocabulary padding {VOCAB_PAD}; set model.vocab to a "
                                      f"multiple of {tp}"))
    return out


def node_problems(par: "ParallelismConfig", ranks_per_node: int) -> list[tuple[str, str]]:
    """(field, problem) for a tensor-parallel group that would not fit on one node."""
    out = []
    if par.tp > ranks_per_node:
        out.append(("parallelism.tp", f"tp={par.tp} is larger than the {ranks_per_node} ranks of a node: a tensor-parallel "
                                      "group must stay on one node's NVLink; use a tp that divides the GPUs per node"))
    elif ranks_per_node % par.tp:
        out.append(("parallelism.tp", f"tp={par.tp} does not divide the {ranks_per_node} ranks of a node, so some "
                                      "tensor-parallel groups would span two nodes; choose a divisor"))
    return out


def world_problems(par: "ParallelismConfig", world: int, ranks_per_node: int | None = None) -> list[tuple[str, str]]:
    """(field, problem) for a layout that does not fit ``world`` ranks (of ``ranks_per_node`` per node, when given)."""
    out = node_problems(par, ranks_per_node) if ranks_per_node is not None else []
    mp = par.tp * par.pp
    if world % mp:
        out.append(("parallelism.tp", f"world size {world} is not divisible by tp x pp = {mp}"))
    elif par.dp != "auto" and par.dp * mp != world:
        out.append(("parallelism.dp", f"dp={par.dp} x tp={par.tp} x pp={par.pp} = {par.dp * mp} but the job has {world} "
                                      f"ranks; set dp: auto (= {world // mp})"))
    return out


def resolve_layout(par: "ParallelismConfig", world: int, on_gpu: bool, ranks_per_node: int | None = None) -> ParallelLayout:
    """The layout of ``par`` on ``world`` ranks; :class:`LayoutError` (the first problem) when it cannot work."""
    problems = world_problems(par, world, ranks_per_node)
    if problems:
        raise LayoutError(*problems[0])
    mp = par.tp * par.pp
    return ParallelLayout(
        world=world, dp=world // mp, tp=par.tp, pp=par.pp, zero_stage=par.zero_stage,
        reshard_after_forward=par.reshard_after_forward, recompute=par.recompute,
        sequence_parallel=par.sequence_parallel, compile=par.compile, param_dtype=param_dtype_for(par, on_gpu),
        reduce_dtype=par.reduce_dtype if par.zero_stage == 3 else "fp32",
    )


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)
