"""CPU checks of scripts/bench_decode.py: its --smoke run writes every case with every field,
the API bound is read as documented, and without CUDA a real run measures nothing."""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gdn_evidence.harness.launch_shapes import qwen3_next_dims
from vllm_gdn_invariant.kernels.recurrent import recurrent_config

from ..script_modules import loaded_script

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "scripts" / "bench_decode.py"
FIELDS = (
    "bytes", "us", "rounds_us", "wall_us", "wall_rounds_us", "wall_calls", "kernel_us",
    "kernel_rounds_us", "kernel_cold_us", "kernel_cold_rounds_us", "achieved_GBps",
    "peak_copy_GBps", "fraction_of_copy", "fraction_of_peak_copy", "speed_vs_vllm",
    "speed_vs_vllm_api", "speed_vs_vllm_wall", "speed_vs_vllm_device",
    "speed_vs_vllm_device_cold", "api_bound",
)  # fmt: skip


@pytest.fixture(scope="module")
def bench():
    """scripts/bench_decode.py as a module (scripts/ on sys.path for its ``checkout`` import)."""
    with loaded_script(SCRIPT, "bench_decode_under_test") as module:
        yield module


def run(*arguments: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *arguments],
        cwd=REPO_ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=900,
    )


def smoke_report(target: Path, *arguments: str) -> dict:
    """The report of a ``--smoke`` run with ``arguments``, written to ``target``; the run must
    exit 0."""
    result = run("--smoke", *arguments, "--out", str(target))
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(target.read_text())


def test_smoke_run_writes_every_op_dtype_and_batch_with_every_field(tmp_path, bench):
    report = smoke_report(tmp_path / "smoke.json", "--what-if")
    assert report["schema"] == bench.SCHEMA
    assert report["provenance"]["mode"] == "smoke"
    assert report["complete"] is True
    assert report["settings"]["flush"] == "rewrite"  # the default
    assert report["provenance"]["recurrent_provider"].startswith("smoke stand-in")
    cases = report["cases"]
    expected = {
        (op, dtype, batch)
        for op in bench.OPS
        for dtype in bench.STATE_DTYPES
        for batch in bench.SMOKE_BATCH_SIZES
    }
    assert {(c["op"], c["state_dtype"], c["batch"]) for c in cases} == expected
    assert len(cases) == len(expected) == report["summary"]["cases"]
    for case in cases:
        assert set(FIELDS) <= set(case), case["op"]
        assert set(case["us"]) == set(case["wall_us"]) == {*bench.ARMS, "copy"}
        assert set(case["kernel_us"]) == set(bench.ARMS)
        assert all(t > 0 for t in case["wall_us"].values())
        assert case["kernel_us"]["ours"] is None  # no device time on CPU
        assert case["api_bound"]["checks_us"] > 0  # the public functions' checks, timed alone
    assert "config" in next(c for c in cases if c["op"] == "recurrent")
    for case in cases:  # --what-if: beside the recurrent cases with a bf16 state only
        if case["op"] == "recurrent" and case["state_dtype"] == "bfloat16":
            assert set(case["what_if"]) == {"grouped", "grouped_fma"}
            assert all(w["us"] > 0 for w in case["what_if"].values())
        else:
            assert "what_if" not in case


def test_contracted_times_vllm_ours_and_the_contracted_kernel_beside_each_recurrent_case(
    tmp_path,
):
    report = smoke_report(tmp_path / "contracted.json", "--ops", "recurrent", "--contracted")
    cases = report["cases"]
    assert {c["state_dtype"] for c in cases} == {"float32", "bfloat16"}
    for case in cases:
        contracted = case["contracted"]
        assert set(contracted["us"]) == {"vllm", "ours", "contracted"}
        assert all(t > 0 for t in contracted["us"].values())
        assert set(contracted["speed_vs_vllm"]) == {"ours", "contracted"}


