"""``make_plan(project) -> Plan``: the arithmetic of a project file — cluster totals, per-model
memory, time and cost, the allocation of nodes across models — and what is wrong with it.

Two modes: with ``plan.cluster_nodes`` the models train at the same time and share that many
nodes (allocated by :func:`clustertrain.plan.allocate.allocate`); without it they run one after
another, each on ``models[].plan.nodes`` or ``cluster.nodes``.

Each model is planned with its ``models[].parallelism`` section, the one the trainer reads, resolved
into a :class:`~clustertrain.core.parallel_layout.ParallelLayout` on the node count it gets
(``ModelPlan.layout``); a setting its framework (:mod:`clustertrain.plan.frameworks`) lacks makes it
infeasible. The built-in trainer's pipeline stages (``parallelism.pp > 1``) are planned on their most loaded
pipeline rank, with the pipeline bubble in the step time; its data-parallel collectives per step are set against
the step's compute (:mod:`clustertrain.plan.traffic`). A Megatron-LM model (``models[].framework: megatron``) is planned with Megatron's arithmetic
(:mod:`clustertrain.plan.megatron_memory`: its vocabulary padding, distributed optimizer, pipeline stages
and bubble) and its layout said in Megatron's words (``tp 2 x pp 4 (vp 2) x dp 11, distributed optimizer``).
The price applies only in the project's region (``aws.region``, else ``storage.region``); a catalog price
taken elsewhere is shown as such and not used for costs.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

from clustertrain.core.errors import ConfigError
from clustertrain.plan.allocate import DAY, Allocation, Evaluation, Hardware, ModelSpec, allocate, evaluate
from clustertrain.plan.catalog import Instance, find_instance, load_catalog
from clustertrain.plan.frameworks import BUILTIN, MEGATRON, framework_of
from clustertrain.plan.megatron_memory import MegatronMemory, megatron_layout_text, megatron_vocab
from clustertrain.plan.memory import TrainerMemory
from clustertrain.plan.packing import Packing, pack
from clustertrain.core.model_shape import ModelShape
from clustertrain.data.tokenizers import model_vocab
from clustertrain.core.parallel_layout import ParallelLayout


@dataclass
class ModelPlan:
    name: str
    params: int
    non_embedding_params: int
    flops_per_token: float
    tokens: int
    steps: int
    total_flops: float
    parallelism: dict[str, Any]       # models[].parallelism as written (param_dtype resolved for the hardware)
    layout: dict[str, Any] | None     # the ParallelLayout on the planned node count (ParallelLayout.to_dict())
    layout_text: str | None           # ParallelLayout.describe(), e.g. "fsdp 88, bf16 params / fp32 reduce"
    dp: int | None
    micro_batch: int
    global_batch: int
    mfu: float
    nodes: float | None               # fractional with node sharing; None when infeasible
    gpus: int | None
    fixed: bool
    memory: dict[str, int] | None     # bytes on the most loaded rank (rank 0 without pipelining): params (elements),
                                      #   weights, grads, optimizer, activations, buffers, framework, total
    memory_budget_bytes: int | None
    step_time_s: float | None
    days: float | None
    gpu_hours: float | None
    cost_usd: float | None
    reasons: list[str] = field(default_factory=list)
    framework: str = "builtin"
    architecture: str = ""               # ModelShape.describe(): layers, widths and the architecture options
    # Megatron-LM models, and the built-in trainer's with pp > 1 (None otherwise):
    microbatches: int | None = None      # per step and data-parallel rank, global_batch / (micro_batch x dp)
    pipeline_bubble: float | None = None # (pp - 1) / (vp x microbatches): the step takes (1 + this) x its compute
    memory_stage: str | None = None      # Megatron: the most loaded pipeline stage, first | last
    memory_pp_rank: int | None = None    # built-in trainer, pp > 1: the most loaded pipeline rank (its first rank's memory)
    # the built-in trainer's data-parallel collectives per step (dp > 1; clustertrain.plan.traffic): kind (fsdp | ddp),
    # params (tp-local elements moved), gathers, reduces, node_bytes (into each node across the network), seconds
    # (at network_gbps, the node's bandwidth; null when unknown or the group stays on one node), compute_seconds (the
    # step's, without the bubble)
    dp_traffic: dict[str, Any] | None = None
    # FSDP2 without pipeline stages planned with grad_sync per_microbatch, m > 1: what grad_sync per_step would need and
    # send — memory_bytes (the most loaded rank's total), fits (within the budget), node_bytes, seconds; the plan
    # suggests it when it fits (clustertrain.plan.allocate.PerStep)
    per_step: dict[str, Any] | None = None
    shared_node: int | None = None        # a share of a node (models[].plan.gpus): which shared node (Plan.shared_nodes)
    cost_per_hour: float | None = None    # what the model's job costs an hour (a share: its part of its node's price)

    @property
    def feasible(self) -> bool:
        return not self.reasons


@dataclass
class ClusterTotals:
    mode: str                          # concurrent | sequential
    instance_type: str | None
    gpu_model: str | None
    nodes: int
    gpus_per_node: int
    ranks_per_node: int
    gpus: int
    vcpus: int | None
    memory_gib: float | None
    gpu_memory_gib: float | None       # per GPU
    efa_gbps_per_node: float | None
    price_per_hour: float | None       # per node
    price_region: str | None
    price_date: str | None
    price_source: str | None
    cost_per_hour: float | None        # whole cluster
    idle_nodes: float
    days: float | None                 # until the last model finishes
    cost_usd: float | None             # the cluster for `days`
    region: str | None = None          # where the project runs (aws.region, else storage.region)
    price_note: str | None = None      # why no price applies (region mismatch), when none does


@dataclass
class Plan:
    project: str
    cluster: ClusterTotals
    models: list[ModelPlan]
    problems: list[str]
    assumptions: list[str]
    # models on shares of a node (clustertrain.plan.packing.pack): per shared node its models, the GPUs, memory (MB)
    # and CPUs they ask for against the node's, and each model's part of the node's hourly price
    shared_nodes: list[dict[str, Any]] = field(default_factory=list)

    @property
    def feasible(self) -> bool:
        return not self.problems and all(m.feasible for m in self.models)

    def model(self, name: str) -> ModelPlan:
        return next(m for m in self.models if m.name == name)


def _hardware(project, calibration) -> tuple[Hardware, Instance | None]:
    c, p = project.cluster, project.plan
    inst = None
    if c.instance_type:
        inst = find_instance(load_catalog(p), c.instance_type, p)
    if c.gpus_per_node > 0:
        if inst is None:
            return Hardware(c.gpus_per_node, None, None, p.headroom, p.framework_gib), None
        return Hardware(c.gpus_per_node, inst.gpu_memory_gib, inst.peak_bf16_tflops * 1e12, p.headroom, p.framework_gib,
                        inst.network_gbps), inst
    ranks = c.ranks_per_node
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3
    peak = calibration.flops_per_worker if calibration is not None else None
    return Hardware(ranks, host / ranks, peak, p.headroom, 0.0), inst


def model_spec(project, index: int, entry, default_mfu: float, cpu: bool) -> ModelSpec:
    """The planner's view of model ``index``: its shape, tokens and ``parallelism`` section."""
    mp, t, pc = entry.plan, entry.training, project.plan
    fw = framework_of(entry)
    shape = ModelShape.from_arch(entry.model, _vocab(project, entry, fw))
    tokens = mp.tokens or t.max_steps * t.global_batch * entry.model.seq_len
    flash = pc.flash_attention and fw.flash_attention and not cpu
    if fw is MEGATRON:  # Megatron's local attention (no Transformer Engine) materialises the scores
        flash = flash and entry.megatron_options.transformer_impl == "transformer_engine"
    return ModelSpec(
        name=entry.name, shape=shape, tokens=tokens, global_batch=t.global_batch, micro_batch=t.micro_batch,
        parallelism=entry.parallelism, arch=entry.model, on_gpu=not cpu,
        flash_attention=flash,
        mfu=mp.assumed_mfu or pc.assumed_mfu or default_mfu,
        fixed_nodes=mp.nodes if mp.gpus is None or project.shares_node(entry) else project.job_nodes(entry),
        fixed_gpus=mp.gpus if project.shares_node(entry) else None, deadline_days=mp.deadline_days,
        framework=fw, index=index,
    )


