"""Suite-wide hooks: one closing line that says how many tests were skipped and why."""

from __future__ import annotations

from collections import Counter

import pytest


def _reason(report) -> str:
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """After the short test summary (``-ra`` lists the skips one by one): ``skipped N tests: K [reason]; ...``,
    grouped by reason, most first."""
    try:
        return (yield)
    finally:
        reports = [r for r in terminalreporter.stats.get("skipped", []) if r.skipped]
        reasons = Counter(_reason(r) for r in reports)
        groups = "; ".join(f"{count} [{reason}]" for reason, count in reasons.most_common())
        terminalreporter.write_line(f"skipped {len(reports)} tests" + (f": {groups}" if groups else ""))
