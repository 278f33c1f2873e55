"""`clustertrain check` on what the runs would do (issue 37 item 7): the job chain against max_steps
(clustertrain.launch.segments), plan tokens vs steps, identical models, warmup (clustertrain.plan.model_rules) and
min_count on a targeted reservation (clustertrain.cloud.project_rules). Each rule: a failing and a passing case,
on the flagship (examples/p5e-80x7.yaml) changed with --set overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from clustertrain.check import run_check
from clustertrain.launch.segments import needed_seconds
from clustertrain.plan.model_rules import warmup_findings
from clustertrain.resolve import load_project

ROOT = Path(__file__).resolve().parents[2]
P5E = ROOT / "examples" / "p5e-80x7.yaml"
#: model-1's data.blend as a --set value
BASELINE = "[" + ", ".join(f"{{source: '{b.source}', weight: {b.weight}}}"
                           for b in load_project(P5E).models[0].data.blend) + "]"


def findings(overrides: list[str], section: str, path_prefix: str):
    report = run_check(load_project(P5E, overrides), only=[section])
    return [f for s, f in report.findings if f.path.startswith(path_prefix)]


# -- the job chain -------------------------------------------------------------------------------------------------


def test_four_segments_of_48h_cannot_finish_the_flagship():
    """Before issue 37: 48 h x (1 + 3 restarts) ~ 8 days against the plan's 10.5 (138717 steps x 6.54 s = 907,209 s;
    a segment is 172,800 - 300 - 660 = 171,840 s: 4 allow 687,360 s, 2.5 days short; 6 needed, 7 with 25% more)."""
    [f] = findings(["launch.max_segments=4"], "launch", "launch.max_segments")
    assert f.level == "error"
    assert f.message.startswith("model-1 (model-2, model-3, model-4, model-5, model-6, model-7 too) needs 6 segments "
                                "of 48:00:00 for 138717 steps (10.5 days at the plan's 6.54 s per step")
    assert "launch.max_segments=4 allows 8.0 days: the run stops 2.5 days short of max_steps" in f.message
    assert f.fix == "set launch.max_segments to at least 7 (25% over the plan) or raise cluster.time_limit"


@pytest.mark.parametrize("overrides", [[], ["launch.max_segments=6"], ["launch.max_segments=4", "cluster.time_limit=\"72:00:00\""]])
def test_enough_segments_or_a_longer_limit_pass(overrides):
    assert findings(overrides, "launch", "launch.max_segments") == []


def test_blocking_saves_count_and_async_ones_do_not():
    p = load_project(P5E)
    entry = p.models[0]
    save = 100.0
    assert needed_seconds(entry, 6.0, save) == pytest.approx(138717 * 6.0)
    sync = entry.model_copy(update={"training": entry.training.model_copy(update={"async_checkpoint": False})})
    assert needed_seconds(sync, 6.0, save) == pytest.approx(138717 * 6.0 + 138 * 100.0)


# -- plan tokens, identical models, warmup ---------------------------------------------------------------------------


def test_plan_tokens_that_max_steps_does_not_train_are_flagged():
    [f] = findings(["models.6.training.max_steps=80000"], "plan", "models[6].plan.tokens")
    assert f.level == "warning" and "= 403,701,760,000 (-12.2%)" in f.message
    assert f.fix.startswith("set training.max_steps to 91157 ")
    # within 1 %: rounding of the step count, not a different run
    assert findings(["models.6.training.max_steps=90500"], "plan", "models[6].plan.tokens") == []
    assert findings([], "plan", "models[6].plan.tokens") == []


def test_identical_models_are_named():
    # model-6 given model-1's mixture and seed is model-1 again
    same = ["models.5.training.seed=1001", f"models.5.data.blend={BASELINE}",
            "models.5.training.checkpoint_every=500"]  # how often it saves does not make another model
    [f] = findings(same, "plan", "models[5].training.seed")
    assert f.level == "warning"
    assert f.message.startswith("model-1, model-6 are identical: the same architecture, data (the same blend of 5 "
                                "sources), training settings and seed (1001)")
    # another seed (or data, or lr) is another run; as written, model-6 has its own mixture and seed
    assert findings(same[1:], "plan", "models[5].training.seed") == []
    assert findings([same[0], same[2]], "plan", "models[5].training.seed") == []
    assert findings([*same, "models.5.training.lr=2e-4"], "plan", "models[5].training.seed") == []
    assert [f for f in findings([], "plan", "models[") if "identical" in f.message] == []


def test_models_are_identical_only_when_their_blends_are():
    """The blend is the data: model-2 differs from model-1 in its weights only (web 0.55 and code 0.25 against 0.70
    and 0.10), which is the ablation, not a copy; with model-1's weights (here x10: weights are shares, both trainers
    normalise them) it is model-1."""
    seed = ["models.1.training.seed=1001"]
    assert findings(seed, "plan", "models[1].training.seed") == []
    baseline = [f"models.1.data.blend.{k}.weight={w}" for k, w in enumerate((7, 1, 0.8, 0.7, 0.5))]
    [f] = findings([*seed, *baseline], "plan", "models[1].training.seed")
    assert f.message.startswith("model-1, model-2 are identical: the same architecture, data (the same blend of 5 ")
    # the same weights on another source make another blend
    other = "models.1.data.blend.4.source=s3://p5e-80x7-training-data-jakarta/datasets/math-v2-32k/"
    assert findings([*seed, *baseline, other], "plan", "models[1].training.seed") == []
    # one source each: the source is the data
    mix = "s3://p5e-80x7-training-data-jakarta/datasets/mix-1-32k/"
    one = [*seed, "models.0.data.blend=[]", "models.1.data.blend=[]", f"models.0.data.source={mix}"]
    [f] = findings([*one, f"models.1.data.source={mix}"], "plan", "models[1].training.seed")
    assert f.message.startswith(f"model-1, model-2 are identical: the same architecture, data ({mix}), training "
                                "settings and seed (1001)")
    assert findings([*one, f"models.1.data.source={mix[:-1]}-v2/"], "plan", "models[1].training.seed") == []


def test_no_warmup_at_a_large_models_lr_is_flagged():
    [f] = findings(["models.6.training.warmup_steps=0"], "plan", "models[6].training.warmup_steps")
    assert f.level == "warning" and "no warmup at lr 0.0003 for a 13.9B-parameter model" in f.message
    assert f.fix == "set training.warmup_steps, e.g. 911 (1% of max_steps within 200-2000)"
    assert findings(["models.6.training.warmup_steps=0", "models.6.training.lr=5e-5", "models.6.training.min_lr=5e-6"],
                    "plan", "models[6].training.warmup_steps") == []
    entry = load_project(P5E, ["models.6.training.warmup_steps=0"]).models[6]
    assert warmup_findings(6, entry, 500_000_000) == []  # a small model
    assert warmup_findings(6, entry, 12_800_000_000) != []


# -- min_count on a targeted reservation -----------------------------------------------------------------------------


def test_min_count_below_max_count_on_a_targeted_reservation():
    [f] = findings(["aws.queues.0.min_count=40"], "cluster", "aws.queues[0].min_count")
    assert f.level == "warning"
    assert f.message.startswith("40 is below max_count (80) on the targeted capacity reservation cr-0123456789abcdef0")
    assert f.fix == ("remove aws.queues[0].min_count (with a reservation it defaults to max_count, static nodes) "
                     "or set it to 80")
    assert findings(["aws.queues.0.min_count=80"], "cluster", "aws.queues[0].min_count") == []
    assert findings([], "cluster", "aws.queues[0].min_count") == []
    # without a reservation, scaling to zero is the point
    assert findings(["aws.queues.0.min_count=0", "aws.queues.0.capacity_reservation_id=null"], "cluster",
                    "aws.queues[0].min_count") == []


def test_the_flagships_six_ablation_models_differ_in_data_and_seed_and_nothing_else():
    """Issue 39: models 1-6 are one Llama-family architecture, budget and schedule; each pair differs in its blend
    (as shares) and its seed."""
    models = load_project(P5E).models[:6]
    shares = [tuple(sorted((b.source, round(b.weight / sum(x.weight for x in m.data.blend), 6)) for b in m.data.blend))
              for m in models]
    assert len(set(shares)) == 6 and len({m.training.seed for m in models}) == 6
    base = models[0]
    for m in models[1:]:
        assert m.model == base.model and m.parallelism == base.parallelism and m.plan == base.plan
        assert m.training.model_copy(update={"seed": base.training.seed}) == base.training
    assert (base.model.position, base.model.norm, base.model.mlp, base.model.bias, base.model.kv_head_count) == \
        ("rope", "rmsnorm", "swiglu", False, 8)
