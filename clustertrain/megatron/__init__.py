"""Megatron-LM as a training framework (``models[].framework: megatron``).

A model whose framework is ``megatron`` trains with Megatron-LM's ``pretrain_gpt.py`` (tag
:data:`~clustertrain.megatron.config.MEGATRON_TAG`) inside the image, with the same ``check / plan /
submit / status / logs / cancel`` workflow, run directory and checkpoint backup as the built-in trainer.
This package is the adapter, and the only place that knows Megatron-LM:

* :mod:`~clustertrain.megatron.config` — the ``models[].megatron`` section (pure pydantic);
* :mod:`~clustertrain.megatron.args` — the ``pretrain_gpt.py`` argument list rendered from a project
  (pure: no torch, no Megatron), and the per-rank command;
* :mod:`~clustertrain.megatron.flags` — the option strings Megatron-LM's own parser accepts at that tag
  (data, checked against the parser by a test);
* :mod:`~clustertrain.megatron.rules` — what Megatron would reject, as ``check``/``submit`` findings;
* :mod:`~clustertrain.megatron.logs` — Megatron's iteration log lines as rows of ``metrics.jsonl``;
* :mod:`~clustertrain.megatron.backup` — the final checkpoint (Megatron's layout) to the checkpoint bucket.

Why a package of its own: the adapter is read by the planner, the launcher, the checks and the monitor;
kept in one of them, the others would import that stage's internals (the architecture's rule is that
stages exchange typed objects). Its config imports only :mod:`clustertrain.core.schema`; the other modules import
core modules (errors, findings, run paths, the parallel layout) and sections (train.config) and, inside functions, the stage code they reuse
(staging, the catalog, job records); no stage module imports them at import time, and nothing here imports the CLI.
"""