def test_prefetch_kernels_run_where_they_take_whole_blocks_with_ours_bits(tmp_path):
    flags = ("--ops", "recurrent", "--prefetch", "--l2-prefetch", "--early-loads")
    report = smoke_report(tmp_path / "prefetch.json", *flags, "--flush", "read")
    assert report["settings"]["flush"] == "read"
    for case in report["cases"]:
        prefetch = case["prefetch"]
        # smoke heads (V = 16): the default takes one block, the one-warp shape two of 8 rows
        assert set(prefetch["configs"]) == {"w1c16", "prefetch_two_w1c16"}
        assert prefetch["configs"]["prefetch_two_w1c16"]["chunks"] == 2
        assert prefetch["same_bits"] == {"w1c16": True, "prefetch_two_w1c16": True}
        l2 = case["l2_prefetch"]
        shapes = {"w1c8", "l2_prefetch_w1c8", "w1c16", "l2_prefetch_w1c16", "l2_ahead_2_w1c16"}
        assert set(l2["configs"]) == shapes and l2["configs"]["l2_prefetch_w1c16"]["chunks"] == 2
        assert l2["same_bits"] == dict.fromkeys(shapes, True)
        early = case["early_loads"]  # every shape ours takes: here one block per program
        assert early["configs"]["early_loads"] == case["config"]
        assert early["same_bits"] == {"early_loads": True}


def test_pipelined_variants_run_where_they_take_whole_blocks_with_ours_bits(tmp_path, bench):
    report = smoke_report(tmp_path / "pipelined.json", "--ops", "recurrent", "--pipelined")
    for case in report["cases"]:
        timed = case["pipelined"]
        # smoke heads (V = 16): the one-warp shapes take two blocks of 8 rows; the default and
        # 32-row shapes take one, where there is no loop to pipeline
        one_warp = {"w1c16", "w1c16_slab"}
        pipelined = {f"pipelined_s{s}_{shape}" for s in (2, 3, 4) for shape in one_warp}
        pipelined |= {"pipelined_s3_w1c4_slab"}  # two blocks of 8 rows here, as w1c16's
        assert set(timed["configs"]) == {"w2c4", "w4c4", "w1c4_slab", *one_warp, *pipelined}
        slab = timed["configs"]["pipelined_s2_w1c16_slab"]
        assert (slab["log2_j"], slab["log2_cl"], slab["log2_vec"]) == (0, 2, 2)  # K = 16
        assert timed["same_bits"] == dict.fromkeys(timed["configs"], True)
        assert set(timed["speed_vs_vllm_device"]) == {"ours", *timed["configs"]}
    assert "vLLM/pipelined_s3_w1c16" in bench.variants_table(report, "pipelined")
    flushed = bench.variants_table(report, "pipelined", cold=True)
    assert flushed.startswith("| state | B | vLLM (µs, device, L2 flushed) | vLLM/ours |")


@pytest.mark.parametrize("state_dtype", [torch.bfloat16, torch.float32], ids=str)
def test_full_line_variants_load_whole_128_byte_lines_of_each_row(bench, state_dtype):
    dims = qwen3_next_dims(128)
    default = recurrent_config(dims, state_dtype, interpreted=False)

    def line_bytes(config) -> int:  # one warp's load of a slab, per value row
        return (1 << (config.log2_cl + config.log2_vec)) * state_dtype.itemsize

    if state_dtype == torch.bfloat16:
        assert line_bytes(default) == 64  # ours: half lines, what the set is measured against
    for fields, _, kernel in bench.VARIANTS["full_lines"].values():
        config = bench.variant_config(default, fields, dims.head_k, state_dtype)
        assert kernel is None and line_bytes(config) == 128
        assert (32 >> config.log2_cl) == 4 and config.block_v * config.chunks in (32, 128)


def test_full_line_variants_run_with_ours_bits(tmp_path, bench):
    report = smoke_report(tmp_path / "full_lines.json", "--ops", "recurrent", "--full-lines")
    for case in report["cases"]:
        timed = case["full_lines"]
        assert set(timed["configs"]) == set(bench.VARIANTS["full_lines"])
        assert timed["same_bits"] == dict.fromkeys(timed["configs"], True)
    assert "vLLM/full_lines_w2c8" in bench.variants_table(report, "full_lines")


def test_block_order_and_tma_variants_run_where_they_take_whole_blocks_with_ours_bits(
    tmp_path, bench
):
    flags = ("--ops", "recurrent", "--block-order", "--tma")
    report = smoke_report(tmp_path / "block_order_tma.json", *flags)
    for case in report["cases"]:
        # smoke heads (V = 16): only the one-warp shape takes two blocks of 8 rows
        assert set(case["block_order"]["configs"]) == {"w1c16", "rotated_w1c16"}
        tma = {"w1c16", *(name for name in bench.TMA if name.endswith("_w1c16"))}
        assert set(case["tma"]["configs"]) == tma
        for variants in ("block_order", "tma"):
            same = case[variants]["same_bits"]
            assert same == dict.fromkeys(case[variants]["configs"], True)


