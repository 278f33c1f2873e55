"""The checks of ``models[].training.init_from`` (:mod:`clustertrain.train.init_from`) against the project, before any
rank starts: ``clustertrain check``'s ``init_from`` section (:func:`init_from_findings`, offline) and run preparation
(:func:`stage_init_from`, called by :func:`clustertrain.launch.prepare.prepare_run`: a published directory is fetched
first; the first problem is one line naming its field, exit 2, nothing written).

What is checked (:func:`source_problems`)
    * the directory, its ``config.json`` and its weights (``model.safetensors``, or ``model.safetensors.index.json``
      and the shards it names) exist, and every tensor the architecture needs is in them (read from the
      safetensors headers only);
    * the architecture ``config.json`` describes (:func:`clustertrain.core.hf_format.arch_from_hf`) is ``model:``'s,
      field by field — ``seq_len`` is a training choice, checked only against GPT-2's learned positions
      (``n_positions``); ``dropout`` is not in ``config.json``;
    * ``vocab_size`` is the model's embedding rows (``model.vocab``, or the tokenizer's ids padded to 64);
    * the directory's ``tokenizer.json`` encodes like ``data.tokenizer``: the same vocabulary (token -> id, added
      tokens included) and the same special tokens — the dictionaries are compared, not the files' bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clustertrain.core.findings import Finding
from clustertrain.core.hf_format import GPT2, LLAMA, arch_from_hf, hf_class, hf_problems, hf_tensors
from clustertrain.train.init_from import (CONFIG, FIELD, TOKENIZER, HFSource, InitFromError, fetch, local_dir,
                                          read_source)

if TYPE_CHECKING:
    from clustertrain.project import ModelEntry, Project
    from clustertrain.train.config import ArchConfig

#: the ``config.json`` key of each ``models[].model`` field; ``model_type`` for what the model type decides
LLAMA_KEYS = {"layers": "num_hidden_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
              "kv_heads": "num_key_value_heads", "ffn_hidden": "intermediate_size", "rope_theta": "rope_theta",
              "rope_scaling": "rope_scaling", "norm_eps": "rms_norm_eps", "bias": "attention_bias",
              "tie_embeddings": "tie_word_embeddings", "vocab": "vocab_size"}
GPT2_KEYS = {"layers": "n_layer", "hidden": "n_embd", "heads": "n_head", "ffn_hidden": "n_inner",
             "norm_eps": "layer_norm_epsilon", "tie_embeddings": "tie_word_embeddings", "vocab": "vocab_size",
             "max_positions": "n_positions"}
#: compared in this order: what the model type decides first (one wrong choice there explains the rest)
COMPARED = ("position", "norm", "mlp", "bias", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "norm_eps",
            "rope_theta", "rope_scaling", "tie_embeddings")


@dataclass(frozen=True)
class Problem:
    """One thing that disagrees: the field (under ``models.<name>.``), what, and the fix."""

    field: str
    message: str
    fix: str

    def line(self) -> str:
        return f"{self.field}: {self.message}; {self.fix}"


def source_problems(entry: "ModelEntry", source: HFSource, tokenizer_vocab: int | None) -> list[Problem]:
    """Everything in ``source`` that disagrees with ``entry`` (see the module docstring); ``tokenizer_vocab``: the
    size of ``data.tokenizer`` (None when it could not be loaded: the vocabulary is then not checked)."""
    arch = entry.model
    try:
        theirs = arch_from_hf(source.config, source.config_path)
    except (ValueError, KeyError) as e:
        text = str(e) if isinstance(e, ValueError) else f"{source.config_path} has no {e}"
        return [Problem(FIELD, text, "give a Llama- or GPT-2-style model directory")]
    out = arch_problems(arch, theirs, source)
    if tokenizer_vocab is not None:
        rows = arch.vocab if arch.vocab is not None else (tokenizer_vocab + 63) // 64 * 64
        if rows != theirs["vocab"]:
            how = "" if arch.vocab is not None else f" (unset: data.tokenizer's {tokenizer_vocab:,} ids padded to 64)"
            out.append(Problem("model.vocab", f"{rows}{how} but {source.config_path} vocab_size is {theirs['vocab']}",
                               f"set model.vocab: {theirs['vocab']}"))
    if not out:
        out += _tensor_problems(arch, source)
    return out + tokenizer_problems(entry.data.tokenizer, source)


def _ours(arch: "ArchConfig") -> dict[str, Any]:
    return {"layers": arch.layers, "hidden": arch.hidden, "heads": arch.heads, "kv_heads": arch.kv_head_count,
            "ffn_hidden": arch.ffn_dim, "position": arch.position, "rope_theta": arch.rope_theta, "norm": arch.norm,
            "norm_eps": arch.norm_eps, "mlp": arch.mlp, "bias": arch.bias, "tie_embeddings": arch.tie_embeddings,
            "rope_scaling": arch.rope_scaling.model_dump() if arch.rope_scaling is not None else None}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) and not isinstance(b, bool):
        return math.isclose(a, b, rel_tol=1e-9)
    return a == b


def _show(v: Any) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if v is None:
        return "null"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_show(x)}" for k, x in v.items()) + "}"
    return str(v)


def _mismatches(arch: "ArchConfig", theirs: dict[str, Any]) -> list[str]:
    ours = _ours(arch)
    rope = theirs["position"] == "rope"
    return [f for f in COMPARED if (f in theirs or (f == "rope_scaling" and rope))
            and not (f in ("rope_theta", "rope_scaling") and not rope) and not _same(ours[f], theirs.get(f))]


def arch_problems(arch: "ArchConfig", theirs: dict[str, Any], source: HFSource) -> list[Problem]:
    """One problem per ``models[].model`` field whose value is not ``config.json``'s (``theirs``: what
    :func:`arch_from_hf` read), naming both and the fix (with the preset that matches the directory, when one does)."""
    keys = LLAMA_KEYS if theirs["position"] == "rope" else GPT2_KEYS
    kind = source.config.get("model_type")
    preset = matching_preset(theirs)
    also = f" (or model: {{preset: {preset}, seq_len: {arch.seq_len}}})" if preset else ""
    ours = _ours(arch)
    out = []
    for f in _mismatches(arch, theirs):
        want = theirs.get(f)
        if f in keys:
            said = _said(source.config, keys[f], want)
        else:
            said = f"model_type is {kind} ({LLAMA if kind == 'llama' else GPT2}: {f} {_show(want)})"
        fix = f"drop model.{f}" if want is None else f"set model.{f}: {_show(want)}"
        out.append(Problem(f"model.{f}", f"{_show(ours[f])} but {source.config_path} {said}", fix + also))
    if "max_positions" in theirs and arch.seq_len > theirs["max_positions"]:
        out.append(Problem("model.seq_len", f"{arch.seq_len} but {source.config_path} n_positions is "
                                            f"{theirs['max_positions']} (learned positions: one row per position)",
                           f"set model.seq_len to at most {theirs['max_positions']}"))
    return out


def _said(config: dict[str, Any], key: str, want: Any) -> str:
    """``hidden_size is 576``: the key as ``config.json`` spells it (transformers 5 keeps rope settings in
    ``rope_parameters``), or that it is unset and what that means."""
    raw = config.get(key)
    rope = config.get("rope_parameters") or {}
    if raw is None and key == "rope_theta" and "rope_theta" in rope:
        key, raw = "rope_parameters.rope_theta", rope["rope_theta"]
    if raw is None and key == "rope_scaling" and rope.get("rope_type") not in (None, "default"):
        key, raw = "rope_parameters", rope
    return f"{key} is {_show(raw)}" if raw is not None else f"{key} is unset (so {_show(want)})"


def matching_preset(theirs: dict[str, Any]) -> str | None:
    """The preset (:data:`clustertrain.train.config.PRESETS`) whose architecture is the one ``theirs`` describes."""
    from clustertrain.train.config import PRESETS, ArchConfig

    for name in PRESETS:
        arch = ArchConfig(preset=name)
        if not _mismatches(arch, theirs) and arch.vocab == theirs["vocab"]:
            return name
    return None


def _tensor_problems(arch: "ArchConfig", source: HFSource) -> list[Problem]:
    if hf_problems(arch):
        return []  # no class: arch_problems named the field already
    missing = [t.name for t in hf_tensors(arch) if t.name not in source.shapes]
    if not missing:
        return []
    more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
    return [Problem(FIELD, f"{source.shown}: the weights have no tensor {missing[0]}{more}, which {hf_class(arch)} needs",
                    "download or export the directory again (save_pretrained writes every tensor)")]


def tokenizer_problems(spec: str, source: HFSource) -> list[Problem]:
    """The directory's ``tokenizer.json`` against ``data.tokenizer`` (``spec``): the same token -> id dictionary
    (added tokens included) and the same special tokens. Files that are the same path are not read."""
    own = source.path / TOKENIZER
    fix = f"set data.tokenizer: {source.shown.rstrip('/')}/{TOKENIZER} (the data is then tokenized with it)"
    if not own.is_file():
        return [Problem(FIELD, f"{source.shown}: no {TOKENIZER}, so data.tokenizer cannot be checked against the "
                               "model's tokenizer", "save the model's tokenizer into the directory "
                               "(tokenizer.save_pretrained(DIR))")]
    path = Path(spec.removeprefix("hf:"))
    if spec == "byte":
        return [Problem("data.tokenizer", f"byte, but the model of {source.shown} was trained with its {TOKENIZER}", fix)]
    if not path.is_file():
        return []  # the data section says so
    if path.resolve() == own.resolve():
        return []
    try:
        a, b = _vocabulary(path), _vocabulary(own)
    except Exception as e:  # tokenizers raises plain Exception subclasses
        return [Problem("data.tokenizer", f"cannot compare with {source.shown}/{TOKENIZER} ({str(e).splitlines()[0]})", fix)]
    if a == b:
        return []
    (va, sa), (vb, sb) = a, b
    if va != vb:
        differ = sorted(set(va.items()) ^ set(vb.items()), key=lambda kv: kv[1])
        tok, i = differ[0]
        detail = (f"{len(va):,} tokens vs {len(vb):,}" if len(va) != len(vb) else f"{len(differ) // 2 or 1:,} differ")
        what = f"a different vocabulary ({detail}; e.g. {tok!r} is id {va.get(tok)} here, {vb.get(tok)} there)"
    else:
        what = f"different special tokens ({sorted(sa)} vs {sorted(sb)})"
    return [Problem("data.tokenizer", f"{spec} encodes with {what} than {source.shown}/{TOKENIZER}", fix)]


def _vocabulary(path: Path) -> tuple[dict[str, int], frozenset[tuple[str, int]]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path))
    specials = frozenset((t.content, i) for i, t in tok.get_added_tokens_decoder().items() if t.special)
    return tok.get_vocab(with_added_tokens=True), specials


# -- run preparation and `clustertrain check` -------------------------------------------------------------


def framework_problem(entry: "ModelEntry") -> Problem | None:
    """``init_from`` loads into the built-in trainer only."""
    if entry.framework == "clustertrain":
        return None
    return Problem(FIELD, f"loads a Hugging Face directory into the built-in trainer, not framework: {entry.framework}",
                   "convert the directory with Megatron-LM's own checkpoint converter (tools/checkpoint) and load it "
                   "there, or use framework: clustertrain")


def stage_init_from(project: "Project", entry: "ModelEntry", tokenizer_vocab: int, store_options=None) -> Path | None:
    """Run preparation (before any rank starts, before the run directory is written): fetch a published directory
    (:func:`fetch`), then check it; the first problem is an :class:`InitFromError` naming its field. Returns the
    directory the ranks will read (None without ``init_from``)."""
    src = entry.training.init_from
    if src is None:
        return None
    if (wrong := framework_problem(entry)) is not None:
        raise InitFromError(wrong.field, wrong.message, wrong.fix)
    if src.startswith("s3://"):
        from clustertrain.core.storage_layout import storage_layout

        path = fetch(src, storage_layout(project).datasets, store_options)
    else:
        path = Path(src)
    problems = source_problems(entry, read_source(path, src), tokenizer_vocab)
    if problems:
        raise InitFromError(problems[0].field, problems[0].message, problems[0].fix)
    return path


def init_from_findings(project: "Project") -> list[Finding]:
    """``clustertrain check``'s ``init_from`` section: every model's ``init_from`` checked offline (an ``s3://``
    directory only when a fetched copy is already there; a directory on a cluster mount this machine lacks is a
    warning, a local one outside the mounts an error: the ranks could not read it)."""
    from clustertrain.core.errors import ClusterTrainError
    from clustertrain.core.storage_layout import storage_layout
    from clustertrain.data.tokenizers import load_tokenizer

    layout = storage_layout(project)
    out: list[Finding] = []
    for entry in project.models:
        src, base = entry.training.init_from, f"models.{entry.name}"
        if src is None:
            continue
        if (wrong := framework_problem(entry)) is not None:
            out.append(Finding("error", f"{base}.{wrong.field}", wrong.message, wrong.fix))
            continue
        path = local_dir(project, entry)
        on_mount = any(Path(src).is_relative_to(m) for m in layout.mounts)
        if src.startswith("s3://") and not (path / CONFIG).is_file():
            out.append(Finding("warning", f"{base}.{FIELD}", f"{src} was not verified: the check makes no network call",
                               "`run`/`submit` fetch it, verify its checksums and check it before any rank starts"))
            continue
        if not src.startswith("s3://") and project.aws is not None and not on_mount:
            out.append(Finding("error", f"{base}.{FIELD}", f"{src} is not on a shared file system of the aws: section "
                               f"({', '.join(layout.mounts) or 'none'}); every rank reads it",
                               "publish it with `clustertrain export --to s3://...` and give that URL, or put it on a "
                               "shared file system"))
            continue
        if not path.exists() and on_mount:
            out.append(Finding("warning", f"{base}.{FIELD}", f"{src} is not on this machine (it is on a cluster "
                               "mount); not verified", "run `clustertrain check` on the head node"))
            continue
        try:
            vocab = load_tokenizer(entry.data.tokenizer).vocab_size
        except ClusterTrainError:
            vocab = None  # the data section says why
        try:
            problems = source_problems(entry, read_source(path, src), vocab)
        except InitFromError as e:
            problems = [Problem(e.field, e.problem, e.fix)]
        out += [Finding("error", f"{base}.{p.field}", p.message, p.fix) for p in problems]
    return out


