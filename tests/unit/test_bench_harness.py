"""bench/harness.py's verdicts (issue 40): a target is judged per interleaved round, and a run whose rounds fall
on both sides of it is "inconclusive", not a pass or a fail."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from harness import HOLDS, INCONCLUSIVE, MEASURED, SHORT, SMOKE, Bench, Ratio, interleave  # noqa: E402


def test_rounds_alternate_their_order_and_warmup_is_dropped():
    calls = []
    sides = {name: (lambda n=name: calls.append(n) or len(calls)) for name in ("a", "b")}
    out = interleave(sides, rounds=3, warmup=1)
    assert calls == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert out == {"a": [4.0, 5.0, 8.0], "b": [3.0, 6.0, 7.0]}


def test_verdict_is_per_round():
    assert Ratio("x", [0.8, 0.9, 0.75], at_least=0.7).judge(False) == HOLDS
    assert Ratio("x", [0.5, 0.6, 0.65], at_least=0.7).judge(False) == SHORT
    assert Ratio("x", [0.5, 0.9, 0.72], at_least=0.7).judge(False) == INCONCLUSIVE
    assert Ratio("x", [0.9, 1.3], at_least=0.8, at_most=1.25).judge(False) == INCONCLUSIVE
    assert Ratio("x", [1.3, 1.4], at_least=0.8, at_most=1.25).judge(False) == SHORT
    assert Ratio("x", [0.01], at_most=0.1).judge(True) == SMOKE
    assert Ratio("x", [3.0]).judge(False) == MEASURED


def test_ratio_of_pairs_rounds_and_the_line_carries_median_spread_and_target():
    r = Ratio.of("sync / write", [1.0, 3.0, 2.0], [2.0, 4.0, 2.0], at_least=0.7)
    assert r.values == [0.5, 0.75, 1.0] and r.median == 0.75
    r.verdict = r.judge(False)
    assert r.line() == "RESULT sync / write: 0.75x (spread 0.5-1 over 3 round(s)), target >= 0.7: inconclusive"


def test_a_short_target_fails_the_run_and_smoke_never_does(capsys):
    bench = Bench("t", "doc")
    bench.parse([])
    bench.report(Ratio("r", [0.5, 0.6], at_least=0.7))
    assert bench.finish() == 1
    smoke = Bench("t", "doc")
    assert smoke.parse(["--smoke", "--rounds", "9"]).rounds == 1
    smoke.report(Ratio("r", [0.5], at_least=0.7))
    assert smoke.finish() == 0 and "not judged (smoke)" in capsys.readouterr().out


def test_bench_readme_lists_every_bench():
    bench = Path(__file__).resolve().parents[2] / "bench"
    readme = (bench / "README.md").read_text()
    names = sorted(p.name for p in bench.glob("*.py") if p.name != "harness.py")
    assert names and [n for n in names if f"`{n}" not in readme] == []
