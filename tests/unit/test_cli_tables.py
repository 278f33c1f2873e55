"""The plain tables of `clustertrain check` and `clustertrain nodes list` (rich tables without borders): one line per
row however long its last cell, columns two blanks apart, text as given (no markup, emoji or colour), no trailing
blanks."""

from __future__ import annotations

from clustertrain.cli.common import plain_table
from clustertrain.cli.nodes import render_rows

LONG = "needs 154.6 GiB per GPU [cfn-lint] :smile: " + "x" * 300


def test_check_table_is_one_line_per_finding():
    rows = [("error", "plan", "models[0].parallelism", f"{LONG}; fix: use FSDP2"),
            ("warning", "cluster", "aws.region", "short; fix: none")]
    assert plain_table(("level", "check", "field", "problem; fix"), rows).splitlines() == [
        "level    check    field                  problem; fix",
        f"error    plan     models[0].parallelism  {LONG}; fix: use FSDP2",
        "warning  cluster  aws.region             short; fix: none",
    ]


def test_nodes_table_keeps_the_reason_last_and_whole():
    row = {"node": "gpu10", "source": "hang", "job": 42, "model": None, "added": 0.0, "expires_in_s": 0,
           "state": "expired", "reason": LONG}
    for history in (False, True):
        lines = render_rows([row, {**row, "node": "n1", "reason": "slow"}], history).splitlines()
        assert len(lines) == 3 and lines[0].split()[-2:] == (["state", "reason"] if history else ["in", "reason"])
        assert lines[1].startswith("gpu10  hang    42   -      ") and lines[1].endswith(f"  {LONG}")
        assert lines[2].endswith("  slow") and lines[2].index("slow") == lines[1].index(LONG)
        assert all(line == line.rstrip() for line in lines)
