"""Project-file section owned by the data stage: ``models[].data`` (:class:`DataConfig`).

:mod:`clustertrain.project` composes it into a model entry (and resolves its relative paths against
the project file); :mod:`clustertrain.data.staging` turns it into a dataset for a run. Pure pydantic:
importing this module imports no numpy or tokenizers.
"""

from __future__ import annotations

from pydantic import Field

from clustertrain.schema import StrictModel


class DataConfig(StrictModel):
    source: str = Field(
        "builtin:shakespeare",
        description="Training data: `builtin:shakespeare` (bundled, public domain); paths/globs of raw .txt/.jsonl(.gz) files, "
        "tokenized once into a Megatron indexed dataset below `<storage.root>/datasets/`; or the prefix of a prepared "
        "dataset (`P` with `P.bin` and `P.idx`, from `clustertrain data prepare` or Megatron's preprocess_data.py); or "
        "`s3://bucket/path/` where `clustertrain data prepare --publish` put one (fetched once, verified).",
    )
    tokenizer: str = Field("byte", description="Tokenizer: `byte` (byte-level, 256 + specials) or a Hugging Face `tokenizer.json` path.")
    json_key: str = Field("text", description="Key holding the text in JSONL inputs.")
    split: str = Field("100,0,0", description="train,valid,test ratio over documents (Megatron's --split); training reads the train part.")
    workers: int = Field(2, ge=1, description="Worker processes that tokenize raw inputs.")
