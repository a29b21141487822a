"""scripts/engine_decode_layout.py's record: the indices' spread in the pool, a tensor's layout,
vLLM/ours per arm from the rounds' device times, and its arguments checked before an engine
starts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ..script_modules import loaded_script

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "engine_decode_layout.py"


@pytest.fixture(scope="module")
def layout_script():
    with loaded_script(SCRIPT, "engine_decode_layout_under_test") as module:
        yield module


def test_every_fourth_block_is_increasing_without_unit_gaps(layout_script):
    spread = layout_script.index_spread([1, 5, 9, 13])
    assert spread == {
        "count": 4,
        "min": 1,
        "max": 13,
        "increasing": True,
        "unit_gaps": 0,
        "first": [1, 5, 9, 13],
    }


def test_a_repeated_or_falling_index_is_not_increasing(layout_script):
    assert layout_script.index_spread([3, 4, 4])["increasing"] is False
    assert layout_script.index_spread([3, 4, 4])["unit_gaps"] == 1
    assert layout_script.index_spread([5, 2])["increasing"] is False


def test_the_layout_of_a_pool_view_keeps_its_block_stride(layout_script):
    raw = torch.zeros(3 * 40)
    pool = torch.as_strided(raw, (3, 2, 4, 4), (40, 16, 4, 1), storage_offset=8)
    described = layout_script.layout(pool)
    assert described["shape"] == [3, 2, 4, 4]
    assert described["stride"] == [40, 16, 4, 1]
    assert described["contiguous"] is False
    assert described["base_mod_128"] == (raw.data_ptr() + 8 * 4) % 128


def test_the_ratio_is_vllm_over_ours_of_the_medians_and_per_round(layout_script):
    summary = layout_script.ratio_summary({"vllm": [96.0, 90.0, 99.0], "ours": [100.0, 95.0, 90.0]})
    assert summary["vllm_us"] == 96.0 and summary["ours_us"] == 95.0
    assert summary["vllm_over_ours"] == 96.0 / 95.0
    assert summary["round_ratios"] == [0.96, 90.0 / 95.0, 1.1]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--out", "x.json", "--batch", "0"], "--batch must be 1 to 128"),
        (["--out", "x.json", "--batch", "129"], "--batch must be 1 to 128"),
        ([], "--out is required"),
    ],
)
def test_bad_arguments_stop_before_an_engine_starts(layout_script, argv, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        layout_script.main(argv)
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err
