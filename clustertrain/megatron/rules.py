"""What Megatron-LM would reject, said before anything is submitted.

Two levels, as for the built-in trainer:

* :func:`clustertrain.megatron.config.structure_problems` — at load time (``Project`` validation), whatever the cluster: Megatron's
  own divisibility rules on the architecture and layout (``validate_args`` in ``megatron/training/
  arguments.py`` at :data:`~clustertrain.megatron.config.MEGATRON_TAG`), and what only the built-in
  trainer offers (``compile``).
* :func:`megatron_findings` — ``clustertrain check`` and ``submit`` (and ``run``): GPUs, the tokenizer Megatron
  would load, the extra arguments, the image. The global batch against micro batch x dp (which Megatron checks when
  it builds its micro-batch calculator, not in ``validate_args``) is the plan's rule for both frameworks: the
  project's load for one cluster, :mod:`clustertrain.plan.preflight` for each model's planned node count.

======================================================  =========================================
rule (Megatron's assert or failure)                     field
======================================================  =========================================
heads, ffn width, vocabulary divisible by tp            ``parallelism.tp`` / ``model.vocab``
key/value heads divisible by tp (1)                     ``parallelism.tp``
rope: ``--rotary-base`` is an int                       ``model.rope_theta``
rope scaling other than Llama 3.1's (2)                 ``model.rope_scaling``
layers divisible by pp                                  ``parallelism.pp``
layers per stage divisible by virtual stages            ``parallelism.virtual_stages``
virtual stages need more than 2 layers... (pp > 2)     ``parallelism.virtual_stages``
seq_len <= max_position_embeddings                      ``megatron.max_position_embeddings``
compile is the built-in trainer's                       ``parallelism.compile``
no GPUs (Megatron-LM trains on CUDA only)              ``cluster.gpus_per_node``
a Hugging Face tokenizer directory Megatron can load    ``data.tokenizer``
(``AutoTokenizer.from_pretrained`` of the directory:
``tokenizer.json`` and ``tokenizer_config.json``)
every extra argument an option Megatron accepts, not    ``megatron.extra_args``
one clustertrain renders
======================================================  =========================================

(1) The rule of both frameworks (:func:`clustertrain.core.parallel_layout.structure_problems`): each tensor-parallel
rank holds whole key/value heads. Megatron-core 0.16.1 itself is looser — ``TransformerConfig.__post_init__``
(``megatron/core/transformer/transformer_config.py``) raises unless ``num_query_groups`` is "a multiple or divisor
of tensor_model_parallel_size", and with fewer groups than tp ``Attention`` (``megatron/core/transformer/
attention.py``) replicates a key/value head on several ranks — a layout (and a parameter count) the built-in
trainer and the planner do not have, so it is refused for Megatron models too.
(2) ``RotaryEmbedding._apply_scaling`` (``megatron/core/models/common/embeddings/rotary_pos_embedding.py``) fixes
low_freq_factor 1, high_freq_factor 4, original context 8192, and the tag's ``gpt_builders.py`` does not pass
``--rope-scaling-factor`` to ``GPTModel`` (its default 8.0): :data:`~clustertrain.megatron.config.MEGATRON_ROPE_SCALING`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from clustertrain.core.findings import Finding

if TYPE_CHECKING:
    from clustertrain.project import ModelEntry, Project


def framework_findings(project: "Project") -> list[Finding]:
    """``clustertrain check``'s framework section: :func:`megatron_findings` for every model."""
    return megatron_findings(project)


def megatron_findings(project: "Project", models: list[str] | None = None) -> list[Finding]:
    """Findings for the Megatron models of ``project`` (``models``: only these)."""
    chosen = [(i, e) for i, e in enumerate(project.models)
              if e.framework == "megatron" and (models is None or e.name in models)]
    if not chosen:
        return []
    out: list[Finding] = []
    if project.cluster.gpus_per_node == 0:
        out.append(Finding("error", "cluster.gpus_per_node", f"0, but {', '.join(e.name for _, e in chosen)} "
                           "trains with Megatron-LM (framework: megatron), which runs on CUDA GPUs only",
                           "set cluster.gpus_per_node to the GPUs of a node, or framework: clustertrain "
                           "(the built-in trainer runs on CPU workers)"))
    for i, entry in chosen:
        where = f"models[{i}]"
        out += tokenizer_findings(where, entry)
        out += extra_arg_findings(where, entry)
    out += image_findings(project, chosen)
    return out