def _vocab(project, entry, fw=BUILTIN) -> int:
    """:func:`model_vocab` (Megatron: :func:`megatron_vocab`, padded to 128 x tp), whose tokenizer error
    (``data.tokenizer: ...``) is re-raised naming the project file and the model: with several models the bare
    field does not say which one to fix."""
    try:
        if fw is MEGATRON:
            return megatron_vocab(entry.model, entry.data.tokenizer, entry.parallelism.tp)
        return model_vocab(entry.model, entry.data.tokenizer)
    except ConfigError as e:
        field, sep, rest = str(e).partition(": ")
        named = sep and field.startswith("data.")
        raise ConfigError(f"{project.source}: models.{entry.name}.{field}: {rest}" if named
                          else f"{project.source}: models.{entry.name}: {e}") from None


def project_region(project) -> str | None:
    """Where the project runs: ``aws.region``, else ``storage.region``; None when it does not say."""
    if project.aws is not None:
        return project.aws.region
    return project.storage.region


def applicable_price(inst: Instance | None, region: str | None, explicit: bool):
    """(price or None, note): a price applies only in the project's region (or when the project names none)."""
    price = inst.price if inst else None
    if price is None or region is None or price.region == region:
        return price, None
    where = "plan.price" if explicit else f"the catalog's {inst.name} price"
    return None, (f"no price for {region}: {where} is for {price.region} (${price.per_hour:,.2f}/h, {price.date}) and is "
                  f"not used; set plan.price with region: {region}")


