"""What every bench shares: interleaved rounds, median and spread, a verdict that can say "inconclusive", smoke mode.

A bench compares a side of ours (A) with a named reference (B) measured in the same run. Measuring all of A and then
all of B lets the machine's load drift between them (a busy 2-core machine moves a ratio by 2x in a minute), so
:func:`interleave` runs them in rounds, alternating the order (A B, B A, A B, ...), and every figure is a ratio per
round: the two sides of one round ran seconds apart, under the same load. :class:`Ratio` reports the median of those
ratios, their spread (lowest and highest), and a verdict against the target:

- ``holds``: every round's ratio meets the target;
- ``short``: no round's ratio meets it;
- ``inconclusive``: some do and some do not — the spread is larger than the margin the target asks about, so this
  run says nothing either way (rerun on an idle machine, or with more rounds);
- ``not judged (smoke)``: ``--smoke`` (or ``CLUSTERTRAIN_BENCH_SMOKE=1``) ran the bench at a size that takes seconds,
  to prove it still runs (the test suite does this for every bench: tests/integration/test_benches.py); no figure
  of a smoke run means anything.

Each result is printed as one line that starts with ``RESULT`` (and, with ``--json``, also as one JSON object per
line), with the machine's load average before and after the bench, so a figure carries the conditions it was
measured under. ``finish`` returns the exit status: 1 when a target is short, else 0 (a smoke run: 0).

    from harness import Bench, Ratio, interleave
    bench = Bench("checkpoint", __doc__)
    bench.parser.add_argument("--mb", type=int, default=300)
    args = bench.parse()                       # adds --smoke, --rounds, --json
    mb = 4 if bench.smoke else args.mb
    times = interleave({"ours": lambda: save(mb), "reference": lambda: write(mb)}, rounds=args.rounds)
    bench.report(Ratio.of("sync save MB/s / sequential write MB/s", times["reference"], times["ours"],
                          at_least=0.7, unit="x"))
    sys.exit(bench.finish())
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SMOKE_ENV = "CLUSTERTRAIN_BENCH_SMOKE"
HOLDS, SHORT, INCONCLUSIVE, SMOKE, MEASURED = "holds", "short", "inconclusive", "not judged (smoke)", "measured"


def load() -> float:
    """The 1-minute load average (runnable processes, over ``os.cpu_count()`` cores)."""
    return os.getloadavg()[0]


def interleave(sides: dict[str, Callable[[], float]], rounds: int, warmup: int = 0) -> dict[str, list[float]]:
    """Run every side once per round, the order alternating between rounds (A B, B A, A B, ...), and return each
    side's measurements (what its callable returned: a time, a rate, ...) in round order. ``warmup`` rounds run
    first and are dropped."""
    names = list(sides)
    out: dict[str, list[float]] = {n: [] for n in names}
    for i in range(warmup + rounds):
        for name in (names if i % 2 == 0 else names[::-1]):
            value = sides[name]()
            if i >= warmup:
                out[name].append(float(value))
    return out


def timed(fn: Callable[[], object]) -> Callable[[], float]:
    """A side that returns its own wall time in seconds."""
    def run() -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    return run


@dataclass
class Ratio:
    """A figure per round (usually ours ÷ reference), judged against a target bound (or bounds)."""

    name: str
    values: list[float]
    at_least: float | None = None
    at_most: float | None = None
    unit: str = "x"
    note: str = ""
    verdict: str = field(default="", init=False)

    @classmethod
    def of(cls, name: str, numerator: list[float], denominator: list[float], **kw) -> "Ratio":
        """Round i's figure is numerator[i] / denominator[i] (both measured in round i)."""
        if len(numerator) != len(denominator) or not numerator:
            raise ValueError(f"{name}: {len(numerator)} vs {len(denominator)} rounds")
        return cls(name, [n / d if d else float("inf") for n, d in zip(numerator, denominator)], **kw)

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    def meets(self, v: float) -> bool:
        return (self.at_least is None or v >= self.at_least) and (self.at_most is None or v <= self.at_most)

    def judge(self, smoke: bool) -> str:
        if smoke:
            return SMOKE
        if self.at_least is None and self.at_most is None:
            return MEASURED
        met = [self.meets(v) for v in self.values]
        return HOLDS if all(met) else SHORT if not any(met) else INCONCLUSIVE

    def target(self) -> str:
        if self.at_least is not None and self.at_most is not None:
            return f"{self.at_least:g}-{self.at_most:g}"
        if self.at_least is not None:
            return f">= {self.at_least:g}"
        if self.at_most is not None:
            return f"<= {self.at_most:g}"
        return "none"

    def line(self) -> str:
        lo, hi = min(self.values), max(self.values)
        spread = f"spread {lo:.3g}-{hi:.3g} over {len(self.values)} round(s)"
        text = f"RESULT {self.name}: {self.median:.3g}{self.unit} ({spread}), target {self.target()}: {self.verdict}"
        return text + (f"  [{self.note}]" if self.note else "")


class Bench:
    """One bench's command line and its results: ``--smoke``, ``--rounds N``, ``--json``; :meth:`report` prints a
    result's line, :meth:`finish` the load and the exit status."""

    def __init__(self, name: str, doc: str | None, rounds: int = 5):
        self.name = name
        self.parser = argparse.ArgumentParser(description=(doc or name).strip().splitlines()[0])
        self.parser.add_argument("--smoke", action="store_true",
                                 help="tiny sizes and one round: proves the bench runs (figures are not judged)")
        self.parser.add_argument("--rounds", type=int, default=rounds, help="interleaved rounds (default %(default)s)")
        self.parser.add_argument("--json", action="store_true", help="also print each result as a JSON line")
        self.results: list[Ratio] = []
        self.load_before = load()
        self.smoke = False
        self.args: argparse.Namespace | None = None

    def parse(self, argv: list[str] | None = None) -> argparse.Namespace:
        self.args = self.parser.parse_args(argv)
        self.smoke = bool(self.args.smoke or os.environ.get(SMOKE_ENV) == "1")
        if self.smoke:
            self.args.smoke = True
            self.args.rounds = 1
        print(f"bench {self.name}: {'smoke run, ' if self.smoke else ''}{self.args.rounds} round(s), "
              f"{os.cpu_count()} cores, load {self.load_before:.2f}", flush=True)
        return self.args

    @property
    def rounds(self) -> int:
        return self.args.rounds if self.args is not None else 1

    def report(self, result: Ratio) -> Ratio:
        result.verdict = result.judge(self.smoke)
        self.results.append(result)
        print(result.line(), flush=True)
        if self.args is not None and self.args.json:
            print(json.dumps({"bench": self.name, **asdict(result), "median": result.median}), flush=True)
        return result

    def finish(self) -> int:
        after = load()
        verdicts = [r.verdict for r in self.results]
        print(f"bench {self.name}: load {self.load_before:.2f} -> {after:.2f} on {os.cpu_count()} cores; "
              + (", ".join(f"{v} {verdicts.count(v)}" for v in dict.fromkeys(verdicts)) or "no results"), flush=True)
        return 1 if SHORT in verdicts else 0