def image_findings(project: "Project", chosen: list[tuple[int, "ModelEntry"]]) -> list[Finding]:
    """The image ``clustertrain image build`` writes has Megatron-LM only with ``image.megatron: true`` (at
    ``/opt/megatron-lm``, the tag of ``versions.yaml``'s ``megatron_lm`` pin)."""
    from clustertrain.megatron.config import MEGATRON_PATH, MEGATRON_TAG

    image = project.image
    if image is None or project.cluster.container_image:
        return []  # a foreign image: its Megatron-LM is the user's to know
    names = ", ".join(e.name for _, e in chosen)
    if not image.megatron:
        return [Finding("error", "image.megatron", f"false, but {names} trains with Megatron-LM (framework: megatron) "
                        "and the image would not contain it", "set image.megatron: true (clones Megatron-LM at the "
                        f"pinned tag into {MEGATRON_PATH})")]
    out = []
    for i, entry in chosen:
        if entry.megatron_options.path.rstrip("/") != MEGATRON_PATH:
            out.append(Finding("error", f"models[{i}].megatron.path", f"{entry.megatron_options.path}, but the image "
                               f"puts Megatron-LM in {MEGATRON_PATH}", f"remove megatron.path (default {MEGATRON_PATH})"))
    try:
        from clustertrain.image.versions import load_versions, resolved

        pinned = resolved(load_versions(image.versions), True).get("megatron_lm", {})
    except Exception:  # noqa: BLE001 - the image section reports a pins file it cannot read
        return out
    version = str(pinned.get("version") or pinned.get("ref") or "") if isinstance(pinned, dict) else ""
    if version and MEGATRON_TAG not in version:
        out.append(Finding("warning", "image.versions", f"the image pins Megatron-LM {version}; clustertrain renders "
                           f"arguments for {MEGATRON_TAG}", f"pin megatron_lm to {MEGATRON_TAG}, or check the "
                           "rendered flags against that version's parser"))
    return out


def tokenizer_findings(where: str, entry: "ModelEntry") -> list[Finding]:
    """``byte`` maps to Megatron's NullTokenizer; a ``tokenizer.json`` to HuggingFaceTokenizer of its directory,
    which Megatron loads with ``transformers.AutoTokenizer.from_pretrained`` — that needs a
    ``tokenizer_config.json`` naming the tokenizer class beside ``tokenizer.json``."""
    from clustertrain.megatron.args import tokenizer_dir

    directory = tokenizer_dir(entry.data.tokenizer)
    if directory is None:
        return []
    if not directory.is_dir():
        return []  # the data section reports a missing tokenizer
    if not (directory / "tokenizer.json").is_file():
        return [Finding("error", f"{where}.data.tokenizer", f"{entry.name}: {directory} has no tokenizer.json, which "
                        "Megatron's HuggingFaceTokenizer loads (the directory is passed as --tokenizer-model)",
                        "point data.tokenizer at a tokenizer.json (clustertrain data train-tokenizer writes one)")]
    if not (directory / "tokenizer_config.json").is_file():
        return [Finding("error", f"{where}.data.tokenizer", f"{entry.name}: {directory} has no tokenizer_config.json: "
                        "Megatron loads the directory with transformers' AutoTokenizer, which needs it to know the "
                        "tokenizer class", "run `clustertrain data tokenizer-config "
                        f"{directory / 'tokenizer.json'}` (writes {{\"tokenizer_class\": \"PreTrainedTokenizerFast\"}} and "
                        "the special tokens), or add the file")]
    return []


def extra_arg_findings(where: str, entry: "ModelEntry") -> list[Finding]:
    from clustertrain.megatron.args import rendered_options
    from clustertrain.megatron.flags import known_options

    known = known_options()
    rendered = rendered_options()
    out: list[Finding] = []
    for k, word in enumerate(entry.megatron_options.extra_args):
        if not word.startswith("--"):
            continue  # a value of the option before it
        option = word.split("=", 1)[0]
        field = f"{where}.megatron.extra_args[{k}]"
        if option not in known:
            near = _nearest(option, known)
            out.append(Finding("error", field, f"{entry.name}: {option} is not an option of Megatron-LM's parser at "
                               f"{_tag()}", f"remove it{f' (did you mean {near}?)' if near else ''}"))
        elif option in rendered:
            out.append(Finding("error", field, f"{entry.name}: {option} is rendered from the project ({rendered[option]})",
                               f"set {rendered[option]} instead of passing {option}"))
    return out


def _tag() -> str:
    from clustertrain.megatron.config import MEGATRON_TAG

    return MEGATRON_TAG


def _nearest(option: str, known: frozenset[str]) -> str | None:
    import difflib

    found = difflib.get_close_matches(option, sorted(known), n=1, cutoff=0.8)
    return found[0] if found else None
