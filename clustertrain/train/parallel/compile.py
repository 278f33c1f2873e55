"""``torch.compile`` per transformer block (``parallelism.compile``), in place so parameter names
stay the same. :func:`check_compiler` compiles a two-line function first, so a machine without a
working compiler (no C++ compiler for CPU inductor, no Triton on GPU) is one line naming the field."""

from __future__ import annotations

import torch

from clustertrain.core.errors import ConfigError
from clustertrain.train.model import GPT


def check_compiler(device: torch.device, field: str = "parallelism.compile") -> None:
    def probe(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x) * 2 + 1

    try:
        torch.compile(probe)(torch.ones(8, device=device))
    except Exception as e:  # inductor raises many types; any failure means no usable compiler here
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"{field}: torch.compile does not work on this {device.type} machine ({first[:200]}); "
                          "install the compiler it needs (Triton on GPU, g++ on CPU) or set compile: false") from None


def apply_compile(model: GPT) -> None:
    """Compile each block in place; under full recomputation compile the block's body instead, so the
    (eager) activation checkpoint sits outside the compiled region — torch 2.13 cannot save the
    tensor-parallel DTensors of a checkpoint traced inside a compiled graph."""
    for block in model.blocks.values():
        if block.recompute:
            block._forward = torch.compile(block._forward)
        else:
            block.compile()
