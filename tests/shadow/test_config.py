"""VLLM_GDN_INVARIANT_SHADOW: accepted forms, defaults, and the message of a bad one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vllm_gdn_invariant.plugin.config import ConfigError, PluginConfig, load_config
from vllm_gdn_invariant.shadow.config import (
    DEFAULT_MAX_FILE_MB,
    DEFAULT_MAX_ROWS,
    DEFAULT_MAX_SNAPSHOT_MB,
    ShadowConfig,
    output_path,
    parse_shadow,
)

ENV = "VLLM_GDN_INVARIANT_SHADOW"


def shadow(value: str) -> ShadowConfig:
    return load_config({ENV: value}).shadow


@pytest.mark.parametrize("value", ["off", "OFF", "0", "", "  off "])
def test_off_values_leave_the_checker_off(value):
    assert load_config({ENV: value}) == PluginConfig()
    assert not shadow(value).enabled


@pytest.mark.parametrize(
    "text, rate", [("1", 1.0), ("1.0", 1.0), ("0.25", 0.25), ("1/64", 1 / 64), (" 3/4 ", 0.75)]
)
def test_rate_as_decimal_or_fraction(tmp_path, text, rate):
    config = shadow(f"{text},out={tmp_path}/s.jsonl")
    assert config.rate == rate and config.enabled


def test_defaults(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = shadow("0.5")
    assert (config.reference, config.seed) == ("golden", 0)
    assert (config.max_rows, config.max_snapshot_mb, config.max_file_mb) == (
        DEFAULT_MAX_ROWS,
        DEFAULT_MAX_SNAPSHOT_MB,
        DEFAULT_MAX_FILE_MB,
    )
    assert config.out == str(tmp_path / "gdn_invariant_shadow.jsonl")  # made absolute


def test_every_option(tmp_path):
    config = shadow(
        f"1/8, ref=golden+decode, golden_impl=torch, out={tmp_path}/x.jsonl, seed=7, "
        "max_rows=3, max_snapshot_mb=1.5, max_file_mb=0.25"
    )
    assert config.references == ("golden", "decode")
    assert (config.seed, config.max_rows) == (7, 3)
    assert (config.max_snapshot_bytes, config.max_file_bytes) == (1572864, 262144)
    assert "1/8 ref=golden+decode golden_impl=torch out=" in config.describe()
    assert config.describe().endswith("max_rows=3 max_snapshot_mb=1.5 max_file_mb=0.25")
    decode_only = shadow(f"1/8, ref=decode, out={tmp_path}/x.jsonl")
    assert "ref=decode out=" in decode_only.describe()  # no golden reference, no golden_impl


@pytest.mark.parametrize(
    "value, reason",
    [
        ("1.5", "rate '1.5' is not in (0, 1]"),
        ("0.0", "rate '0.0' is not in (0, 1]"),
        ("-0.1", "not in (0, 1]"),
        ("nan", "is not a number or a fraction"),
        ("lots", "is not a number or a fraction"),
        ("1/0", "is not a number or a fraction"),
        ("0.5,ref=trainer", "ref='trainer' is not one of golden, decode, golden+decode"),
        ("0.5,seed=x", "seed='x' is not an integer"),
        ("0.5,max_rows=0", "max_rows=0 is below 1"),
        ("0.5,max_snapshot_mb=0", "max_snapshot_mb='0' is not a positive number"),
        ("0.5,max_file_mb=-1", "max_file_mb='-1' is not a positive number"),
        ("0.5,max_file_mb=inf", "max_file_mb='inf' is not a positive number"),
        ("0.5,max_file_mb=big", "max_file_mb='big' is not a number"),
        ("0.5,max_mb=64", "unknown option 'max_mb=64' (the caps are max_snapshot_mb and"),
        ("0.5,color=red", "unknown option 'color=red'"),
        ("0.5,seed=1,seed=2", "option seed given twice"),
        ("0.5,out=", "out= is empty"),
    ],
)
def test_bad_value_names_variable_value_valid_values_and_reason(value, reason):
    with pytest.raises(ConfigError) as info:
        load_config({ENV: value})
    message = str(info.value)
    assert message.startswith(f"{ENV}={value!r} is not valid; valid values: off | 0 | <rate>")
    assert reason in message


def test_output_folder_that_does_not_exist_fails_at_startup(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config({ENV: f"1.0,out={tmp_path}/missing/s.jsonl"})


def test_output_folder_that_is_a_file_fails_at_startup(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="does not exist"):
        load_config({ENV: f"1.0,out={tmp_path}/file/s.jsonl"})


def test_unwritable_output_folder_fails_at_startup_and_leaves_nothing():
    # /proc refuses new files even to root, where permission bits would not
    with pytest.raises(ConfigError, match="cannot write in '/proc'"):
        load_config({ENV: "1.0,out=/proc/shadow.jsonl"})


def test_validation_writes_nothing(tmp_path):
    shadow(f"1.0,out={tmp_path}/s.jsonl")
    assert list(tmp_path.iterdir()) == []


def test_one_file_per_process_named_with_the_pid(tmp_path):
    assert output_path("/a/shadow.jsonl", 42) == Path("/a/shadow.42.jsonl")
    assert output_path("/a/shadow", 42) == Path("/a/shadow.42.jsonl")
    assert output_path("/a/run-{pid}.log", 42) == Path("/a/run-42.log")
    config = parse_shadow(f"1.0,out={tmp_path}/s.jsonl")
    for pid in (7, 8):
        config.path_for(pid).write_text("")
    config.path_for(7).with_name("s.7.1.jsonl").write_text("")  # rotated (record.py)
    (tmp_path / "other.jsonl").write_text("")
    assert [p.name for p in config.files()] == ["s.7.1.jsonl", "s.7.jsonl", "s.8.jsonl"]
    assert config.path_for(os.getpid()).parent == tmp_path
