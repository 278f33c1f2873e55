"""The trainer's alarm rules (clustertrain.train.alarms): each fires when its condition starts, once, and re-arms."""

from __future__ import annotations

from clustertrain.train.alarms import LossSpike, RankTiming, Stragglers, ThroughputDrop, spread
from clustertrain.monitor.config import MonitorConfig


def timings(data: list[float], forward: list[float], step_s: float = 0.5) -> list[RankTiming]:
    """Ranks whose backward holds the wait for the slowest one, as under DDP."""
    own = [d + f for d, f in zip(data, forward)]
    return [RankTiming(r, f"node-{r // 2}", d, f, 2 * f + max(own) - own[r], 0.0, 0.01, step_s)
            for r, (d, f) in enumerate(zip(data, forward))]


def test_loss_spike_fires_once_per_spike_and_rearms():
    rule = LossSpike(MonitorConfig(loss_spike_factor=2.0, loss_window=5))
    fired = [rule.check(s, loss) for s, loss in enumerate([4.0, 4.1, 3.9, 4.0, 3.8, 9.0, 9.5, 3.7, 8.0], start=1)]
    kinds = [(e.step, e.kind) for e in fired if e is not None]
    assert kinds == [(6, "loss_spike"), (9, "loss_spike")]  # 9.5 continues the first spike; 8.0 is a new one
    assert fired[5].threshold == 2.0 * 4.0 and "step 6" in fired[5].message


def test_loss_spike_needs_history():
    rule = LossSpike(MonitorConfig())
    assert rule.check(1, 10.0) is None and rule.check(2, 100.0) is None


def test_throughput_drop_ignores_the_first_step_and_keeps_its_baseline():
    rule = ThroughputDrop(MonitorConfig(throughput_drop=0.5, loss_window=10))
    values = [100.0, 1000.0, 1010.0, 990.0, 1000.0, 1005.0, 400.0, 300.0, 1000.0, 200.0]
    fired = [e.step for s, v in enumerate(values, start=1) if (e := rule.check(s, v)) is not None]
    assert fired == [7, 10]  # the slow first step is no baseline; 300 continues the drop of 400


def test_straggler_named_with_its_part_after_n_logged_steps():
    rule = Stragglers(MonitorConfig(straggler_factor=1.5, straggler_steps=3))
    slow_data = timings([0.01, 0.01, 0.30, 0.01], [0.2, 0.2, 0.2, 0.2])
    assert rule.check(10, slow_data) == [] and rule.check(20, slow_data) == []
    events = rule.check(30, slow_data)
    assert [(e.rank, e.node, e.part, e.step) for e in events] == [(2, "node-1", "data", 30)]
    assert rule.check(40, slow_data) == []  # one event per stretch
    rule.check(50, timings([0.01] * 4, [0.2] * 4))  # recovered: re-armed
    assert [rule.check(s, slow_data) for s in (60, 70)] == [[], []] and len(rule.check(80, slow_data)) == 1


def test_the_ranks_waiting_for_a_straggler_are_not_blamed():
    """Under DDP the fast ranks wait inside backward: their compute_s is the largest, their forward is not."""
    rule = Stragglers(MonitorConfig(straggler_steps=1))
    slow = timings([0.01, 0.3], [0.1, 0.1])
    assert slow[0].compute_s > slow[1].compute_s
    assert [(e.rank, e.part) for e in rule.check(1, slow)] == [(1, "data")]


def test_straggler_ignores_noise_below_the_floor():
    rule = Stragglers(MonitorConfig(straggler_steps=1))
    # 3x the median data time, but 0.002 s on a 0.5 s step is timer noise, not a straggler
    assert rule.check(1, timings([0.001, 0.001, 0.003, 0.001], [0.2] * 4)) == []


def test_spread_names_the_slowest_rank_and_part():
    s = spread(timings([0.01, 0.01, 0.01, 0.01], [0.2, 0.2, 0.2, 0.45]))
    assert (s.slowest_rank, s.slowest_node, s.slowest_part) == (3, "node-1", "compute")
    assert abs(s.spread_s - 0.25) < 1e-9
