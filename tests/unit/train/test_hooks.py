"""Fault injection read from the environment (clustertrain.train.hooks)."""

from __future__ import annotations

import pytest

from clustertrain.core.errors import ConfigError
from clustertrain.train.hooks import Injections


def test_each_rank_takes_only_its_own_injection():
    env = {"CLUSTERTRAIN_INJECT_FAILURE": "1:5", "CLUSTERTRAIN_INJECT_NAN": "0:7", "CLUSTERTRAIN_INJECT_SLOW_DATA": "1:0.25"}
    assert Injections.from_environ(0, env) == Injections(nan_at_step=7)
    assert Injections.from_environ(1, env) == Injections(fail_at_step=5, slow_data_s=0.25)
    assert Injections.from_environ(2, {}) == Injections()


@pytest.mark.parametrize("name,value", [("CLUSTERTRAIN_INJECT_NAN", "7"), ("CLUSTERTRAIN_INJECT_SLOW_DATA", "1:slow"),
                                        ("CLUSTERTRAIN_INJECT_FAILURE", "a:b")])
def test_a_malformed_value_is_one_line(name, value):
    with pytest.raises(ConfigError, match=name):
        Injections.from_environ(0, {name: value})
