"""The fast encoder for byte-level BPE ``tokenizer.json`` files, used only where it is exact.

``data prepare`` encodes with `gigatoken <https://pypi.org/project/gigatoken/>`_ (a Rust BPE encoder made for
preprocessing; Megatron-LM's ``tools/preprocess_data_fast.py --use-gigatoken`` uses it too) when it gives the same
token ids as Hugging Face ``tokenizers`` for the tokenizer at hand, and with ``tokenizers`` otherwise. The output
is then byte-identical either way, and byte-identical to Megatron-LM's classic ``tools/preprocess_data.py``.

Exactness is checked, not assumed. :func:`choose_encoder` runs, in order:

1. gigatoken must be importable and must load the file. It refuses what it does not implement, for example
   SentencePiece-style ``Metaspace`` tokenizers without byte tokens, ``NFKC``/``Lowercase``/``Replace``
   normalizers, and ``Split`` regexes it has no fast pre-tokenizer for.
2. Both encoders encode :func:`verification_sample` and must agree on every document. The sample holds: unicode
   (combining marks, CJK, emoji with modifiers, ligatures), whitespace runs, digit runs, contractions, NUL and
   control characters, very long words, every added token's text alone and glued to words and spaces, empty
   documents, and the corpus's own first documents. Some tokenizers load but differ, for example with an added
   token marked ``single_word`` or a model with an ``end_of_word_suffix``.

Any failure means ``tokenizers`` encodes, and :class:`EncoderChoice` ``.reason`` says why in one line.

Empty documents and end-of-document tokens are not the encoder's business: :mod:`clustertrain.data.preprocess`
keeps the classic tool's conventions (a document that encodes to nothing gets no sequence and no eod), whichever
encoder ran. ``preprocess_data_fast.py`` writes an eod-only sequence for such a document instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import metadata
from typing import Callable, Sequence

import numpy as np

from clustertrain.data.tokenizers import HFTokenizer, Tokenizer

#: fixed hard cases of the verification sample
HARD_CASES: tuple[str, ...] = (
    "", " ", "\n", "  \n\n\t  x  \t\n", "\r\n\r\nline\r\n", "   leading", "trailing   ", "a  b   c    d",
    "naïve café résumé Ångström", "e\u0301 a\u0300 n\u0303 (combining)", "ﬁ ﬀ ① ² ＡＢＣ ｶﾀｶﾅ",
    "日本語のテキスト 中文文本 한국어 텍스트", "Привет мир ελληνικά עברית العربية हिन्दी",
    "😀 👍🏽 👨‍👩‍👧 🏳️‍🌈 emoji", "\u200b\u200d\ufeff zero-width", "\U0001d400\U0001d401 math",
    "it's they're I'M we'LL she'd you've don't O'Neil", "'s 't 're 've 'm 'll 'd",
    "0 1 12 123 1234 12345 1234567890 3.14159 1,000,000 -42 1e-10 0x1F",
    "\x00 nul \x00\x00 \x01\x02\x1b[0m \x7f \x85 \x9f", "tab\tseparated\tvalues\n",
    "a" * 4000, "ab" * 2000, "9" * 3000, " " * 3000, "\n" * 500, "日" * 2000, "😀" * 1000,
    "supercalifragilisticexpialidocious" * 40, "x" + "\t" * 200 + "y",
    "def f(x):\n    return x**2  # comment\n\n\nclass A:\n\tpass\n", "{\"json\": [1, 2, {\"k\": null}]}",
    "https://example.com/path?q=1&r=%20#frag user@example.com",
    "<s> </s> <unk> <pad> <|im_start|> [CLS] [SEP] [MASK]",
)


def _added_token_cases(tokenizer_json: dict) -> list[str]:
    """Each added token's text alone, glued to words, between spaces, at line starts and twice in a row."""
    out: list[str] = []
    for tok in tokenizer_json.get("added_tokens") or []:
        c = str(tok.get("content", ""))
        if c:
            out += [c, f"x{c}y", f" {c} ", f"a {c}b", f"a{c} b", f"{c}{c}", f"\n{c}\n", f"word {c}\nword", f"{c} {c}"]
    return out


