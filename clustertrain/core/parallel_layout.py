"""The parallel layout of one model's ranks: the one description the planner and the trainer read.

``models[].parallelism`` (:class:`~clustertrain.train.config.ParallelismConfig`) says what the user
asks for; :func:`resolve_layout` turns it into a :class:`ParallelLayout` for a world size, and
:func:`layout_problems` lists why it cannot work, each problem naming its field. Pure Python: the
planner and ``clustertrain check`` import it without torch.

Rank order: ``rank = (pp_rank * dp + dp_rank) * tp + tp_rank`` (tp innermost, pp outermost), the order of
``init_device_mesh(..., (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))`` (Megatron-LM's default order,
tp-dp-pp). With Slurm's block distribution (ranks fill a node before the next), a tensor-parallel group of
``tp <= GPUs per node`` consecutive ranks sits on one node, so its per-layer collectives use NVLink, not the
network; a pipeline stage is ``dp x tp`` consecutive ranks (whole nodes at scale), so only the stage-to-stage
activations and the data-parallel reduction cross nodes.

Pipeline stages: the layers split into ``pp x virtual_stages`` consecutive stages (:func:`stage_layers`); rank
``pp_rank`` holds stages ``pp_rank, pp_rank + pp, ...`` (interleaved 1F1B's loop order). The first stage holds the
embeddings, the last the final norm and output layer; when the layers divide evenly they split evenly, otherwise
by the cost model of :func:`stage_costs` (the output layer counted in blocks' worth of compute), the split the
planner plans with.

Gradient exchange (``grad_sync``): with FSDP2 (``zero_stage: 3``) and no pipeline, ``per_microbatch`` reduce-scatters
every block's gradients after each micro-batch's backward (FSDP2's own default: gradients are sharded at once, the
least memory), ``per_step`` only after the step's last one (the others run with FSDP2's
``set_requires_gradient_sync(False)`` and ``set_reshard_after_backward(False)``, as torch's own
``torch/distributed/pipelining/stage.py`` does in ``backward_maybe_with_nosync``): one reduce-scatter per block per
step instead of one per micro-batch, at the cost of every block's gathered parameters and unsharded gradient (in
``reduce_dtype``: FSDP2's ``FSDPParam.to_accumulated_grad_if_needed``) held from the first backward to the step's
end. DDP (``no_sync`` until the last micro-batch) and pipeline stages (``PipelineStage`` holds the reduce-scatter
until its ``perform_reduce_grad``) already exchange once per step: their layouts always say ``per_step``.
Under pipeline parallelism ``reshard_after_forward`` is always false: the stage keeps its blocks gathered from its
first backward to the step's end anyway, so resharding after each forward saves no peak memory and costs an
all-gather per micro-batch (torchtitan's default, ``torchtitan/distributed/fsdp.py``
``get_fsdp_reshard_after_forward_policy``: "For PP, by default do not reshard after forward to avoid per-microbatch
all-gathers").

Data: the ranks of one tensor-parallel group read the same micro-batch; the data-parallel rank
picks it. Step ``n`` consumes samples ``[n * global_batch, (n + 1) * global_batch)`` whatever the
layout, so a run resumed with another layout continues at exactly the same sample.
"""

from __future__ import annotations

