"""Tokenizers behind one interface: encode, decode, vocab_size, eod, identity.

Specs accepted by :func:`load_tokenizer`:

``byte``
    UTF-8 bytes are the tokens 0-255; specials follow (256 = end of document, 257 = pad).
    No files and no downloads are ever needed for it.
``hf:/path/to/tokenizer.json`` or any path ending in ``tokenizer.json``
    A Hugging Face ``tokenizers`` file, loaded from disk only (nothing is downloaded). Its
    end-of-document token is the first of :data:`EOD_CANDIDATES` present in the vocabulary;
    ``identity`` is ``hf-<first 16 hex digits of the file's sha256>``, so two different files
    never share prepared data.

:func:`train_tokenizer` trains a byte-level BPE (GPT-2 style, ``<|endoftext|>`` = eod,
``<|pad|>``) on text/JSONL files and writes ``tokenizer.json`` atomically, with the
``tokenizer_config.json`` that :func:`write_tokenizer_config` writes beside it.

The directory Megatron-LM loads
-------------------------------
A ``framework: megatron`` model with a ``tokenizer.json`` trains with Megatron's ``HuggingFaceTokenizer``
on the file's directory (``--tokenizer-model DIR``), which calls ``transformers.AutoTokenizer.from_pretrained(DIR)``.
A directory holding ``tokenizer.json`` alone is not enough: transformers 4.x refuses it ("Unrecognized model
... Should have a `model_type` key in its config.json"), and 5.x loads it without an end-of-sequence token,
so Megatron's ``tokenizer.eod`` is None. :func:`write_tokenizer_config` writes the ``tokenizer_config.json``
that both need: the class (``PreTrainedTokenizerFast``, which wraps ``tokenizer.json`` as it is) and
``eos_token``/``bos_token`` = this module's end-of-document token, so Megatron's ids, vocabulary size and
eod are the ones :class:`HFTokenizer` gives (tests/unit/data/test_megatron_tokenizer.py checks it with
transformers and megatron-core).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Protocol, Sequence

from clustertrain.data.inputs import iter_texts, resolve_inputs
from clustertrain.core.errors import ConfigError, DataError
from clustertrain.core.run_paths import write_atomic

if TYPE_CHECKING:
    import numpy as np

EOD_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<eod>", "<|end_of_text|>", "[SEP]")
SPECIALS = ["<|endoftext|>", "<|pad|>"]
#: the file transformers' AutoTokenizer reads to know the class of a tokenizer directory
TOKENIZER_CONFIG = "tokenizer_config.json"
#: no length limit: transformers warns when a text encodes to more ids than model_max_length, and documents are
#: long (transformers' own "no limit" is int(1e30), about the same)
MODEL_MAX_LENGTH = 10**30


class Tokenizer(Protocol):
    identity: str

    @property
    def vocab_size(self) -> int: ...

    @property
    def eod(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


def encode_flat(tokenizer: Tokenizer, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Encode a batch of texts (batched where the tokenizer can): (all tokens concatenated, tokens per text)."""
    flat = getattr(tokenizer, "encode_flat", None)
    if flat is not None:
        return flat(texts)
    return _flatten([tokenizer.encode(t) for t in texts])


