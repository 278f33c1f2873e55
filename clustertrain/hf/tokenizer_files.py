"""The tokenizer files of an exported Hugging Face model directory, made from a run's ``data.tokenizer``.

Written (what ``AutoTokenizer.from_pretrained(DIR)`` reads; transformers ``tokenization_utils_base.py``):

``tokenizer.json``
    A ``tokenizer.json`` tokenizer: the file itself, byte for byte (so its identity, the sha256 that
    :class:`clustertrain.data.tokenizers.HFTokenizer` names prepared data by, is unchanged). The ``byte`` tokenizer:
    an equivalent ``tokenizers`` file (:func:`byte_tokenizer_json`).
``tokenizer_config.json``
    :func:`clustertrain.data.tokenizers.tokenizer_config`: class ``PreTrainedTokenizerFast`` (transformers 4.x's
    name; 5.x aliases it to ``TokenizersBackend``, ``tokenization_utils_tokenizers.py``), ``eos_token`` =
    ``bos_token`` = the end-of-document token (the trainer's documents end with it and begin after it), plus
    ``pad_token`` when the vocabulary has ``<|pad|>``.
``special_tokens_map.json``
    The same special tokens by role: what transformers 4.x's ``save_pretrained`` writes beside it and 5.23 still
    reads ("Legacy: read special_tokens_map.json", ``tokenization_utils_base.py``); 5.23 no longer writes it.

The ``byte`` tokenizer as a ``tokenizers`` file (:func:`byte_tokenizer_json`): a BPE model without merges whose 256
base tokens are the byte-level alphabet (GPT-2's ``bytes_to_unicode``: openai/gpt-2 ``src/encoder.py``; the
``tokenizers`` ``ByteLevel`` pre-tokenizer and decoder, ``tokenizers/src/pre_tokenizers/byte_level.rs``), token id
= byte value, then ``<|endoftext|>`` = 256 (the end of document) and ``<|pad|>`` = 257 as special tokens — the ids
of :class:`clustertrain.data.tokenizers.ByteTokenizer`. ``ByteLevel(use_regex=False)`` does not split the text, so
every UTF-8 byte becomes one token: ``encode(text)`` gives ``list(text.encode("utf-8"))``, as ours does. One
difference, shared by every Hugging Face tokenizer: the literal text ``<|endoftext|>`` encodes to the special id 256
there (``split_special_tokens=False``), to its 13 bytes here.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from clustertrain.core.errors import ConfigError
from clustertrain.data.tokenizers import SPECIALS, ByteTokenizer, HFTokenizer, load_tokenizer, tokenizer_config

PAD_TOKEN = SPECIALS[1]  # "<|pad|>"


@dataclass(frozen=True)
class TokenizerIds:
    """The special ids ``generation_config.json`` and ``config.json`` name."""

    eos: int
    bos: int
    pad: int | None


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table: the printable Latin-1 bytes stand for themselves, the other 68
    take the characters 256, 257, ... in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def byte_tokenizer_json() -> str:
    """The ``tokenizer.json`` equivalent to the ``byte`` tokenizer (module docstring)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.BPE(vocab={ch: b for b, ch in bytes_to_unicode().items()}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    byte = ByteTokenizer()
    assert (tok.token_to_id(SPECIALS[0]), tok.token_to_id(PAD_TOKEN)) == (byte.eod, byte.pad)
    return tok.to_str()


def write_tokenizer_files(spec: str, out: Path) -> TokenizerIds:
    """Write the tokenizer files of ``data.tokenizer`` ``spec`` into ``out``; a missing or bad tokenizer file is one
    :class:`ConfigError` line (from :func:`load_tokenizer`)."""
    tok = load_tokenizer(spec)
    if isinstance(tok, ByteTokenizer):
        (out / "tokenizer.json").write_text(byte_tokenizer_json(), encoding="utf-8")
        eod, pad = SPECIALS[0], PAD_TOKEN
        ids = TokenizerIds(eos=tok.eod, bos=tok.eod, pad=tok.pad)
    elif isinstance(tok, HFTokenizer):
        shutil.copyfile(tok.path, out / "tokenizer.json")
        eod = tok.eod_token
        from tokenizers import Tokenizer

        pad_id = Tokenizer.from_file(str(tok.path)).token_to_id(PAD_TOKEN)
        pad = PAD_TOKEN if pad_id is not None else None
        ids = TokenizerIds(eos=tok.eod, bos=tok.eod, pad=pad_id)
    else:  # load_tokenizer knows no other kind today
        raise ConfigError(f"data.tokenizer: {spec!r} cannot be exported to a Hugging Face directory; use byte or a "
                          "tokenizer.json")
    config = tokenizer_config(eod)
    roles = {"bos_token": eod, "eos_token": eod}
    if pad is not None:
        config["pad_token"] = pad
        roles["pad_token"] = pad
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    (out / "special_tokens_map.json").write_text(json.dumps(roles, indent=2) + "\n", encoding="utf-8")
    return ids