def make_plan(project, calibration=None) -> Plan:
    """Plan a project (see the module docstring). ``calibration`` (from :func:`calibrate`) supplies the
    per-worker FLOP/s and efficiency for CPU-only projects."""
    c, p = project.cluster, project.plan
    hw, inst = _hardware(project, calibration)
    cpu = c.gpus_per_node == 0
    default_mfu = (calibration.efficiency if (cpu and calibration is not None) else (inst.assumed_mfu if inst else 0.40))
    all_specs = [model_spec(project, i, e, default_mfu, cpu) for i, e in enumerate(project.models)]
    specs = [s for s in all_specs if s.fixed_gpus is None]      # whole nodes
    shared = [s for s in all_specs if s.fixed_gpus is not None]  # shares of nodes, packed (clustertrain.plan.packing)
    region = project_region(project)
    price, price_note = applicable_price(inst, region, p.price is not None)
    packing = pack(project, price.per_hour if price else None)
    problems: list[str] = packing.problems()
    if p.cluster_nodes is not None:
        mode, total_nodes = "concurrent", p.cluster_nodes
        unit_gpus = 1 if p.node_sharing else hw.gpus_per_node
        left = total_nodes - packing.count
        if left < 0 or (left == 0 and specs):
            problems.append(f"the models need {packing.count} shared node(s) for {', '.join(s.name for s in shared)}"
                            + (f" and at least one node for {', '.join(s.name for s in specs)}" if specs else "")
                            + f" but the cluster has {total_nodes}")
            alloc = Allocation({}, {}, {}, [], 0)
        else:
            alloc = allocate(specs, hw, left * hw.gpus_per_node // unit_gpus, unit_gpus) if specs else Allocation({}, {}, {}, [], 0)
        problems += alloc.problems
    else:
        mode = "sequential"
        evals, infeasible = {}, {}
        for s in specs:
            ev = evaluate(s, hw, (s.fixed_nodes or c.nodes) * hw.gpus_per_node)
            (evals.__setitem__(s.name, ev) if ev.ok else infeasible.__setitem__(s.name, ev.reasons))
        total_nodes = max([s.fixed_nodes or c.nodes for s in specs] + [packing.count])
        unit_gpus = hw.gpus_per_node
        alloc = Allocation({n: ev.gpus // unit_gpus for n, ev in evals.items()}, evals, infeasible, [], 0)
    for s in shared:  # each share on its own GPUs, beside the others on its node
        ev = evaluate(s, hw, s.fixed_gpus)
        (alloc.evaluations.__setitem__(s.name, ev) if ev.ok else alloc.infeasible.__setitem__(s.name, ev.reasons))
    models = [_model_plan(s, alloc, hw, price.per_hour if price else None, packing) for s in all_specs]
    days = [m.days for m in models if m.days is not None]
    if mode == "concurrent" or not days:
        makespan = max(days) if days else None
    else:  # one after another, except the shares: they train side by side on their shared nodes
        alone = [m.days for m in models if m.days is not None and m.shared_node is None]
        together = [m.days for m in models if m.days is not None and m.shared_node is not None]
        makespan = sum(alone) + (max(together) if together else 0.0)
    per_node = price.per_hour if price else None
    totals = ClusterTotals(
        mode=mode, instance_type=c.instance_type, gpu_model=inst.gpu_model if inst else None, nodes=total_nodes,
        gpus_per_node=c.gpus_per_node, ranks_per_node=c.ranks_per_node, gpus=total_nodes * c.gpus_per_node,
        vcpus=inst.vcpus * total_nodes if inst else None, memory_gib=inst.memory_gib * total_nodes if inst else None,
        gpu_memory_gib=inst.gpu_memory_gib if inst else None,
        efa_gbps_per_node=inst.network_gbps if inst and inst.efa_adapters else None,
        price_per_hour=per_node, price_region=price.region if price else None, price_date=price.date if price else None,
        price_source=price.source if price else None,
        cost_per_hour=per_node * total_nodes if per_node is not None else None,
        idle_nodes=alloc.idle_units * unit_gpus / hw.gpus_per_node if mode == "concurrent" else 0,
        days=makespan, cost_usd=per_node * total_nodes * makespan * 24 if (per_node and makespan is not None) else None,
        region=region, price_note=price_note,
    )
    shared_nodes = [{"node": n.index, "models": n.models, "gpus_used": n.gpus_used, "gpus": n.capacity.gpus,
                     "mem_mb_used": n.mem_mb_used, "mem_mb": n.capacity.mem_mb, "cpus_used": n.cpus_used,
                     "cpus": n.capacity.cpus, "cost_per_hour": {sh.model: sh.cost_per_hour for sh in n.shares}}
                    for n in packing.nodes]
    if c.gpus_per_node > 0 and inst is None:
        problems.append("cluster.instance_type is not set: no GPU memory, peak or price to plan with; set e.g. cluster.instance_type: p5e.48xlarge")
    assumptions = _assumptions(project, hw, inst, default_mfu, calibration, specs, price, price_note)
    if packing.count:
        assumptions.append(f"shared nodes: {packing.count} for {len(shared)} model(s) on shares of a node (first-fit "
                           f"decreasing by GPUs; no packing uses fewer than {packing.lower_bound}); a share asks for its "
                           "GPUs and their proportion of the node's memory (95 % of the instance's) and vCPUs, and pays "
                           "its node's price in proportion to its GPUs (idle GPUs included)")
    return Plan(project.name, totals, models, problems, assumptions, shared_nodes)


def _model_plan(spec: ModelSpec, alloc: Allocation, hw: Hardware, price: float | None, packing: Packing) -> ModelPlan:
    ev: Evaluation | None = alloc.evaluations.get(spec.name)
    reasons = alloc.infeasible.get(spec.name, [])
    shape = spec.shape
    tokens_per_step = spec.global_batch * shape.seq_len
    m = ModelPlan(
        name=spec.name, params=shape.total_params(), non_embedding_params=shape.non_embedding_params(),
        flops_per_token=shape.flops_per_token(), tokens=spec.tokens, steps=math.ceil(spec.tokens / tokens_per_step),
        total_flops=spec.total_flops, parallelism={**spec.parallelism.model_dump(), "param_dtype": spec.param_dtype},
        layout=None, layout_text=None, dp=None, micro_batch=spec.micro_batch, global_batch=spec.global_batch, mfu=spec.mfu,
        nodes=None, gpus=None, fixed=spec.fixed_nodes is not None or spec.fixed_gpus is not None, memory=None, memory_budget_bytes=None,
        step_time_s=None, days=None, gpu_hours=None, cost_usd=None, reasons=list(reasons),
        framework=spec.framework.name, architecture=shape.describe(),
    )
    node = packing.node_of(spec.name)
    if node is not None:
        m.shared_node, m.cost_per_hour = node.index, packing.share_of(spec.name).cost_per_hour
    if ev is None:
        return m
    m.gpus, m.nodes = ev.gpus, ev.gpus / hw.gpus_per_node
    if node is None and price is not None:
        m.cost_per_hour = price * m.nodes
    if ev.layout is not None:
        m.dp, m.layout, m.layout_text = ev.layout.dp, ev.layout.to_dict(), layout_text(ev.layout)
        if spec.megatron:
            vp = spec.parallelism.virtual_stages
            mem = ev.memory if isinstance(ev.memory, MegatronMemory) else None
            m.layout["virtual_stages"] = vp
            m.layout_text = megatron_layout_text(ev.layout, vp, mem)
            m.microbatches, m.pipeline_bubble = ev.microbatches, ev.bubble
            m.memory_stage = mem.stage if mem is not None else None
        elif ev.layout.pp > 1:
            mem = ev.memory if isinstance(ev.memory, TrainerMemory) else None
            m.layout_text = layout_text(ev.layout, mem)
            m.microbatches, m.pipeline_bubble = ev.microbatches, ev.bubble
            m.memory_pp_rank = mem.pp_rank if mem is not None else None
    if ev.traffic is not None:
        t = ev.traffic
        m.dp_traffic = {"kind": t.kind, "grad_sync": ev.layout.grad_sync if ev.layout else None, "params": t.params,
                        "gathers": t.gathers, "reduces": t.reduces,
                        "node_bytes": t.node_bytes, "seconds": t.seconds, "network_gbps": hw.network_gbps,
                        "compute_seconds": ev.step_seconds / (1 + ev.bubble) if ev.step_seconds is not None else None}
    if ev.per_step is not None:
        alt = ev.per_step.traffic
        m.per_step = {"memory_bytes": ev.per_step.memory_bytes, "fits": ev.per_step.fits,
                      "node_bytes": alt.node_bytes if alt else None, "seconds": alt.seconds if alt else None}
    if ev.memory is not None:
        mem = ev.memory
        m.memory = {"params": mem.params, "weights": mem.weights_bytes, "grads": mem.grads_bytes,
                    "optimizer": mem.optimizer_bytes, "activations": mem.activations_bytes, "buffers": mem.buffers_bytes,
                    "framework": mem.framework_bytes, "total": mem.total_bytes}
    m.memory_budget_bytes = ev.budget_bytes
    if ev.seconds is not None:
        m.step_time_s, m.days = ev.step_seconds, ev.seconds / DAY
        m.gpu_hours = ev.seconds / 3600 * ev.gpus
        if m.cost_per_hour is not None:
            m.cost_usd = ev.seconds / 3600 * m.cost_per_hour
    return m


def layout_text(layout: ParallelLayout, memory: TrainerMemory | None = None) -> str:
    """``ParallelLayout.describe()`` (it names ``grads reduced once per step`` for FSDP2 with ``grad_sync: per_step``),
    plus ``no reshard after forward`` where that setting changes the memory or the traffic (pp 1), and with pipeline stages the most loaded pipeline rank: ``most loaded: pp rank 0 (stage 0, 15 layers,
    4 micro-batches in flight)``."""
    text = layout.describe()
    if layout.fsdp and not layout.reshard_after_forward and layout.pp == 1:  # pp > 1: always (ParallelLayout)
        text += ", no reshard after forward"
    if memory is not None and layout.pp > 1:
        stages = ", ".join(map(str, memory.stages))
        text += (f", most loaded: pp rank {memory.pp_rank} (stage{'s' if len(memory.stages) > 1 else ''} {stages}, "
                 f"{memory.layers} layers, {memory.in_flight:g} micro-batches in flight)")
    return text


def _assumptions(project, hw: Hardware, inst: Instance | None, mfu: float, calibration, specs: list[ModelSpec],
                 price, price_note: str | None) -> list[str]:
    p = project.plan
    out = []
    for fw in dict.fromkeys(sp.framework for sp in specs):
        names = [sp.name for sp in specs if sp.framework is fw]
        whom = "every model" if len(names) == len(specs) else ", ".join(names)
        out.append(f"framework of {whom}: {fw.description} — implements {fw.summary()}; each model is planned with its "
                   "models[].parallelism, the section the trainer reads")
    if calibration is None and project.cluster.gpus_per_node == 0:
        out.append("CPU workers have no data-sheet peak: run `clustertrain plan --calibrate` to measure this machine and estimate times; "
                   "memory is checked against host RAM / workers")
    if calibration is not None and project.cluster.gpus_per_node == 0:
        out.append(f"CPU workers: {calibration.flops_per_worker / 1e9:.1f} GFLOP/s fp32 matmul per worker measured here, "
                   f"efficiency {calibration.efficiency:.2f} of it (calibrated)")
    elif inst is not None:
        out.append(f"{inst.gpu_model}: {inst.peak_bf16_tflops:g} TFLOP/s dense bf16 peak, MFU {mfu:.0%} "
                   f"({'plan.assumed_mfu' if p.assumed_mfu else 'catalog default'})")
    out.append("FLOPs per token: 6 x non-embedding parameters + 6 x layers x heads x head_dim x seq_len (the trainer's MFU formula)")
    builtin = [sp for sp in specs if not sp.megatron]
    megatron = [sp.name for sp in specs if sp.megatron]
    if hw.gpu_memory_gib is not None and project.cluster.gpus_per_node and builtin:
        whom = "" if not megatron else f" ({', '.join(sp.name for sp in builtin)})"
        piped = [sp.name for sp in builtin if sp.parallelism.pp > 1]
        pipeline = ("" if not piped else
                    f"; pipeline stages ({', '.join(piped)}): the most loaded pipeline rank, its stages' tensors, the "
                    "activations of the micro-batches its schedule keeps in flight (gpipe all, 1f1b pp - rank, "
                    "interleaved the warm-up + 1 chunks), with FSDP2 its blocks gathered and their gradients unsharded "
                    "until the step's end (torch's PipelineStage reduces once per step)")
        once = [sp.name for sp in builtin if sp.parallelism.grad_sync == "per_step" and sp.parallelism.zero_stage == 3
                and sp.parallelism.pp == 1]
        per_step = ("" if not once else
                    f"; grad_sync per_step ({', '.join(once)}): every block gathered with its unsharded gradient (in "
                    "reduce_dtype) from the first backward to the step's end, one reduce-scatter per step")
        out.append(f"memory of {'rank 0' if not piped else 'the most loaded rank'}{whom}: {p.headroom:.0%} of each GPU kept "
                   f"free; {p.framework_gib:g} GiB per GPU for CUDA "
                   f"context/NCCL buffers; {'flash' if p.flash_attention else 'materialised'} attention; fp32 parameters, "
                   "gradients and AdamW states (4+4+8 bytes per element of the local shard + 4 per tensor), sharded over dp "
                   "with zero_stage 3; buffers: DDP gradient buckets and autocast copy, FSDP2 gathered blocks (plan/memory.py)"
                   + per_step + pipeline)
        if piped:
            out.append(f"time ({', '.join(piped)}): the same FLOPs per token and MFU, times 1 + the pipeline bubble "
                       "(pp - 1) / (v x micro-batches per step)")
    if any(sp.framework is BUILTIN for sp in specs) and hw.network_gbps:
        out.append(f"data-parallel traffic: what FSDP2's all-gathers and reduce-scatters (DDP's all-reduce) bring into each "
                   f"node per step at {hw.network_gbps:g} Gbit/s per node, set against the step's compute; the step time "
                   "assumes the collectives hide behind it (plan/traffic.py)")
    if hw.gpu_memory_gib is not None and project.cluster.gpus_per_node and megatron:
        out.append(f"memory of the most loaded rank ({', '.join(megatron)}: Megatron-LM, the first or last pipeline stage): "
                   f"{p.headroom:.0%} of each GPU kept free; {p.framework_gib:g} GiB per GPU for CUDA context/NCCL/Transformer "
                   "Engine workspaces; bf16 weights 2 + fp32 main gradients 4 (2 with reduce_dtype bf16) + fp32 main weights "
                   "and Adam m, v 12 bytes per parameter (the AdamW column), the 12 sharded over dp by the distributed "
                   "optimizer (zero_stage >= 1: 6 + 12/dp, else 18), parameters split over tp and pp; activations of the "
                   "micro-batches a stage holds under 1F1B (Megatron's theoretical_memory_usage.py; plan/megatron_memory.py)")
        out.append(f"time ({', '.join(megatron)}): the same FLOPs per token and MFU, times 1 + the pipeline bubble "
                   "(pp - 1) / (vp x micro-batches per step)")
    if price is not None:
        out.append(f"price: ${price.per_hour:,.2f}/h per {inst.name}, {price.kind}, {price.region}, taken {price.date}"
                   + (f" ({price.source})" if price.source else "") + "; prices drift — override with plan.price")
    elif price_note:
        out.append(f"price: {price_note}")
    return out
