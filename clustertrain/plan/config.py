"""Project-file sections owned by the planner: ``plan:`` (project level) and ``models[].plan``.
It imports nothing from clustertrain but :mod:`clustertrain.schema` (the strict base), so project.py can compose it.

Project-level settings are defaults; a model's ``plan:`` section overrides the layout ones
(tp, pp, zero_stage, recompute, sequence_parallel, assumed_mfu) for that model only. The plan is
computed for what each model's framework implements (:mod:`clustertrain.plan.frameworks`); a setting
here that the framework lacks is reported and replaced by the framework's own.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from clustertrain.schema import StrictModel

Recompute = Literal["none", "selective", "full"]


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
    zero_stage: Literal[0, 1, 2, 3] | None = Field(
        None, description="Optimizer-state sharding over data-parallel ranks: 0 = DDP, 1 = optimizer states, "
        "2 = + gradients, 3 = + parameters (FSDP full shard). Default: what each model's framework does (the built-in "
        "trainer: 0). A stage the framework does not implement is reported, and the plan uses the framework's.",
    )
    recompute: Recompute = Field(
        "none", description="Activation recomputation: `none`, `selective` (attention core, Korthikanti et al. 2022) or `full` (keep layer inputs only)."
    )
    sequence_parallel: bool = Field(False, description="Megatron sequence parallelism (splits the non-tensor-parallel activations by tp).")
    flash_attention: bool = Field(
        True, description="Attention kernels that do not store the s x s score matrix (scaled_dot_product_attention on GPU)."
    )
    bf16_weights: Literal["bf16", "fp32"] | None = Field(
        None,
        description="With bf16 training: `bf16` = bf16 weights and gradients plus fp32 master weights and moments (2+2+12 bytes/param, "
        "ZeRO/Megatron); `fp32` = fp32 weights under autocast (4+4+8 bytes/param + a 2-byte autocast copy). Default: what "
        "each model's framework does (the built-in trainer: fp32); a choice the framework lacks is reported and not used.",
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


class ModelPlanConfig(StrictModel):
    nodes: int | None = Field(
        None, ge=1, description="Fixed number of nodes for this model; `clustertrain submit` runs its job on them. Default: the "
        "planner's allocation when `plan.cluster_nodes` is set, else `cluster.nodes`.",
    )
    tokens: int | None = Field(None, ge=1, description="Token budget for planning (default: max_steps x global_batch x seq_len).")
    deadline_days: float | None = Field(None, gt=0, description="Training must finish within this many days; fewer nodes are infeasible.")
    tp: int | None = Field(None, ge=1, description="Tensor-parallel degree to plan with (default: parallelism.tp); a degree the model's framework lacks is reported and not used.")
    pp: int | None = Field(None, ge=1, description="Pipeline-parallel degree to plan with (default: parallelism.pp); a degree the model's framework lacks is reported and not used.")
    zero_stage: Literal[0, 1, 2, 3] | None = Field(None, description="Overrides plan.zero_stage for this model.")
    recompute: Recompute | None = Field(None, description="Overrides plan.recompute for this model.")
    sequence_parallel: bool | None = Field(None, description="Overrides plan.sequence_parallel for this model.")
    assumed_mfu: float | None = Field(None, gt=0, le=1, description="Overrides the assumed MFU for this model.")

    @model_validator(mode="after")
    def _check(self) -> "ModelPlanConfig":
        if self.sequence_parallel and self.tp == 1:
            raise ValueError("plan.sequence_parallel needs tp > 1; set plan.tp or drop sequence_parallel")
        return self