import math
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
    virtual_stages: int = 1
    schedule: str = "1f1b"
    zero_stage: int = 0
    reshard_after_forward: bool = True
    recompute: str = "none"
    sequence_parallel: bool = False
    compile: bool = False
    param_dtype: str = "fp32"
    reduce_dtype: str = "fp32"
    grad_sync: str = "per_microbatch"    # per_microbatch | per_step; always per_step without FSDP2 or with pp > 1

    def __post_init__(self) -> None:
        # what the trainer does whatever was asked (module docstring): DDP and pipeline stages exchange once per step,
        # and a pipelined FSDP2 block is never resharded after its forward
        if not self.fsdp or self.pp > 1:
            object.__setattr__(self, "grad_sync", "per_step")
        if self.pp > 1:
            object.__setattr__(self, "reshard_after_forward", False)

    @property
    def fsdp(self) -> bool:
        return self.zero_stage == 3

    @property
    def stages(self) -> int:
        """Pipeline stages in all (``pp x virtual_stages``)."""
        return self.pp * self.virtual_stages

    def dp_rank(self, rank: int) -> int:
        return (rank // self.tp) % self.dp

    def pp_rank(self, rank: int) -> int:
        return rank // (self.dp * self.tp)

    def rank_stages(self, rank: int) -> list[int]:
        """The pipeline stages ``rank`` holds (``[0]`` without pipeline parallelism)."""
        return list(range(self.pp_rank(rank), self.stages, self.pp))

    def tp_rank(self, rank: int) -> int:
        return rank % self.tp

    def describe(self, dtypes: bool = True) -> str:
        """``fsdp 2 x tp 2 +sp x pp 2 1f1b, recompute selective, bf16 params / fp32 reduce`` — for logs and reports
        (``dtypes=False``: without the configured dtypes, for a line that states the ones a built model uses)."""
        parts = [f"{'fsdp' if self.fsdp else 'ddp'} {self.dp}"]
        if self.tp > 1:
            parts.append(f"tp {self.tp}" + (" +sp" if self.sequence_parallel else ""))
        if self.pp > 1:
            parts.append(f"pp {self.pp}" + (f" (v {self.virtual_stages})" if self.virtual_stages > 1 else "")
                         + f" {self.schedule}")
        text = " x ".join(parts)
        extras = []
        if self.recompute != "none":
            extras.append(f"recompute {self.recompute}")
        if self.compile:
            extras.append("compiled")
        if self.fsdp and self.pp == 1 and self.grad_sync == "per_step":
            extras.append("grads reduced once per step")
        if dtypes:
            extras.append(f"{self.param_dtype} params" + (f" / {self.reduce_dtype} reduce" if self.fsdp else ""))
        return "".join([text, *(", " + extra for extra in extras)])

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: the defaults of the ParallelLayout fields a checkpoint written before them lacks (``meta.json``'s ``layout``)
LAYOUT_DEFAULTS = {"virtual_stages": 1, "schedule": "1f1b", "grad_sync": "per_microbatch"}


def normalized_layout(layout: dict[str, Any]) -> dict[str, Any]:
    """A layout as written in a checkpoint's ``meta.json``, with the fields added since (:data:`LAYOUT_DEFAULTS`) and
    what :class:`ParallelLayout` always decides (a DDP or pipelined layout's ``grad_sync``, a pipelined one's
    ``reshard_after_forward``): two layouts the trainer runs alike compare equal; keys this version does not know are
    kept as they are."""
    merged = {**LAYOUT_DEFAULTS, **layout}
    known = {k: v for k, v in merged.items() if k in ParallelLayout.__dataclass_fields__}
    try:
        return {**merged, **ParallelLayout(**known).to_dict()}
    except TypeError:   # a required field missing: compare as written
        return merged


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
    if arch.kv_head_count % tp:
        out.append(("parallelism.tp", f"tp={tp} does not divide model.kv_heads={arch.kv_head_count} (each tensor-parallel "
                                      f"rank holds whole key/value heads); valid tp: {_divisors(arch.kv_head_count)}"))
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
        field = "parallelism.pp" if par.pp > 1 else "parallelism.tp"
        valid = [d for d in range(1, world + 1) if world % (d * par.tp) == 0] if par.pp > 1 else []
        out.append((field, f"world size {world} is not divisible by tp x pp = {par.tp} x {par.pp} = {mp}"
                           + (f"; pp that fit with tp={par.tp}: {', '.join(map(str, valid))}" if valid else "")))
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
        world=world, dp=world // mp, tp=par.tp, pp=par.pp, virtual_stages=par.virtual_stages,
        schedule=par.schedule if par.pp > 1 else "1f1b", zero_stage=par.zero_stage,
        reshard_after_forward=par.reshard_after_forward, recompute=par.recompute,
        sequence_parallel=par.sequence_parallel, compile=par.compile, param_dtype=param_dtype_for(par, on_gpu),
        reduce_dtype=par.reduce_dtype if par.zero_stage == 3 else "fp32",
        grad_sync="per_step" if par.grad_sync == "per_step" else "per_microbatch",  # auto: FSDP2's own, per micro-batch
    )


def pipeline_problems(arch: "ArchConfig", par: "ParallelismConfig") -> list[tuple[str, str]]:
    """(field, problem) for pipeline stages that cannot split this architecture (independent of the world size)."""
    stages = par.pp * par.virtual_stages
    if par.pp == 1:
        return []
    if stages > arch.layers:
        what = f"pp={par.pp}" + (f" x virtual_stages={par.virtual_stages}" if par.virtual_stages > 1 else "")
        return [("parallelism.pp", f"{what} = {stages} pipeline stages but model.layers={arch.layers}: every stage needs "
                                   f"at least one block; use pp <= {arch.layers // par.virtual_stages}")]
    if par.virtual_stages > 1 and arch.layers % stages:
        return [("parallelism.virtual_stages", f"model.layers={arch.layers} does not divide into pp={par.pp} x "
                 f"virtual_stages={par.virtual_stages} = {stages} equal stages (interleaving needs equal chunks); valid "
                 f"virtual_stages: {', '.join(str(v) for v in range(1, arch.layers // par.pp + 1) if arch.layers % (par.pp * v) == 0)}")]
    return []


def stage_costs(arch: "ArchConfig", vocab: int) -> tuple[float, float]:
    """(first, last): the extra compute of the first stage (embeddings: none worth counting) and of the last (the
    output layer, h x V multiply-adds per token) in blocks' worth (a block: 2h² + 2hk attention projections, k =
    kv_heads x head_dim; 2hf (GELU) or 3hf (SwiGLU) MLP, 2sh attention scores and values per token)."""
    h, f, s = arch.hidden, arch.ffn_dim, arch.seq_len
    k = arch.kv_head_count * arch.head_dim
    block = 2 * h * h + 2 * h * k + (3 if arch.mlp == "swiglu" else 2) * h * f + 2 * s * h
    return 0.0, h * vocab / block


def stage_layers(layers: int, stages: int, extra: tuple[float, float] = (0.0, 0.0)) -> list[range]:
    """The blocks of each of ``stages`` pipeline stages: an even split when ``stages`` divides ``layers``; otherwise
    the split whose most loaded stage is least loaded, a stage's load being its blocks plus ``extra`` (first, last;
    :func:`stage_costs`), ties going to the earlier stages keeping more blocks."""
    if stages > layers:
        raise ValueError(f"{stages} stages for {layers} layers")
    if layers % stages == 0:
        counts = [layers // stages] * stages
    else:
        counts = _balanced_counts(layers, stages, extra)
    out, start = [], 0
    for n in counts:
        out.append(range(start, start + n))
        start += n
    return out


def _balanced_counts(layers: int, stages: int, extra: tuple[float, float]) -> list[int]:
    extras = [0.0] * stages
    extras[0] += extra[0]
    extras[-1] += extra[1]
    best: list[int] | None = None
    for target in sorted({k + e for k in range(1, layers + 1) for e in set(extras)}):
        caps = [max(1, math.floor(target - e + 1e-9)) for e in extras]
        if sum(caps) < layers or any(c + e > target + 1e-9 for c, e in zip(caps, extras)):
            continue
        best = caps
        break
    assert best is not None
    surplus = sum(best) - layers
    while surplus:  # take blocks back from the most loaded stage (the later one on a tie) that can spare one
        i = max((i for i in range(stages) if best[i] > 1), key=lambda i: (best[i] + extras[i], i))
        best[i] -= 1
        surplus -= 1
    return best


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)
