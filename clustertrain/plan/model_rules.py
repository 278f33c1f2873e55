"""Warnings about what the models of a project would train, part of the plan section of ``clustertrain check``.

=====================================================  =======  ==============================================
rule                                                   level    path
=====================================================  =======  ==============================================
``plan.tokens`` differs from what the run trains,      warning  ``models[i].plan.tokens``
``max_steps x global_batch x seq_len``, by more than
:data:`TOKENS_TOLERANCE` (the plan's time and cost
are for one, the run does the other)
two or more models train the same thing: the same      warning  ``models[j].training.seed`` (the second one)
framework, architecture, data and training settings
(seed included; :func:`training_identity`): copies
of one model for the price of several
no warmup (``warmup_steps: 0``) at a learning rate of  warning  ``models[i].training.warmup_steps``
at least :data:`WARMUP_LR` for a model of at least
:data:`WARMUP_PARAMS` parameters
=====================================================  =======  ==============================================

Warmup. The reference recipes of billion-parameter GPTs all warm up: torchtitan's Llama 3 8B
(``torchtitan/models/llama3/train_configs/llama3_8b.toml``: lr 3e-4, ``warmup_steps = 200``), Megatron-LM's GPT-3
175B example (``examples/gpt3/train_gpt3_175b_distributed.sh``: lr 6e-5, ``--lr-warmup-fraction .001``), Llama 2
7B-70B (Touvron et al. 2023, sec. 2.2: lr 3e-4 / 1.5e-4, 2000 warmup steps). Adam's first updates, with its second
moment estimates still near zero, are large at full learning rate; without warmup a large model's loss spikes or
diverges early. The rule fires from 1e-4 (the smallest peak among those 7B-70B recipes) and 1e9 parameters; the
fix suggests 1 % of ``max_steps`` within [200, 2000] (torchtitan's and Llama 2's counts).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from clustertrain.core.findings import Finding

if TYPE_CHECKING:
    from clustertrain.plan.plan import Plan
    from clustertrain.project import ModelEntry, Project

#: relative difference between plan.tokens and max_steps x global_batch x seq_len that is only rounding
TOKENS_TOLERANCE = 0.01
#: no warmup is flagged from this peak learning rate ...
WARMUP_LR = 1e-4
#: ... for models of at least this many parameters
WARMUP_PARAMS = 1_000_000_000
#: training settings that change when or where a run saves or logs, not what it learns
_BOOKKEEPING = {"checkpoint_every", "backup_every", "async_checkpoint", "keep_last", "log_every"}


def model_rule_findings(project: "Project", plan: "Plan | None") -> list[Finding]:
    """The warnings of the module docstring for every model of ``project`` (``plan``: for the parameter counts)."""
    out: list[Finding] = []
    params = {m.name: m.params for m in plan.models} if plan is not None else {}
    for i, entry in enumerate(project.models):
        out += tokens_findings(i, entry)
        out += warmup_findings(i, entry, params.get(entry.name))
    return out + duplicate_findings(project)


def trained_tokens(entry: "ModelEntry") -> int:
    t = entry.training
    return t.max_steps * t.global_batch * entry.model.seq_len


def tokens_findings(index: int, entry: "ModelEntry") -> list[Finding]:
    planned = entry.plan.tokens
    if planned is None:
        return []
    trained = trained_tokens(entry)
    if abs(trained - planned) <= TOKENS_TOLERANCE * planned:
        return []
    per_step = entry.training.global_batch * entry.model.seq_len
    steps = -(-planned // per_step)
    return [Finding("warning", f"models[{index}].plan.tokens",
                    f"{entry.name}: plan.tokens is {planned:,}, but max_steps x global_batch x seq_len = "
                    f"{entry.training.max_steps} x {entry.training.global_batch} x {entry.model.seq_len} = {trained:,} "
                    f"({trained / planned - 1:+.1%}): the plan's time and cost are for one, the run trains the other",
                    f"set training.max_steps to {steps} (plan.tokens / {per_step:,} tokens per step), or remove "
                    "plan.tokens to plan what max_steps trains")]


def warmup_findings(index: int, entry: "ModelEntry", params: int | None) -> list[Finding]:
    t = entry.training
    if t.warmup_steps > 0 or t.lr < WARMUP_LR or params is None or params < WARMUP_PARAMS:
        return []
    suggest = min(2000, max(200, t.max_steps // 100))
    return [Finding("warning", f"models[{index}].training.warmup_steps",
                    f"{entry.name}: no warmup at lr {t.lr:g} for a {params / 1e9:.1f}B-parameter model: Adam's first "
                    "updates at the full rate make early loss spikes and divergence likely (torchtitan's Llama 3 8B "
                    "warms up 200 steps at 3e-4, Llama 2 2000)",
                    f"set training.warmup_steps, e.g. {suggest} (1% of max_steps within 200-2000)")]


def training_identity(entry: "ModelEntry") -> str:
    """What decides the weights a model ends with: framework, architecture, data and training settings with the
    seed, without the bookkeeping ones (checkpoints, backups, logging) and the parallel layout.

    The data is its ``source`` or its whole ``blend``: the sources in order and their weights as shares of the sum
    (both trainers normalise them, Megatron-LM's blend and :mod:`clustertrain.data.sample_index`, so 7:3 trains what
    0.7:0.3 does); two models that differ only in their blend's weights are two runs of a data ablation."""
    import json

    data = entry.data.model_dump(mode="json", exclude={"workers"})
    if data.get("blend"):
        total = sum(b["weight"] for b in data["blend"])
        data["blend"] = [{**b, "weight": round(b["weight"] / total, 12)} for b in data["blend"]]
    training = entry.training.model_dump(mode="json", exclude=_BOOKKEEPING)
    return json.dumps([entry.framework, entry.model.model_dump(mode="json"), data, training], sort_keys=True)


def duplicate_findings(project: "Project") -> list[Finding]:
    groups: dict[str, list[int]] = {}
    for i, entry in enumerate(project.models):
        groups.setdefault(training_identity(entry), []).append(i)
    out: list[Finding] = []
    for indices in groups.values():
        if len(indices) < 2:
            continue
        names = [project.models[i].name for i in indices]
        first = project.models[indices[0]]
        blend = first.data.blend
        data = first.data.source if not blend else f"the same blend of {len(blend)} source{'s' * (len(blend) > 1)}"
        out.append(Finding("warning", f"models[{indices[1]}].training.seed",
                           f"{', '.join(names)} are identical: the same architecture, data ({data}), training settings "
                           f"and seed ({first.training.seed}): {len(names)} copies of one model for the price of "
                           f"{len(names)}",
                           "give each its own training.seed and data (an ablation differs in what it studies), or "
                           "train one of them"))
    return out
