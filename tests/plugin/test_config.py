"""Environment parsing: defaults, every accepted value, and the message of a bad one."""

import pytest

from vllm_gdn_invariant.plugin.config import ConfigError, Mode, PluginConfig, load_config


def test_defaults_are_route_not_strict():
    assert load_config({}) == PluginConfig(Mode.ROUTE, False)


@pytest.mark.parametrize(
    "value, mode",
    [("route", Mode.ROUTE), ("ROUTE", Mode.ROUTE), ("golden", Mode.GOLDEN), (" off ", Mode.OFF)],
)
def test_mode_values(value, mode):
    assert load_config({"VLLM_GDN_INVARIANT_MODE": value}).mode is mode


@pytest.mark.parametrize("value, strict", [("0", False), ("1", True)])
def test_strict_values(value, strict):
    assert load_config({"VLLM_GDN_INVARIANT_STRICT": value}).strict is strict


@pytest.mark.parametrize("value", ["off", "OFF", "0", ""])
def test_shadow_off_is_accepted(value):
    assert load_config({"VLLM_GDN_INVARIANT_SHADOW": value}) == PluginConfig()


@pytest.mark.parametrize(
    "name, value",
    [
        ("VLLM_GDN_INVARIANT_MODE", "fast"),
        ("VLLM_GDN_INVARIANT_MODE", ""),
        ("VLLM_GDN_INVARIANT_STRICT", "yes"),
        ("VLLM_GDN_INVARIANT_STRICT", "2"),
        ("VLLM_GDN_INVARIANT_SHADOW", "1.5"),
        ("VLLM_GDN_INVARIANT_SHADOW", "lots"),
        ("VLLM_GDN_INVARIANT_REPLAY", "yes"),
        ("VLLM_GDN_INVARIANT_REPLAY", ""),
    ],
)
def test_bad_value_names_variable_value_and_choices(name, value):
    with pytest.raises(ConfigError) as info:
        load_config({name: value})
    message = str(info.value)
    assert name in message
    assert repr(value) in message
    assert "valid values:" in message
    assert info.value.name == name


@pytest.mark.parametrize("value, replay", [("on", True), ("OFF", False), (" off ", False)])
def test_replay_values(value, replay):
    assert load_config({"VLLM_GDN_INVARIANT_REPLAY": value}).replay is replay


@pytest.mark.parametrize(
    "mode, replay, batch_invariant, expected",
    [
        (Mode.ROUTE, True, True, True),
        (Mode.GOLDEN, True, True, True),
        (Mode.GOLDEN, True, False, True),
        (Mode.ROUTE, True, False, False),  # route alone: prefill is not on the grid
        (Mode.OFF, True, True, False),
        (Mode.GOLDEN, False, True, False),
    ],
)
def test_history_replay_applies_under_the_mode_or_in_mode_golden(
    mode, replay, batch_invariant, expected
):
    assert PluginConfig(mode=mode, replay=replay).replays_history(batch_invariant) is expected


def test_config_is_frozen():
    config = load_config({})
    with pytest.raises(AttributeError):
        config.mode = Mode.OFF  # type: ignore[misc]
