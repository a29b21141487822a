"""The engine benchmark's timed workloads lined up with the GPU and CPU samples of its stage:
each window gets its own samples only, nvidia-smi's header and error lines are skipped, and the
CPU shares come from the samples around the window."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from gdn_evidence.e2e.round_samples import (
    CPU_FIELDS,
    cpu_shares,
    read_cpu_samples,
    read_gpu_samples,
    round_samples,
)

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_800_000_000.0  # Unix time of the first sample
HEADER = (
    "timestamp, clocks.current.sm [MHz], clocks.current.memory [MHz], power.draw [W], "
    "temperature.gpu, clocks_event_reasons.active, utilization.gpu [%]"
)
# (arm, start offset, seconds) of each round's decode, arms alternating
WINDOWS = [("route", 10.0, 9.0), ("golden", 20.0, 9.0), ("golden", 30.0, 9.0), ("route", 40.0, 9.0)]
SLOW = ("golden", 20.0)  # the window where the GPU idles and the host's time is stolen


def smi_line(t: float, utilization: int, sm_mhz: int = 1980) -> str:
    stamp = datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
    return f"{stamp}, {sm_mhz} MHz, 2619 MHz, 500.00 W, 40, 0x0000000000000000, {utilization} %"


def slow_at(t: float) -> bool:
    return SLOW[1] <= t - T0 <= SLOW[1] + 9.0


def write_samples(folder: Path) -> tuple[Path, Path]:
    gpu_lines = [HEADER, "Unable to determine the device handle for GPU: Unknown Error"]
    cpu_lines, steal, busy, idle = [], 0, 0, 0
    for i in range(26):  # every 2 s over 50 s
        t = T0 + 2 * i
        gpu_lines.append(smi_line(t, 55 if slow_at(t) else 98))
        ticks = dict.fromkeys(CPU_FIELDS, 0)
        ticks.update(user=busy, idle=idle, steal=steal)
        cpu_lines.append(f"{t:.6f} cpu " + " ".join(str(ticks[k]) for k in CPU_FIELDS) + " 0 0")
        steal += 50 if slow_at(t) and slow_at(t + 2) else 0
        busy, idle = busy + 150, idle + 1400
    (folder / "gpu.csv").write_text("\n".join(gpu_lines) + "\n")
    (folder / "cpu.txt").write_text("\n".join(cpu_lines) + "\n")
    return folder / "gpu.csv", folder / "cpu.txt"


def report() -> dict:
    rounds = []
    for i in range(0, len(WINDOWS), 2):
        entry: dict = {"order": [WINDOWS[i][0], WINDOWS[i + 1][0]]}
        for arm, start, seconds in WINDOWS[i : i + 2]:
            entry[arm] = {
                "decode": {
                    "seconds": seconds,
                    "output_tok_s": 1000.0 / seconds,
                    "started_at": T0 + start,
                    "preempted": 3 if (arm, start) == SLOW else 0,
                }
            }
        rounds.append(entry)
    return {"rounds": rounds}


def test_each_window_gets_only_its_own_gpu_samples(tmp_path):
    gpu_path, cpu_path = write_samples(tmp_path)
    rows = round_samples(report(), read_gpu_samples(gpu_path), read_cpu_samples(cpu_path))
    assert [(r["arm"], r["started_at"] - T0) for r in rows] == [(a, s) for a, s, _ in WINDOWS]
    assert [r["gpu_samples"] for r in rows] == [5, 5, 5, 5]
    by_start = {r["started_at"] - T0: r for r in rows}
    assert by_start[SLOW[1]]["utilization_median"] == 55
    assert by_start[SLOW[1]]["preempted"] == 3
    others = [r for s, r in by_start.items() if s != SLOW[1]]
    assert all(r["utilization_min"] == 98 for r in others)  # none of the slow window's samples
    # busy = window length x mean utilization, rounded to the ms as reported
    assert by_start[SLOW[1]]["gpu_busy_s"] == round(9.0 * 55 / 100, 3)
    assert all(r["gpu_busy_s"] == round(9.0 * 98 / 100, 3) for r in others)


def test_shifted_clock_moves_the_samples_out_of_their_window(tmp_path):
    """The negative control: the same samples an hour off (a machine not on UTC) fall in no
    window."""
    gpu_path, cpu_path = write_samples(tmp_path)
    rows = round_samples(report(), read_gpu_samples(gpu_path, 3600.0), read_cpu_samples(cpu_path))
    assert [r["gpu_samples"] for r in rows] == [0, 0, 0, 0]
    assert all("utilization_median" not in r for r in rows)


def test_nvidia_smi_header_and_error_lines_are_skipped(tmp_path):
    gpu_path, _ = write_samples(tmp_path)
    samples = read_gpu_samples(gpu_path)
    assert len(samples) == 26
    assert samples[0].time == T0 and samples[0].sm_mhz == 1980 and samples[0].power_w == 500.0


def test_cpu_steal_shows_in_the_slow_window_only(tmp_path):
    _, cpu_path = write_samples(tmp_path)
    rows = round_samples(report(), [], read_cpu_samples(cpu_path))
    steal = {r["started_at"] - T0: r["cpu_steal"] for r in rows}
    assert steal[SLOW[1]] > 0.02
    assert all(v == 0 for s, v in steal.items() if s != SLOW[1])
    assert all(0.05 < r["cpu_busy"] < 0.15 for r in rows)


def test_cpu_shares_need_samples_on_both_sides_of_the_window(tmp_path):
    _, cpu_path = write_samples(tmp_path)
    samples = read_cpu_samples(cpu_path)
    assert cpu_shares(samples, T0 - 1.0, T0 + 10.0) is None
    assert cpu_shares(samples, T0 + 40.0, T0 + 60.0) is None
    assert cpu_shares(samples, T0, T0 + 10.0) is not None


@pytest.mark.parametrize("with_start", [True, False])
def test_script_prints_a_line_per_timed_workload(tmp_path, with_start):
    gpu_path, cpu_path = write_samples(tmp_path)
    data = report()
    if not with_start:
        for entry in data["rounds"]:
            for arm in entry["order"]:
                del entry[arm]["decode"]["started_at"]
    (tmp_path / "report.json").write_text(json.dumps(data))
    rows_path = tmp_path / "rows.json"
    command = [sys.executable, str(ROOT / "scripts" / "engine_round_samples.py")]
    command += [str(tmp_path / "report.json"), "--gpu", str(gpu_path), "--cpu", str(cpu_path)]
    done = subprocess.run(
        [*command, "--json", str(rows_path)], capture_output=True, text=True, check=False
    )
    if with_start:
        assert done.returncode == 0, done.stderr
        assert len(done.stdout.splitlines()) == 1 + len(WINDOWS)
        assert len(json.loads(rows_path.read_text())) == len(WINDOWS)
    else:
        assert done.returncode == 1
        assert "no timed workload has started_at" in done.stdout


def test_a_window_ends_at_ended_at_where_the_report_has_it(tmp_path):
    """itl's answer times its second run alone (``seconds``); ``ended_at`` closes its window
    after both runs, so the samples of its first run are counted too."""
    gpu_path, _ = write_samples(tmp_path)
    data = report()
    first = data["rounds"][0][WINDOWS[0][0]]["decode"]
    first["ended_at"] = first["started_at"] + first["seconds"] + 4.0  # two more samples
    rows = round_samples(data, read_gpu_samples(gpu_path), [])
    assert [r["gpu_samples"] for r in rows] == [7, 5, 5, 5]
    assert rows[0]["seconds"] == first["seconds"]
    assert rows[0]["gpu_busy_s"] == round(13.0 * statistics.mean([98] * 5 + [55] * 2) / 100, 3)
