"""Project-file sections owned by the planner: ``plan:`` (project level) and ``models[].plan``.
It imports nothing from clustertrain but :mod:`clustertrain.core.schema` (the strict base), so project.py can compose it.

These are planning inputs only (cluster size, MFU, headroom, tokens, deadlines, prices). How a
model's ranks split the work — dp, tp, pp, zero_stage, recompute, sequence_parallel, param_dtype —
lives in ``models[].parallelism`` (:class:`clustertrain.train.config.ParallelismConfig`), which the
planner and the trainer both read; the planning-only copies that used to live here are refused in
one line saying where they moved (:data:`MOVED`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from clustertrain.core.schema import StrictModel

#: removed planning keys -> where the setting lives now (one line for a project that still has them)
MOVED = {
    "zero_stage": "moved to models[].parallelism.zero_stage (0 = DDP, 3 = FSDP2)",
    "recompute": "moved to models[].parallelism.recompute (none | selective | full)",
    "sequence_parallel": "moved to models[].parallelism.sequence_parallel (needs parallelism.tp > 1)",
    "tp": "moved to models[].parallelism.tp",
    "pp": "moved to models[].parallelism.pp",
    "bf16_weights": "is gone: set models[].parallelism.param_dtype (bf16 | fp32), the compute dtype; master weights, "
                    "gradients and AdamW states stay fp32",
}


def _refuse_moved(data: object, where: str, keys: tuple[str, ...]) -> object:
    """Refuse a removed key in one line: ``<where><key> moved to models[].parallelism.<key> ...``."""
    if isinstance(data, dict):
        for key in keys:
            if key in data:
                raise ValueError(f"{where}{key} {MOVED[key]}; the planner and the trainer read the same field")
    return data


class PriceConfig(StrictModel):
    """An hourly price with where and when it was taken (prices drift; say where yours came from)."""

    per_hour: float = Field(..., gt=0, description="Price in USD per instance-hour.")
    region: str = Field(..., description="AWS region the price applies to, e.g. `ap-southeast-3`.")
    date: str = Field(..., description="When the price was taken, e.g. `2026-11-01` (prices drift).")
    kind: Literal["on-demand", "capacity-block", "reserved", "spot", "quote"] = Field(
        "on-demand", description="Pricing model the figure belongs to."
    )
    source: str | None = Field(None, description="Where the figure came from (price list URL, quote, document).")


class InstanceConfig(StrictModel):
    """An instance type for the catalog: a new entry needs every hardware field; an override of a
    catalog entry may give only the fields it changes."""

    gpus: int | None = Field(None, ge=0, description="GPUs per instance.")
    gpu_model: str | None = Field(None, description="GPU model, e.g. `H100 80GB`.")
    gpu_memory_gib: float | None = Field(None, gt=0, description="Usable memory per GPU in GiB (nvidia-smi total).")
    peak_bf16_tflops: float | None = Field(None, gt=0, description="Dense (no sparsity) bf16 peak TFLOP/s per GPU from the vendor data sheet.")
    nvlink_gbps: float | None = Field(None, ge=0, description="NVLink bandwidth per GPU in GB/s (0 = PCIe only).")
    vcpus: int | None = Field(None, ge=1, description="vCPUs per instance.")
    memory_gib: float | None = Field(None, gt=0, description="Host memory per instance in GiB.")
    efa_adapters: int | None = Field(None, ge=0, description="EFA network interfaces per instance (0 = no EFA).")
    network_gbps: float | None = Field(None, gt=0, description="Network bandwidth per instance in Gbit/s.")
    nvme_tb: float | None = Field(None, ge=0, description="Local NVMe instance storage in TB (decimal).")
    assumed_mfu: float | None = Field(None, gt=0, le=1, description="Default MFU assumed on this instance type.")
    price: PriceConfig | None = Field(None, description="Hourly price with region and date.")


class PlanConfig(StrictModel):
    cluster_nodes: int | None = Field(
        None, ge=1,
        description="Nodes in the whole cluster, shared by all models trained at once (the planner allocates them). "
        "Default: models run one after another, each on `cluster.nodes` (or its `plan.nodes`).",
    )
    assumed_mfu: float | None = Field(
        None, gt=0, le=1,
        description="Model FLOPs utilisation assumed for time estimates. Default: the instance type's (0.40 on H100/H200-class).",
    )
    headroom: float = Field(
        0.10, ge=0, lt=1, description="Fraction of GPU memory kept free for allocator fragmentation and spikes."
    )
    framework_gib: float = Field(
        3.0, ge=0, description="Per-GPU allowance in GiB for the CUDA context, NCCL buffers and workspaces (stated, not measured)."
    )
    flash_attention: bool = Field(
        True, description="Attention kernels that do not store the s x s score matrix (scaled_dot_product_attention on GPU)."
    )
    node_sharing: bool = Field(
        False, description="Allow models to share a node (allocate GPUs instead of whole nodes)."
    )
    price: PriceConfig | None = Field(
        None, description="Price of `cluster.instance_type` overriding the catalog's (e.g. your region's or a negotiated rate)."
    )
    instances: dict[str, InstanceConfig] = Field(
        default_factory=dict, description="Catalog additions or overrides keyed by instance type (partial overrides merge into the catalog entry)."
    )

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data: object) -> object:
        return _refuse_moved(data, "plan.", ("zero_stage", "recompute", "sequence_parallel", "bf16_weights"))


class ModelPlanConfig(StrictModel):
    nodes: int | None = Field(
        None, ge=1, description="Fixed number of nodes for this model; `clustertrain submit` runs its job on them. Default: the "
        "planner's allocation when `plan.cluster_nodes` is set, else `cluster.nodes`.",
    )
    gpus: int | None = Field(
        None, ge=1, description="GPUs of this model's job when it needs less than one node: the job asks Slurm for "
        "that share of one node (its GPUs, host memory and CPUs in proportion, no `--exclusive`) and other such models "
        "are packed beside it (docs/plan.md \"Models that share nodes\"). With CPU workers (`cluster.gpus_per_node: 0`) "
        "it counts rank slots of `cluster.procs_per_node`. At most a node's; a model on more uses `plan.nodes`.",
    )
    tokens: int | None = Field(None, ge=1, description="Token budget for planning (default: max_steps x global_batch x seq_len).")
    deadline_days: float | None = Field(None, gt=0, description="Training must finish within this many days; fewer nodes are infeasible.")
    assumed_mfu: float | None = Field(None, gt=0, le=1, description="Overrides the assumed MFU for this model.")

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data: object) -> object:
        return _refuse_moved(data, "", ("tp", "pp", "zero_stage", "recompute", "sequence_parallel"))
