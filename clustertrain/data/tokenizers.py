"""Tokenizers behind one interface: encode, decode, vocab_size, eod, identity.

``byte``: UTF-8 bytes are the tokens 0-255; specials follow (256 = end of document, 257 = pad).
No files and no downloads are ever needed for it.
"""

from __future__ import annotations

from typing import Protocol

from clustertrain.errors import ConfigError


class Tokenizer(Protocol):
    identity: str

    @property
    def vocab_size(self) -> int: ...

    @property
    def eod(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


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

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def load_tokenizer(spec: str) -> Tokenizer:
    if spec == "byte":
        return ByteTokenizer()
    raise ConfigError(f"data.tokenizer: unknown tokenizer {spec!r}; valid: byte")