def test_replay_step_runs_one_token_per_row_with_the_decode_steps_bits(tmp_path, bench):
    report = smoke_report(tmp_path / "replay_step.json", "--ops", "decode_step", "--replay-step")
    for case in report["cases"]:
        timed = case["replay_step"]
        assert timed["same_bits"] == {"replay_one_token": True}
        assert set(timed["us"]) == {"vllm", "ours", "replay_one_token"}
    table = bench.variants_table(report, "replay_step")
    assert table.splitlines()[0].endswith("| vLLM/ours | vLLM/replay_one_token |")
    assert len(table.splitlines()) == 2 + len(report["cases"])


def test_same_bits_tells_minus_zero_from_zero(bench):
    zeros = torch.zeros(4)
    assert bench.same_bits(zeros, zeros.clone())
    assert not bench.same_bits(zeros, -zeros)  # equal as floats, not as bits
    assert not bench.same_bits(zeros.bfloat16(), zeros.half())


@pytest.mark.parametrize(
    "batch, api, launch, within",
    [
        (64, 125.0, 100.0, True),
        (64, 126.0, 100.0, False),
        (1024, 1100.0, 1000.0, True),
        (63, 149.0, 100.0, True),
        (1, 61.0, 10.0, False),
        (1, 59.0, 10.0, True),
    ],
)
def test_api_bound_is_a_ratio_from_64_rows_and_an_excess_below(bench, batch, api, launch, within):
    bound = bench.api_bound(batch, api, launch)
    assert bound["within"] is within
    assert bound["ratio"] == round(api / launch, 3)
    assert bound["excess_us"] == round(api - launch, 2)


def test_wall_calls_last_the_target_within_the_limits(bench):
    quick = bench.QUICK
    assert bench.wall_calls(quick, 1000.0) == 10  # 5 ms of 1 ms calls, at least 10
    assert bench.wall_calls(quick, 10.0) == 500
    assert bench.wall_calls(quick, 0.1) == quick.wall_max_calls


def test_summary_lists_cases_below_one_and_api_misses(bench):
    def case(op, speed, within, cold):
        return {
            "op": op, "state_dtype": "float32", "batch": 8, "speed_vs_vllm": speed,
            "speed_vs_vllm_wall": 1.2, "speed_vs_vllm_device": None,
            "speed_vs_vllm_device_cold": cold,
            "api_bound": bench.api_bound(8, 100.0 if within else 200.0, 90.0),
        }  # fmt: skip

    cases = [case("conv", 0.9, True, 1.01), case("recurrent", 1.1, False, 0.98)]
    summary = bench.summary(cases)
    assert [c["op"] for c in summary["below_1"]["speed_vs_vllm"]] == ["conv"]
    assert summary["below_1"]["speed_vs_vllm_wall"] == []
    assert summary["below_1"]["speed_vs_vllm_device"] == []
    assert [c["op"] for c in summary["below_1"]["speed_vs_vllm_device_cold"]] == ["recurrent"]
    assert [m["op"] for m in summary["api_bound_misses"]] == ["recurrent"]


def test_the_table_shows_the_flushed_device_time_where_a_run_measured_it(bench):
    case = {
        "op": "recurrent", "state_dtype": "bfloat16", "batch": 64,
        "us": {"vllm": 50.0, "ours": 52.0}, "speed_vs_vllm": 0.962, "speed_vs_vllm_wall": 0.97,
        "speed_vs_vllm_device": 0.955, "api_bound": {"ratio": 1.1, "within": True},
    }  # fmt: skip
    earlier = bench.results_table({"cases": [case]})
    later = bench.results_table({"cases": [case | {"speed_vs_vllm_device_cold": 0.981}]})
    assert "L2 flushed" not in earlier and earlier.splitlines()[2].count("|") == 13
    header, rule, row = later.splitlines()
    assert header.count("|") == rule.count("|") == row.count("|") == 14
    assert "| 0.955 | 0.981 | 1.10 |" in row


