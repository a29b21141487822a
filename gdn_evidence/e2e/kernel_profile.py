"""Where an engine's device time goes: kernel time by category from torch profiler traces.

vLLM's torch profiler (``profiler_config={"profiler": "torch", ...}``, ``LLM.start_profile``
and ``stop_profile``) writes Chrome traces; every device activity in them (``"cat"`` of
``kernel``, ``gpu_memcpy`` or ``gpu_memset``, CUDA-graph replays included) is summed by the
category its name matches first in ``CATEGORIES``, with its launches counted; each of the top
kernels also says how its launches split by launch grid (the trace's ``args.grid``), so that
two runs' times per launch compare at the same shape. Per trace file, the span from its first
device activity's start to its last one's end and the time in it with at least one activity
running (``device_span_us``, ``device_busy_us``, summed over the files) tell how long the GPU
waited for the host in the profiled run (``device_idle_share``); the profiler slows the host
side, so that share is an upper bound of the unprofiled run's.
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})

# First match wins: the GDN and MoE patterns come before the generic GEMM and norm ones.
CATEGORIES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern, re.IGNORECASE))
    for name, pattern in (
        (
            "gdn_prefill",
            r"chunk_gated_delta|chunk_fwd_kernel_o|chunk_scaled_dot_kkt|solve_tril|merge_16x16"
            r"|recompute_w_u|chunk_local_cumsum|l2norm|fused_gdn_prefill",
        ),
        (
            "gdn_decode",
            r"fused_recurrent|recurrent_step_kernel|fused_sigmoid_gating|packed_decode",
        ),
        ("gdn_conv", r"causal_conv1d|conv_update_kernel"),
        ("gated_norm", r"layer_norm_fwd|rms_norm_gated|gated_rms"),
        ("moe", r"moe|expert|topk_gating|count_and_sort|align_block_size"),
        ("attention", r"attention|attn|reshape_and_cache|paged|flash"),
        ("gemm", r"gemm|cutlass|xmma|nvjet|cublas|matmul|wgmma|sm90_|sm80_|bmm"),
        ("norm", r"rms_norm|layernorm|layer_norm"),
        ("memcpy_memset", r"^Memcpy|^Memset"),
    )
)
OTHER = "other"


def category(name: str) -> str:
    """The category of a device activity's name (``other`` when none matches)."""
    for label, pattern in CATEGORIES:
        if pattern.search(name):
            return label
    return OTHER


def device_events(path: Path) -> Iterable[dict[str, Any]]:
    """The complete device-side events of one Chrome trace (plain or gzipped JSON)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        trace = json.load(fh)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    for event in events:
        if event.get("ph") == "X" and event.get("cat") in DEVICE_CATEGORIES:
            yield event


def grid_of(event: dict[str, Any]) -> tuple[int, ...] | None:
    """The launch grid a device event's ``args`` give (None for copies, or where absent)."""
    grid = (event.get("args") or {}).get("grid")
    return tuple(grid) if isinstance(grid, list) else None


def busy_and_span(intervals: list[tuple[float, float]]) -> tuple[float, float]:
    """(time covered by at least one of the ``(start, end)`` intervals, end of the last minus
    start of the first); (0, 0) for none."""
    if not intervals:
        return 0.0, 0.0
    ordered = sorted(intervals)
    busy, (start, end) = 0.0, ordered[0]
    for first, last in ordered[1:]:
        if first > end:
            busy += end - start
            start, end = first, last
        else:
            end = max(end, last)
    busy += end - start
    return busy, end - ordered[0][0]  # the last merged run ends with the latest interval


def kernel_time_summary(paths: Iterable[Path], top: int = 12, top_grids: int = 4) -> dict[str, Any]:
    """Device time by category over ``paths``: microseconds, launches, shares, and the ``top``
    kernels, each with its launches and its ``top_grids`` grids by time (launches and
    microseconds at each)."""
    by_category: dict[str, float] = {}
    launches_by_category: dict[str, int] = {}
    by_grid: dict[str, dict[tuple[int, ...] | None, list[float]]] = {}  # name: grid: [n, us]
    count = 0
    files = []
    busy_us = span_us = 0.0
    for path in paths:
        files.append(path.name)
        intervals = []
        for event in device_events(path):
            name = event.get("name", "?")
            duration = float(event.get("dur", 0.0))
            cell = by_grid.setdefault(name, {}).setdefault(grid_of(event), [0, 0.0])
            cell[0] += 1
            cell[1] += duration
            count += 1
            start = float(event.get("ts", 0.0))
            intervals.append((start, start + duration))
        busy, span = busy_and_span(intervals)
        busy_us += busy
        span_us += span
    by_name = {name: sum(us for _, us in grids.values()) for name, grids in by_grid.items()}
    launches = {name: sum(n for n, _ in grids.values()) for name, grids in by_grid.items()}
    for name, us in by_name.items():  # one regex search per distinct kernel name
        label = category(name)
        by_category[label] = by_category.get(label, 0.0) + us
        launches_by_category[label] = launches_by_category.get(label, 0) + launches[name]
    total = sum(by_category.values())
    ranked = sorted(by_name.items(), key=lambda item: -item[1])[:top]

    def grids(name: str) -> list[dict[str, Any]]:
        cells = sorted(by_grid[name].items(), key=lambda item: -item[1][1])[:top_grids]
        return [
            {"grid": list(grid) if grid else None, "launches": n, "us": round(us, 1)}
            for grid, (n, us) in cells
        ]

    return {
        "trace_files": files,
        "device_events": count,
        "device_us": round(total, 1),
        "device_span_us": round(span_us, 1),
        "device_busy_us": round(busy_us, 1),
        "device_idle_share": round(1 - busy_us / span_us, 4) if span_us else None,
        "categories_us": {k: round(v, 1) for k, v in sorted(by_category.items())},
        "categories_launches": dict(sorted(launches_by_category.items())),
        "categories_share": {
            k: round(v / total, 4) for k, v in sorted(by_category.items()) if total
        },
        "top_kernels": [
            {
                "name": name[:160],
                "category": category(name),
                "us": round(us, 1),
                "launches": launches[name],
                "grids": grids(name),
            }
            for name, us in ranked
        ],
    }


def compare_to(base: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """Per category, ``other``'s device time minus ``base``'s, in microseconds, and the share
    of ``other``'s extra time each category accounts for."""
    names = sorted(set(base["categories_us"]) | set(other["categories_us"]))
    extra = {
        k: round(other["categories_us"].get(k, 0.0) - base["categories_us"].get(k, 0.0), 1)
        for k in names
    }
    total = other["device_us"] - base["device_us"]
    return {
        "device_us_extra": round(total, 1),
        "device_time_ratio": round(other["device_us"] / base["device_us"], 4)
        if base["device_us"]
        else None,
        "categories_us_extra": extra,
    }