def verification_sample(tokenizer_json: dict, corpus_texts: Sequence[str]) -> list[str]:
    """The documents both encoders must agree on (see the module docstring)."""
    return [*HARD_CASES, *_added_token_cases(tokenizer_json), *corpus_texts]


class FastBPE:
    """gigatoken's encoder for one ``tokenizer.json``, on the calling thread (worker processes use the cores; see
    docs/data.md, "Encoders"). Picklable: a spawned worker rebuilds it from the JSON."""

    def __init__(self, tokenizer_json: str):
        from gigatoken.gigatoken_rs import load_hf_json

        self._json = tokenizer_json
        self._backend = load_hf_json(tokenizer_json)

    def __getstate__(self) -> dict:
        return {"json": self._json}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["json"])

    def encode_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(all tokens, concatenated; tokens per text)."""
        ragged = self._backend.encode_batch(list(texts), parallel=False)
        layout = ragged.layout  # a ListOffsetArray of uint32: read its buffers rather than building Python objects
        offsets = np.asarray(layout.offsets.data, dtype=np.int64)
        tokens = np.asarray(layout.content.data)[offsets[0]:offsets[-1]]
        return tokens, np.diff(offsets)


@dataclass(frozen=True)
class EncoderChoice:
    """The encoder ``data prepare`` uses, its name with version, and the one-line reason."""

    encoder: object
    name: str
    fast: bool
    reason: str


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "?"


def _first_difference(sample: Sequence[str], want: list[np.ndarray], got: tuple[np.ndarray, np.ndarray]) -> int | None:
    tokens, lengths = got
    if len(lengths) != len(want):
        return 0
    pos = 0
    for i, (w, n) in enumerate(zip(want, lengths)):
        if n != w.size or not np.array_equal(tokens[pos:pos + n], w):
            return i
        pos += int(n)
    return None


def choose_encoder(tokenizer: Tokenizer, corpus_texts: Sequence[str] | Callable[[], Sequence[str]] = (),
                   allow_fast: bool = True) -> EncoderChoice:
    """gigatoken where it reproduces ``tokenizer`` on :func:`verification_sample`, else the tokenizer itself
    (always the tokenizer itself with ``allow_fast=False``). ``corpus_texts`` may be a function, called only when
    the sample is needed (reading the corpus's head is wasted on other tokenizers)."""
    hf_name = f"tokenizers {_version('tokenizers')}"
    if not isinstance(tokenizer, HFTokenizer):
        return EncoderChoice(tokenizer, tokenizer.identity, False, "the tokenizer's own encoder")
    if not allow_fast:
        return EncoderChoice(tokenizer, hf_name, False, "--encoder reference")
    text = tokenizer.path.read_text(encoding="utf-8")
    try:
        fast = FastBPE(text)
    except ImportError:
        return EncoderChoice(tokenizer, hf_name, False, "gigatoken is not installed (pip install gigatoken)")
    except Exception as e:  # gigatoken raises RuntimeError with a multi-line message for what it does not implement
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return EncoderChoice(tokenizer, hf_name, False, f"gigatoken cannot load this tokenizer ({first})")
    sample = verification_sample(json.loads(text), corpus_texts() if callable(corpus_texts) else corpus_texts)
    # one text at a time: a batch would start tokenizers' thread pool in this process, and a worker pool forked
    # after it (when tokenizers ends up encoding) would print tokenizers' fork warning
    want = [np.asarray(tokenizer.encode(t), dtype=np.int64) for t in sample]
    try:
        got = fast.encode_flat(sample)
    except Exception as e:
        return EncoderChoice(tokenizer, hf_name, False, f"gigatoken failed on the verification sample ({e})")
    bad = _first_difference(sample, want, got)
    if bad is not None:
        shown = sample[bad] if len(sample[bad]) <= 40 else sample[bad][:37] + "..."
        return EncoderChoice(tokenizer, hf_name, False,
                             f"gigatoken differs from tokenizers on {shown!r} (document {bad} of {len(sample)} "
                             "checked)")
    return EncoderChoice(fast, f"gigatoken {_version('gigatoken')}", True,
                         f"gigatoken matches tokenizers on all {len(sample)} verification documents")