def test_without_cuda_a_real_run_exits_with_status_2_and_writes_nothing(tmp_path):
    target = tmp_path / "bench.json"
    result = run("--quick", "--out", str(target), env={"CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode == 2, result.stderr
    assert "CUDA is not available" in result.stderr
    assert not target.exists()


def test_smoke_sweep_times_the_default_and_the_candidates_fastest_first(tmp_path, bench):
    target = tmp_path / "sweep.json"
    result = run(
        "--smoke", "--ops", "recurrent", "--sweep", "recurrent", "--sweep-from", "1",
        "--out", str(target),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(target.read_text())
    for case in report["cases"]:
        sweep = case["sweep"]
        assert [row["default"] for row in sweep].count(True) == 1
        assert next(r for r in sweep if r["default"])["config"] == case["config"]
        assert [r["us"] for r in sweep] == sorted(r["us"] for r in sweep)
        for row in sweep:
            assert row["speed_vs_vllm"] == bench.ratio(case["us"]["vllm"], row["us"])
            assert len(row["rounds_us"]) == bench.SWEEP_ROUNDS  # every shape in every round
            assert row["us"] == statistics.median(row["rounds_us"])
    fp32 = next(c for c in report["cases"] if c["state_dtype"] == "float32")
    assert len(fp32["sweep"]) > 1  # a candidate beside the default
    table = run("--sweep-table", str(target))
    assert table.returncode == 0, table.stderr
    per_case, choices = table.stdout.strip().split("\n\n")
    assert len(per_case.splitlines()) == 2 + len(report["cases"])
    assert len(choices.splitlines()) == 2 + len(report["cases"])  # one op, two dtypes, one B


def test_without_a_sweep_from_argument_the_sweep_starts_at_64_rows(tmp_path):
    report = smoke_report(tmp_path / "sweep.json", "--ops", "recurrent", "--sweep")
    assert all("sweep" not in c for c in report["cases"])  # B = 2


def test_the_sweep_alternates_the_shapes_round_by_round(bench):
    """Each round times every shape once, the default first, so that a drift of the machine
    falls on every shape alike; the medians are over the rounds."""

    @dataclasses.dataclass(frozen=True)
    class Shape:
        name: str

    calls = []
    times = iter(range(1, 100))

    class Clock:
        def bench_us(self, fn):
            fn()
            return float(next(times))

    default, a, b = Shape("default"), Shape("a"), Shape("b")
    arms = {"ours": lambda shape: calls.append(shape.name), "_config": default}
    rows = bench.sweep_launch_shapes(arms, [a, default, b], 12.0, Clock())
    assert calls == ["default", "a", "b"] * bench.SWEEP_ROUNDS
    by_name = {r["config"]["name"]: r for r in rows}
    assert by_name["default"]["rounds_us"] == [1.0, 4.0, 7.0]
    assert by_name["b"]["us"] == 6.0 and by_name["b"]["speed_vs_vllm"] == 2.0
    assert [r["config"]["name"] for r in rows] == ["default", "a", "b"]  # fastest first
    assert [r["default"] for r in rows] == [True, False, False]


def test_the_one_shape_for_every_batch_size_is_the_one_least_behind_the_fastest(bench):
    """Shape a is fastest at B = 64 but 1.5x behind at 1024; b is 1.1x behind at 64 and
    fastest at 1024; c is 1.05x behind at both but missing at 1024's sweep: b is chosen."""

    def case(batch: int, times: dict[str, float]) -> dict:
        rows = sorted(
            ({"config": {"name": n}, "us": t, "default": n == "a"} for n, t in times.items()),
            key=lambda r: r["us"],
        )
        return {"op": "recurrent", "state_dtype": "bfloat16", "batch": batch, "sweep": rows}

    report = {
        "cases": [
            case(64, {"a": 10.0, "b": 11.0, "c": 10.5}),
            case(1024, {"a": 150.0, "b": 100.0}),
        ]
    }
    choice = bench.sweep_choices(report)[("recurrent", "bfloat16")]
    assert choice["config"] == {"name": "b"}
    assert choice["worst"] == pytest.approx(1.1) and choice["worst_batch"] == 64


def test_the_flush_before_a_cold_call_is_a_rewrite_or_a_read(bench):
    assert bench.GpuClock(bench.QUICK).flush_mode == "rewrite"
    assert bench.GpuClock(bench.QUICK, "read").flush_mode == "read"
    with pytest.raises(ValueError, match="flush 'sideways': one of rewrite, read"):
        bench.GpuClock(bench.QUICK, "sideways")
    result = run("--flush", "sideways", "--out", "/dev/null")
    assert result.returncode == 2 and "--flush: invalid choice: 'sideways'" in result.stderr
