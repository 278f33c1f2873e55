"""Bandwidth thresholds of the validation suite (``thresholds.yaml``) and the rules that use them.

``thresholds.yaml`` is DATA (model :class:`ThresholdsConfig`), looked up per project by
:func:`thresholds_key`: ``cpu`` for a CPU project, else the exact instance type, its family, or
``default``. Each entry holds busbw bands per collective: a band applies to message sizes
``>= min_bytes`` on runs over ``>= min_nodes`` nodes.

Two rules follow from it:

* :func:`default_max_bytes` — the sweep the suite runs by default reaches every band of the entry
  (at least 1 GiB on a GPU/NCCL project, where the published p5/p5e figures start), so a default
  run always gives a bandwidth verdict; a CPU/gloo project sweeps to 1 MiB (correctness only, kept
  small so a local run stays quick).
* :func:`bandwidth_rows` — one ``<op> busbw`` row per band (pass / warn / fail on the peak busbw at
  ``>= min_bytes``; ``warn: not measured`` when the sweep stopped short of the band), or one
  not-applicable ``busbw`` row naming the entry when it has no band (``cpu``, ``default``).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from clustertrain.core.schema import StrictModel, load_yaml_model
from clustertrain.validate.check_rows import CheckRow
from clustertrain.validate.results import CollectiveRun, ValidateError, format_size, parse_size

DEFAULT_THRESHOLDS = Path(__file__).with_name("thresholds.yaml")
GPU_SWEEP_MIN_BYTES = 1 << 30  # published p5/p5e nccl-tests bands start at 1 GiB messages
CPU_SWEEP_MAX_BYTES = 1 << 20  # gloo on CPU: correctness only, a quick local run


class BandConfig(StrictModel):
    min_bytes: int | str = Field(description="Band applies to message sizes >= this (8, 1K, 4M, 1G).")
    warn_below_gbps: float = Field(ge=0, description="Peak busbw below this (GB/s) -> warn.")
    fail_below_gbps: float = Field(ge=0, description="Peak busbw below this (GB/s) -> fail.")
    min_nodes: int = Field(2, ge=1, description="The band applies to runs over at least this many nodes.")


class InstanceThresholdsConfig(StrictModel):
    note: str = Field("", description="Where the numbers come from.")
    collectives: dict[str, BandConfig] = Field(default_factory=dict, description="Per op: busbw band.")


class FsxThresholdConfig(StrictModel):
    min_fraction: float = Field(gt=0, le=1, description="Required share of the expected single-client throughput.")
    client_cap_mib_s: float = Field(gt=0, description="Most one client draws in the bench, MiB/s.")


class ThresholdsConfig(StrictModel):
    """``thresholds.yaml``."""

    version: int = Field(description="Table format version (1).")
    instance_types: dict[str, InstanceThresholdsConfig] = Field(description="Type, family, 'cpu' or 'default'.")
    fsx: FsxThresholdConfig = Field(description="FSx for Lustre throughput rule.")


def load_thresholds(path: str | Path | None = None) -> ThresholdsConfig:
    """``thresholds.yaml`` (the bundled table without ``path``); a mistake is one line naming ``file:line`` and
    the key (:func:`clustertrain.core.schema.load_yaml_model`)."""
    return load_yaml_model(Path(path) if path else DEFAULT_THRESHOLDS, ThresholdsConfig, error=ValidateError)


def thresholds_key(table: ThresholdsConfig, instance_type: str | None, gpus_per_node: int) -> str:
    """``cpu`` for CPU projects, else the exact type, its family, or ``default``."""
    if gpus_per_node == 0:
        return "cpu"
    for key in (instance_type, (instance_type or "").split(".")[0]):
        if key and key in table.instance_types:
            return key
    return "default"


def default_max_bytes(table: ThresholdsConfig, key: str, gpus_per_node: int, min_bytes: int = 8,
                      factor: int = 2) -> int:
    """The largest size of the default sweep: the first size of ``min_bytes * factor**k`` that reaches every
    band of ``key`` (and 1 GiB) on a GPU project; 1 MiB on a CPU project."""
    if not gpus_per_node:
        need = CPU_SWEEP_MAX_BYTES
    else:
        bands = table.instance_types[key].collectives.values()
        need = max([GPU_SWEEP_MIN_BYTES, *(parse_size(b.min_bytes) for b in bands)])
    size = min_bytes
    while size < need:
        size *= factor
    return size


def bandwidth_rows(run: CollectiveRun, nodes: int, table: ThresholdsConfig, key: str,
                   job: str = "collectives") -> list[CheckRow]:
    """The bandwidth verdict: one row per band of ``key`` (or one not-applicable row when it has none)."""
    entry = table.instance_types[key]
    if not entry.collectives:
        return [CheckRow(job=job, check="busbw", verdict="not-applicable", threshold="no band",
                         detail=f"thresholds.yaml {key}: {entry.note or 'no bandwidth band'}")]
    rows = []
    measured = max((r.size_bytes for rep in run.reports for r in rep.rows if r.busbw_gbps is not None), default=0)
    for op, band in entry.collectives.items():
        rep = next((r for r in run.reports if r.op == op), None)
        lo = parse_size(band.min_bytes)
        thr = f">= {band.warn_below_gbps:g} GB/s (fail < {band.fail_below_gbps:g}) at >= {format_size(lo)}"
        if nodes < band.min_nodes:
            rows.append(CheckRow(job=job, check=f"{op} busbw", verdict="not-applicable", threshold=thr,
                                 detail=f"band is for >= {band.min_nodes} nodes ({key})"))
            continue
        vals = [r.busbw_gbps for r in (rep.rows if rep else []) if r.size_bytes >= lo and r.busbw_gbps is not None]
        if not vals:
            why = (f"{op} was not run" if rep is None else
                   f"the sweep stopped at {format_size(measured)}; the band starts at {format_size(lo)}: "
                   "leave --max-bytes at its default (or raise it)")
            rows.append(CheckRow(job=job, check=f"{op} busbw", verdict="warn", found="not measured", threshold=thr,
                                 detail=why))
            continue
        peak = max(vals)
        verdict = "fail" if peak < band.fail_below_gbps else "warn" if peak < band.warn_below_gbps else "pass"
        rows.append(CheckRow(job=job, check=f"{op} busbw", verdict=verdict, found=f"{peak:.1f} GB/s peak",
                             threshold=thr, detail=f"thresholds.yaml: {key}"))
    return rows
