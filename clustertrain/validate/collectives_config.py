"""What the collectives benchmark measures (:class:`CollectivesConfig`) and the grammar of its
injected faults (:data:`FAULT_RE`), shared by the launching side (:mod:`clustertrain.validate.collectives`)
and each rank (:mod:`clustertrain.validate.collectives_rank`)."""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from clustertrain.core.schema import StrictModel
from clustertrain.validate.results import ALL_OPS, ValidateError
from clustertrain.validate.thresholds import CPU_SWEEP_MAX_BYTES, GPU_SWEEP_MIN_BYTES

#: ``hang|corrupt|exit:RANK:OP`` (groups 1-3) or ``absent:RANK`` (group 4)
FAULT_RE = re.compile(r"^(hang|corrupt|exit):(\d+):(\w+)$|^absent:(\d+)$")


class CollectivesConfig(StrictModel):
    """What to measure. Sizes are bytes (the CLI accepts 8, 1K, 4M, 4G)."""

    ops: list[str] = Field(default_factory=lambda: list(ALL_OPS), description="Collectives to run, in order.")
    min_bytes: int = Field(default=8, ge=4, description="Smallest message size in bytes.")
    max_bytes: int | None = Field(default=None, ge=4, description="Largest message size in bytes; None: 1 GiB on NCCL "
                                                                 "(where bandwidth bands apply), 1 MiB on gloo (CPU).")
    factor: int = Field(default=2, ge=2, description="Size multiplier between steps.")
    iters: int = Field(default=20, ge=1, description="Timed iterations per size.")
    warmup: int = Field(default=5, ge=0, description="Untimed iterations per size.")
    timeout_s: float = Field(default=60.0, gt=0, description="Per-operation (and rendezvous) timeout in seconds.")
    backend: str | None = Field(default=None, description="nccl or gloo; default nccl when CUDA is available.")
    nproc: int = Field(default=2, ge=1, description="Local processes to start when not inside a distributed job.")
    fault: str | None = Field(default=None, description="Fault injection for self-tests: hang|corrupt|exit:RANK:OP or absent:RANK.")

    @field_validator("ops")
    @classmethod
    def _known_ops(cls, v: list[str]) -> list[str]:
        bad = [o for o in v if o not in ALL_OPS]
        if bad:
            raise ValueError(f"unknown op(s) {', '.join(bad)}; valid ops are: {', '.join(ALL_OPS)}")
        return v

    @field_validator("fault")
    @classmethod
    def _fault(cls, v: str | None) -> str | None:
        if v is not None and not FAULT_RE.match(v):
            raise ValueError("fault must look like hang:1:all_reduce, corrupt:1:all_gather, exit:1:broadcast or absent:1")
        return v

    def top(self, backend: str | None = None) -> int:
        """``max_bytes``, or the default for ``backend`` (1 GiB on nccl, 1 MiB on gloo) when it is None."""
        if self.max_bytes is not None:
            return self.max_bytes
        return GPU_SWEEP_MIN_BYTES if (backend or self.backend) == "nccl" else CPU_SWEEP_MAX_BYTES

    def sizes(self, backend: str | None = None) -> list[int]:
        top = self.top(backend)
        if top < self.min_bytes:
            raise ValidateError(f"max_bytes {top} is below min_bytes {self.min_bytes}; swap them")
        out, s = [], self.min_bytes
        while s <= top:
            out.append(s)
            s *= self.factor
        return out
