"""scripts/profile_recurrent.py reads ncu's raw CSV: launches grouped into cases in run order,
each kernel's metrics as medians over its launches, kernels told apart by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..script_modules import loaded_script

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "profile_recurrent.py"


@pytest.fixture(scope="module")
def profile():
    with loaded_script(SCRIPT, "profile_recurrent_under_test") as module:
        yield module


def fake_csv(profile, times_by_case: list[dict[str, list[float]]]) -> str:
    """ncu --csv --page raw: a log line, the header, the units row, one row per launch."""
    metric = "gpu__time_duration.sum"
    lines = ["==PROF== Connected to process 1", f'"ID","Kernel Name","{metric}"', '"","","ns"']
    launch = 0
    for case in times_by_case:
        for kernel in ("fused_recurrent_gated_delta_rule_packed_decode_kernel",
                       "recurrent_step_kernel"):  # fmt: skip
            for value in case[kernel]:
                lines.append(f'"{launch}","{kernel}","{value:,.0f}"')
                launch += 1
    return "\n".join(lines)


def test_launches_group_into_cases_with_medians_per_kernel(profile, monkeypatch):
    monkeypatch.setattr(profile, "LAUNCHES", 3)
    cases = [
        {"fused_recurrent_gated_delta_rule_packed_decode_kernel": [10, 30, 20],
         "recurrent_step_kernel": [1000, 1200, 1100]},
        {"fused_recurrent_gated_delta_rule_packed_decode_kernel": [5, 7, 6],
         "recurrent_step_kernel": [8, 9, 7]},
    ]  # fmt: skip
    parsed = profile.parse_ncu_csv(fake_csv(profile, cases), [128])
    assert [(c["batch"], c["state_dtype"]) for c in parsed] == [(128, "float32"), (128, "bfloat16")]
    first, second = parsed
    assert first["kernels"]["vllm"]["gpu__time_duration.sum"] == 20
    assert first["kernels"]["ours"]["gpu__time_duration.sum"] == 1100  # "1,100" read as a number
    assert second["kernels"]["vllm"]["gpu__time_duration.sum"] == 6
    assert second["kernels"]["ours"]["gpu__time_duration.sum"] == 8
    assert first["kernels"]["ours"]["launches"] == 3