def _flatten(ids: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Per-text id lists as (all ids concatenated, ids per text)."""
    import numpy as np

    return (np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int64),
            np.fromiter(map(len, ids), dtype=np.int64, count=len(ids)))


class ByteTokenizer:
    """Byte-level tokenizer: 256 byte values + <eod> + <pad>."""

    identity = "byte-v1"

    @property
    def vocab_size(self) -> int:
        return 258

    @property
    def eod(self) -> int:
        return 256

    @property
    def pad(self) -> int:
        return 257

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_bytes(self, data: bytes) -> bytes:
        return data

    def encode_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        import numpy as np

        data = [t.encode("utf-8") for t in texts]
        return (np.frombuffer(b"".join(data), dtype=np.uint8),
                np.fromiter(map(len, data), dtype=np.int64, count=len(data)))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    """A Hugging Face ``tokenizers`` ``tokenizer.json`` read from disk (see module docstring)."""

    def __init__(self, path: str | os.PathLike):
        from tokenizers import Tokenizer as _HF

        self.path = Path(path)
        if not self.path.is_file():
            raise ConfigError(f"data.tokenizer: {self.path} does not exist; give the path of a tokenizer.json "
                              "(train one with `clustertrain data train-tokenizer`)")
        data = self.path.read_bytes()
        try:
            self._tok = _HF.from_str(data.decode("utf-8"))
        except Exception as e:  # tokenizers raises plain Exception subclasses
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ConfigError(f"data.tokenizer: {self.path} is not a valid tokenizer.json ({first})") from None
        self.identity = "hf-" + hashlib.sha256(data).hexdigest()[:16]
        self._eod = next((i for i in map(self._tok.token_to_id, EOD_CANDIDATES) if i is not None), None)
        if self._eod is None:
            raise ConfigError(f"data.tokenizer: {self.path} has no end-of-document token; add one of "
                              f"{', '.join(EOD_CANDIDATES)} as a special token")

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def eod(self) -> int:
        return self._eod

    @property
    def eod_token(self) -> str:
        """The end-of-document token's text (the first of :data:`EOD_CANDIDATES` in the vocabulary)."""
        return self._tok.id_to_token(self._eod)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        # encode_batch_fast (tokenizers >= 0.21) skips offset tracking, which preprocessing never needs
        fast = getattr(self._tok, "encode_batch_fast", None)
        enc = self._tok.encode
        ids = ([e.ids for e in fast(list(texts), add_special_tokens=False)] if fast is not None
               else [enc(t, add_special_tokens=False).ids for t in texts])
        return _flatten(ids)

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(list(map(int, ids)), skip_special_tokens=False)


def load_tokenizer(spec: str) -> Tokenizer:
    if spec == "byte":
        return ByteTokenizer()
    if spec.startswith("hf:"):
        return HFTokenizer(spec[3:])
    if spec.endswith("tokenizer.json"):
        return HFTokenizer(spec)
    raise ConfigError(f"data.tokenizer: unknown tokenizer {spec!r}; valid: byte, hf:/path/to/tokenizer.json, "
                      "or a path ending in tokenizer.json")


def tokenizer_config(eod_token: str) -> dict:
    """The ``tokenizer_config.json`` content for a ``tokenizer.json`` whose end-of-document token is ``eod_token``."""
    return {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eod_token, "bos_token": eod_token,
            "model_max_length": MODEL_MAX_LENGTH, "clean_up_tokenization_spaces": False}


def write_tokenizer_config(tokenizer_json: Path) -> Path:
    """Write ``tokenizer_config.json`` beside ``tokenizer_json`` (atomically) so that transformers'
    ``AutoTokenizer.from_pretrained(<its directory>)`` — what Megatron-LM's HuggingFaceTokenizer calls — loads
    it with this module's end-of-document token as eos (see the module docstring). Returns its path.

    An identical file is left as it is; a different one is never overwritten (:class:`ConfigError` saying so).
    """
    path = Path(tokenizer_json)
    if path.name != "tokenizer.json":
        raise ConfigError(f"{path}: AutoTokenizer (and so Megatron-LM) reads a directory's tokenizer.json; rename "
                          f"the file to {path.with_name('tokenizer.json')}")
    tok = HFTokenizer(path)  # ConfigError when missing, not a tokenizer.json, or without an end-of-document token
    return _write_config(path.with_name(TOKENIZER_CONFIG), tokenizer_config(tok.eod_token))


def _existing_config_problem(path: Path, wanted: dict) -> str | None:
    """None when ``path`` is absent or already holds ``wanted``; else the one line refusing to overwrite it."""
    if not path.exists():
        return None
    try:
        if json.loads(path.read_text(encoding="utf-8")) == wanted:
            return None
    except (OSError, UnicodeDecodeError, ValueError):
        pass
    return (f"{path} already exists and differs from the one clustertrain writes (tokenizer_class "
            f"{wanted['tokenizer_class']}, eos/bos {wanted['eos_token']}); it was left as it is: keep it if Megatron-LM "
            "should load the directory with it, or remove it and run again")


def _write_config(path: Path, wanted: dict) -> Path:
    problem = _existing_config_problem(path, wanted)
    if problem:
        raise ConfigError(problem)
    if not path.exists():
        write_atomic(path, json.dumps(wanted, indent=2) + "\n")
    return path


def train_tokenizer(files: Iterable[str | os.PathLike], vocab_size: int, output: str | os.PathLike,
                    json_key: str = "text") -> HFTokenizer:
    """Train a byte-level BPE on text/JSONL(.gz) ``files`` and write it to ``output`` (atomically); when ``output``
    is named ``tokenizer.json``, also the ``tokenizer_config.json`` Megatron-LM needs beside it
    (:func:`write_tokenizer_config`; a different existing one stops the training before anything is written)."""
    from tokenizers import Tokenizer as _HF, decoders, models, pre_tokenizers, trainers

    minimum = 256 + len(SPECIALS)
    if vocab_size < minimum:
        raise ConfigError(f"--vocab-size {vocab_size} is too small for a byte-level BPE; use at least {minimum}")
    out = Path(output)
    config = out.with_name(TOKENIZER_CONFIG) if out.name == "tokenizer.json" else None
    wanted = tokenizer_config(SPECIALS[0])  # <|endoftext|>: the first of EOD_CANDIDATES
    if config is not None and (problem := _existing_config_problem(config, wanted)):
        raise ConfigError(problem)
    paths = resolve_inputs(files)
    tok = _HF(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((text for p in paths for text in iter_texts(p, json_key)), trainer=trainer)
    write_atomic(out, tok.to_str())
    if tok.get_vocab_size() < 1:
        raise DataError(f"{output}: the tokenizer learned nothing; give non-empty input files")
    trained = HFTokenizer(out)
    if config is not None:
        _write_config(config, tokenizer_config(trained.eod_token))
    return trained


def model_vocab(arch, tokenizer: str) -> int:
    """The model's vocabulary as the trainer computes it: the configured one, or the tokenizer's rounded
    up to a multiple of 64 (``clustertrain.train.model.padded_vocab``; the test checks they agree)."""
    if arch.vocab is not None:
        return arch.vocab
    return (load_tokenizer(tokenizer).vocab_size + 63) // 64 * 64
