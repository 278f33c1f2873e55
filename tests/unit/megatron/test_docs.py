"""docs/megatron.md's mapping table is generated from the code (clustertrain/megatron/args.py FLAGS)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from clustertrain.megatron.args import flag_table_markdown

DOC = Path(__file__).resolve().parents[3] / "docs" / "megatron.md"
BLOCK = re.compile(r"(<!-- flags -->\n)(.*?)(<!-- /flags -->)", re.S)


def test_docs_table_is_the_code_table():
    text = DOC.read_text()
    if os.environ.get("CLUSTERTRAIN_UPDATE_GOLDEN"):
        text = BLOCK.sub(lambda m: m.group(1) + flag_table_markdown() + m.group(3), text)
        DOC.write_text(text)
    found = BLOCK.search(text)
    assert found, f"{DOC} lost its <!-- flags --> markers"
    assert found.group(2) == flag_table_markdown(), "regenerate with CLUSTERTRAIN_UPDATE_GOLDEN=1"
