"""``parallelism.grad_sync`` as the config and the layout read it: what ``auto`` resolves to, what each layout
always does (DDP and pipeline stages exchange once per step; pipelined FSDP2 never reshards after forward), the
one-line refusal of ``per_microbatch`` where it cannot apply, and a checkpoint written before the field. The
collectives themselves are counted on gloo ranks in tests/integration/train/test_grad_sync_ranks.py."""

from __future__ import annotations

import pytest

from clustertrain.core.parallel_layout import ParallelLayout, normalized_layout, resolve_layout
from clustertrain.train.config import ParallelismConfig, builtin_problems


@pytest.mark.parametrize("written, expect", [
    ({"zero_stage": 3}, "per_microbatch"),                       # auto: FSDP2's own
    ({"zero_stage": 3, "grad_sync": "per_step"}, "per_step"),
    ({"zero_stage": 3, "grad_sync": "per_microbatch"}, "per_microbatch"),
    ({}, "per_step"),                                            # DDP: no_sync until the last micro-batch
    ({"zero_stage": 3, "pp": 2}, "per_step"),                    # PipelineStage reduces once per step
])
def test_auto_and_what_each_layout_does(written, expect):
    layout = resolve_layout(ParallelismConfig(**written), 4, on_gpu=True)
    assert layout.grad_sync == expect
    assert ("grads reduced once per step" in layout.describe()) == (expect == "per_step" and layout.fsdp
                                                                   and layout.pp == 1)


def test_pipelined_fsdp_never_reshards_after_forward():
    written = ParallelismConfig(zero_stage=3, pp=2, reshard_after_forward=True)
    assert resolve_layout(written, 4, on_gpu=True).reshard_after_forward is False
    assert resolve_layout(ParallelismConfig(zero_stage=3), 4, on_gpu=True).reshard_after_forward is True


@pytest.mark.parametrize("written, why", [
    ({"grad_sync": "per_microbatch"}, "DDP reduces once per step"),
    ({"zero_stage": 3, "pp": 2, "grad_sync": "per_microbatch"}, "pipeline stages (pp=2) reduce once per step"),
])
def test_per_microbatch_where_it_cannot_apply_is_one_line_naming_the_field(written, why):
    problems = builtin_problems(ParallelismConfig(**written))
    assert [f for f, _ in problems] == ["parallelism.grad_sync"]
    assert why in problems[0][1] and "drop grad_sync or set it to per_step" in problems[0][1]


def test_an_unknown_choice_is_refused():
    with pytest.raises(ValueError, match="grad_sync"):
        ParallelismConfig(grad_sync="sometimes")


def test_a_checkpoint_written_before_grad_sync_is_the_same_layout():
    """meta.json of a DDP run and of a pipelined FSDP2 run with reshard_after_forward true, written before this
    version: the trainer runs them alike now, so their RNG streams still apply."""
    ddp = ParallelLayout(world=2, dp=2).to_dict()
    old_ddp = {k: v for k, v in ddp.items() if k != "grad_sync"}
    assert normalized_layout(old_ddp) == normalized_layout(ddp)
    piped = ParallelLayout(world=4, dp=2, pp=2, zero_stage=3).to_dict()
    old_piped = {**{k: v for k, v in piped.items() if k not in ("grad_sync", "virtual_stages", "schedule")},
                 "reshard_after_forward": True}
    assert normalized_layout(old_piped) == normalized_layout(piped)
    flat = ParallelLayout(world=2, dp=2, zero_stage=3).to_dict()
    assert normalized_layout({**flat, "grad_sync": "per_step"}) != normalized_layout(flat)  # a real change is one
