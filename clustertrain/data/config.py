"""Project-file section owned by the data stage: ``models[].data`` (:class:`DataConfig`).

:mod:`clustertrain.project` composes it into a model entry (and resolves its relative paths against
the project file); :mod:`clustertrain.data.staging` turns it into a dataset for a run. Pure pydantic:
importing this module imports no numpy or tokenizers.
"""

from __future__ import annotations

from pydantic import Field, model_serializer, model_validator

from clustertrain.core.schema import StrictModel


class BlendSource(StrictModel):
    source: str = Field(..., description="A data source, as `data.source` (raw files, a prepared prefix or `s3://`).")
    weight: float = Field(..., gt=0, description="Relative share of the training samples (Megatron's blend weight; "
                          "the weights need not add up to 1).")


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
    blend: list[BlendSource] = Field(
        default_factory=list, description="Several sources mixed by weight instead of one `source` (Megatron's "
        "`--data-path W1 P1 W2 P2 ...` and greedy blend; either framework). Each is prepared like `source`, with the same "
        "tokenizer.",
    )

    @model_validator(mode="after")
    def _check(self) -> "DataConfig":
        if self.blend and "source" in self.model_fields_set:
            raise ValueError("give data.source or data.blend, not both (a blend lists its sources)")
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler):
        """Without ``source`` under a blend (its default is not a choice), so the resolved ``config.yaml`` the ranks
        read back does not give both."""
        data = handler(self)
        if self.blend and isinstance(data, dict):
            data.pop("source", None)
        return data

    def sources(self) -> list[tuple[float, "DataConfig"]]:
        """(weight, one-source data section) for each source of the blend, or ``[(1.0, self)]`` without one."""
        if not self.blend:
            return [(1.0, self)]
        return [(b.weight, self.model_copy(update={"source": b.source, "blend": []})) for b in self.blend]
