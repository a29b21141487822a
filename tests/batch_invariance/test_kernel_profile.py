"""The engine benchmark's "where the time goes": device time by kernel category from traces."""

from __future__ import annotations

import gzip
import json

import pytest

from gdn_evidence.e2e.kernel_profile import category, compare_to, kernel_time_summary


def trace(events: list[tuple[str, str, float]]) -> dict:
    return {
        "traceEvents": [
            {"ph": "X", "cat": cat, "name": name, "dur": dur, "ts": i}
            for i, (cat, name, dur) in enumerate(events)
        ]
        + [{"ph": "i", "cat": "kernel", "name": "instant", "ts": 0}]
    }


@pytest.mark.parametrize(
    ("name", "want"),
    [
        ("chunk_fwd_kernel_o", "gdn_prefill"),
        ("chunk_gated_delta_rule_fwd_kernel_h_blockdim64", "gdn_prefill"),
        ("fused_recurrent_gated_delta_rule_packed_decode_kernel", "gdn_decode"),
        ("recurrent_step_kernel", "gdn_decode"),
        ("_causal_conv1d_update_kernel", "gdn_conv"),
        ("conv_update_kernel", "gdn_conv"),
        ("layer_norm_fwd_kernel", "gated_norm"),
        ("fused_moe_kernel", "moe"),
        ("kernel_unified_attention_2d", "attention"),
        ("matmul_kernel_persistent", "gemm"),
        ("nvjet_tst_128x256_64x4_2x1_v_bz_coopA_TNT", "gemm"),
        ("void vllm::rms_norm_kernel<c10::BFloat16>", "norm"),
        ("Memcpy HtoD (Pageable -> Device)", "memcpy_memset"),
        ("elementwise_kernel", "other"),
    ],
)
def test_kernels_fall_in_the_first_category_their_name_matches(name, want):
    assert category(name) == want


def test_only_complete_device_events_count_and_gzipped_traces_read(tmp_path):
    plain = tmp_path / "rank0.pt.trace.json"
    plain.write_text(
        json.dumps(
            trace(
                [
                    ("kernel", "fused_moe_kernel", 30.0),
                    ("kernel", "fused_moe_kernel", 10.0),
                    ("kernel", "chunk_fwd_kernel_o", 20.0),
                    ("cpu_op", "aten::mm", 1000.0),  # host time is not device time
                    ("gpu_memcpy", "Memcpy DtoD (Device -> Device)", 5.0),
                ]
            )
        )
    )
    zipped = tmp_path / "rank1.pt.trace.json.gz"
    with gzip.open(zipped, "wt") as fh:
        json.dump(trace([("kernel", "matmul_kernel_persistent", 35.0)]), fh)
    summary = kernel_time_summary([plain, zipped], top=2)
    assert summary["device_events"] == 5
    assert summary["device_us"] == 100.0
    assert summary["categories_us"] == {
        "gdn_prefill": 20.0,
        "gemm": 35.0,
        "memcpy_memset": 5.0,
        "moe": 40.0,
    }
    assert summary["categories_share"]["moe"] == 0.4
    assert summary["categories_launches"] == {
        "gdn_prefill": 1,
        "gemm": 1,
        "memcpy_memset": 1,
        "moe": 2,
    }
    assert summary["top_kernels"] == [
        {
            "name": "fused_moe_kernel",
            "category": "moe",
            "us": 40.0,
            "launches": 2,
            "grids": [{"grid": None, "launches": 2, "us": 40.0}],
        },
        {
            "name": "matmul_kernel_persistent",
            "category": "gemm",
            "us": 35.0,
            "launches": 1,
            "grids": [{"grid": None, "launches": 1, "us": 35.0}],
        },
    ]


def test_a_kernels_launches_split_by_grid_largest_time_first(tmp_path):
    events = [
        ("recurrent_step_kernel", [16, 32, 1], 90.0),
        ("recurrent_step_kernel", [16, 32, 1], 92.0),
        ("recurrent_step_kernel", [2, 32, 1], 12.0),
        ("recurrent_step_kernel", [1, 32, 1], 5.0),
    ]
    path = tmp_path / "rank0.pt.trace.json"
    path.write_text(
        json.dumps(
            {
                "traceEvents": [
                    {
                        "ph": "X",
                        "cat": "kernel",
                        "name": name,
                        "dur": dur,
                        "ts": i,
                        "args": {"grid": grid, "block": [64, 1, 1]},
                    }  # fmt: skip
                    for i, (name, grid, dur) in enumerate(events)
                ]
            }
        )
    )
    kernel = kernel_time_summary([path], top_grids=2)["top_kernels"][0]
    assert kernel["launches"] == 4 and kernel["us"] == 199.0
    assert kernel["grids"] == [
        {"grid": [16, 32, 1], "launches": 2, "us": 182.0},
        {"grid": [2, 32, 1], "launches": 1, "us": 12.0},
    ]


def test_comparison_attributes_the_extra_time_per_category():
    base = {"device_us": 100.0, "categories_us": {"gemm": 60.0, "moe": 40.0}}
    other = {"device_us": 150.0, "categories_us": {"gemm": 100.0, "moe": 40.0, "other": 10.0}}
    assert compare_to(base, other) == {
        "device_us_extra": 50.0,
        "device_time_ratio": 1.5,
        "categories_us_extra": {"gemm": 40.0, "moe": 0.0, "other": 10.0},
    }


def test_the_gpus_idle_time_is_the_span_less_the_union_of_its_activities(tmp_path):
    """Two overlapping kernels count once (a union, not a sum), a gap between activities is
    idle, and each file's span is its own (the gap between two files' runs is not idle)."""
    events = [
        {"ph": "X", "cat": "kernel", "name": "a", "ts": 100.0, "dur": 10.0},
        {"ph": "X", "cat": "kernel", "name": "b", "ts": 105.0, "dur": 10.0},  # overlaps a
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy", "ts": 135.0, "dur": 5.0},  # 20 idle
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0.0, "dur": 500.0},  # host
    ]
    first, second = tmp_path / "one.json", tmp_path / "two.json"
    first.write_text(json.dumps({"traceEvents": events}))
    later = [dict(e, ts=e["ts"] + 10_000.0) for e in events[:2]]  # another run, no gap inside
    second.write_text(json.dumps({"traceEvents": later}))
    one = kernel_time_summary([first])
    assert one["device_us"] == 25.0  # the sum counts the overlap twice
    assert (one["device_busy_us"], one["device_span_us"]) == (20.0, 40.0)
    assert one["device_idle_share"] == 0.5
    both = kernel_time_summary([first, second])
    assert (both["device_busy_us"], both["device_span_us"]) == (35.0, 55.0)
    assert kernel_time_summary([])["device_idle_share"] is None
