"""When a model's vocabulary agrees with its tokenizer — one rule, used by ``check``, ``plan``,
``run``/``submit`` (run preparation) and the trainer itself.

A model's embedding has ``V_m`` rows: ``model.vocab``, or, when that is unset, the tokenizer's
size rounded up to a multiple of 64 (:func:`clustertrain.train.model.padded_vocab`). A tokenizer
produces ``V_t`` distinct ids, its specials included (``byte``: 258). They **agree** when::

    V_t  <=  V_m  <=  round_up(V_t, 128 x parallelism.tp)

* ``V_m < V_t`` is always an error: ids ``V_m .. V_t-1`` index past the embedding (a device-side
  assert on GPU, an IndexError on CPU — or, in a framework that does not check, silent garbage).
* ``V_m`` above the bound is an error too: the extra rows belong to no token, are never trained,
  cost memory and FLOPs in the output layer, and nearly always mean ``data.tokenizer`` is not the
  tokenizer ``model.vocab`` was chosen for (``vocab: 32000`` with the 258-id byte tokenizer leaves
  31,742 of 32,000 rows unused).

Why 128 x tp: it is Megatron-LM's padding (``--make-vocab-size-divisible-by``, default 128, times
the tensor-parallel size; ``_vocab_size_with_padding`` in ``megatron/training/tokenizer``), so every
vocabulary a Megatron run would build for the tokenizer is accepted, and multiples of 128 keep the
output GEMM on tensor-core-friendly shapes. Our own default padding (64) lies inside the bound;
it stays 64 because changing it would change the shape — and so break the checkpoints — of every
existing model that leaves ``model.vocab`` unset.
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from clustertrain.project import ModelEntry

PAD_MULTIPLE = 128
"""Megatron-LM's default ``--make-vocab-size-divisible-by``."""


def round_up(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple


def vocab_limit(tokenizer_vocab: int, tp: int = 1) -> int:
    """The largest model vocabulary that still agrees with a tokenizer of ``tokenizer_vocab`` ids."""
    return round_up(tokenizer_vocab, PAD_MULTIPLE * max(1, tp))


def vocab_problem(model_vocab: int | None, tokenizer_vocab: int, tp: int = 1) -> str | None:
    """Why ``model_vocab`` disagrees with a tokenizer of ``tokenizer_vocab`` ids (no field names), or None."""
    if model_vocab is None:
        return None  # the trainer pads the tokenizer's size: agrees by construction
    limit = vocab_limit(tokenizer_vocab, tp)
    if model_vocab < tokenizer_vocab:
        return (f"{model_vocab} is smaller than the tokenizer's {tokenizer_vocab:,} ids: ids {model_vocab}-{tokenizer_vocab - 1} "
                f"would index past the embedding")
    if model_vocab > limit:
        return (f"{model_vocab:,} is far larger than the tokenizer's {tokenizer_vocab:,} ids (padding to a multiple of "
                f"{PAD_MULTIPLE * max(1, tp)} gives {limit:,}): {model_vocab - tokenizer_vocab:,} embedding rows would "
                "belong to no token")
    return None


@lru_cache(maxsize=32)
def _cached_size(spec: str, stamp: tuple[int, int] | None) -> int:
    from clustertrain.data.tokenizers import load_tokenizer

    return load_tokenizer(spec).vocab_size


def tokenizer_vocab_size(spec: str) -> int:
    """``load_tokenizer(spec).vocab_size``, cached per file (size, mtime): seven models sharing one
    tokenizer.json load it once. Raises ConfigError like :func:`load_tokenizer`."""
    path = spec.removeprefix("hf:")
    try:
        st = os.stat(path) if spec != "byte" else None
        stamp = (st.st_size, st.st_mtime_ns) if st else None
    except OSError:
        stamp = None
    return _cached_size(spec, stamp)


def vocab_disagreement(entry: "ModelEntry", tokenizer_vocab: int) -> tuple[str, str, str] | None:
    """(field, message, fix) when the model's vocabulary disagrees with a tokenizer of ``tokenizer_vocab`` ids."""
    tp = entry.parallelism.tp
    why = vocab_problem(entry.model.vocab, tokenizer_vocab, tp)
    if why is None:
        return None
    limit = vocab_limit(tokenizer_vocab, tp)
    where = f"models.{entry.name}.model.vocab"
    if entry.model.vocab is not None and entry.model.vocab < tokenizer_vocab:
        fix = f"set {where} to {limit} (or leave it unset), or use the tokenizer it was chosen for"
    else:
        fix = (f"set models.{entry.name}.data.tokenizer to the tokenizer {where} was chosen for (a {entry.model.vocab:,}-id "
               f"BPE: `clustertrain data train-tokenizer --vocab-size {entry.model.vocab}`), or {where} to {limit} "
               "(or leave it unset)")
    return where, f"disagrees with data.tokenizer {entry.data.tokenizer!r}: {why}", fix


def check_vocab(entry: "ModelEntry", tokenizer_vocab: int | None = None) -> str | None:
    """One line naming ``models.<name>.model.vocab`` and the fix when the model's vocabulary disagrees
    with its tokenizer (see the module docstring), else None. ``tokenizer_vocab``: the tokenizer's size
    when already known (e.g. from a dataset manifest); otherwise ``data.tokenizer`` is loaded (ConfigError
    when it cannot be)."""
    if entry.model.vocab is None:
        return None
    size = tokenizer_vocab if tokenizer_vocab is not None else tokenizer_vocab_size(entry.data.tokenizer)
    found = vocab_disagreement(entry, size)
    return None if found is None else f"{found[0]} {found[1]}; fix: {found[2]}"
