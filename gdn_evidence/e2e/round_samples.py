"""An engine benchmark's timed workloads lined up with the samples taken beside the run.

``scripts/h200_engine_evidence.sh`` samples, every 2 s while a stage runs, the GPU (``nvidia-smi
--format=csv``: timestamp, SM and memory clocks, power, temperature, clock event reasons,
utilization) and the host's CPU time (``/proc/stat``'s ``cpu`` line after a Unix time).
``bench_engine.py`` records when each timed workload started (``started_at``, Unix time) and how
long it took (``seconds``) and when it ended (``ended_at``). A workload's window is
``[started_at, ended_at]``; in a report without ``ended_at`` it is ``[started_at, started_at +
seconds]``, which cuts ``itl``'s short by its first, one-token run. For each window this module
gives the GPU samples' utilization and SM clock, the GPU's busy time they imply (``gpu_busy_s``:
the window's length times the samples' mean utilization) and the host's CPU shares over it
(busy, steal, iowait), so that a slow round can be told apart: the GPU idle for longer
(utilization down, busy time as in the other rounds: the host did not feed it), a slower GPU
(clock down), or the GPU busy for longer (more work: preemptions, recomputed prefills).
``utilization.gpu`` is the share of the last sample period (1/6 s to 1 s) in which a kernel ran,
so ``gpu_busy_s`` is an estimate, good to a few per cent over a window of seconds.

``nvidia-smi`` writes its timestamps in the machine's local time, which is UTC on the GPU
machines; ``gpu_offset_s`` shifts them where it is not.
"""

import csv
import statistics
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

NVIDIA_SMI_TIME = "%Y/%m/%d %H:%M:%S.%f"
# /proc/stat's cpu line: user nice system idle iowait irq softirq steal (guest time is in user)
CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


@dataclass(frozen=True)
class GpuSample:
    time: float  # Unix time
    sm_mhz: float
    power_w: float
    utilization: float  # per cent


@dataclass(frozen=True)
class CpuSample:
    time: float  # Unix time
    ticks: dict[str, int]  # cumulative, per CPU_FIELDS


def number(field: str) -> float:
    """``'1980 MHz'`` -> 1980.0, ``'96 %'`` -> 96.0."""
    return float(field.strip().split()[0])


def read_gpu_samples(path: Path, gpu_offset_s: float = 0.0) -> list[GpuSample]:
    """The samples of an ``nvidia-smi --format=csv -l`` file (timestamp, clocks.sm, clocks.mem,
    power.draw, temperature.gpu, clocks_event_reasons.active, utilization.gpu); its header and
    any line that is not a sample (an error message) are skipped."""
    samples = []
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if len(row) < 7:
                continue
            try:
                stamp = datetime.strptime(row[0].strip(), NVIDIA_SMI_TIME)
                sample = GpuSample(
                    time=stamp.replace(tzinfo=timezone.utc).timestamp() + gpu_offset_s,
                    sm_mhz=number(row[1]),
                    power_w=number(row[3]),
                    utilization=number(row[6]),
                )
            except ValueError:
                continue
            samples.append(sample)
    return samples


def read_cpu_samples(path: Path) -> list[CpuSample]:
    """The samples of a file of lines ``<unix time> cpu <user> <nice> <system> <idle> ...``."""
    samples = []
    for line in Path(path).read_text().splitlines():
        parts = line.split()
        if len(parts) < 2 + len(CPU_FIELDS) or parts[1] != "cpu":
            continue
        ticks = dict(zip(CPU_FIELDS, map(int, parts[2 : 2 + len(CPU_FIELDS)]), strict=True))
        samples.append(CpuSample(time=float(parts[0]), ticks=ticks))
    return samples


@dataclass(frozen=True)
class Window:
    round: int
    arm: str
    workload: str
    start: float
    end: float
    seconds: float  # the workload's timed seconds, as the report gives them
    output_tok_s: float | None
    preempted: int | None


def timed_windows(report: dict[str, Any]) -> list[Window]:
    """Every timed workload of a ``bench_engine.py`` report that has ``started_at``, in the
    order they ran."""
    windows = []
    for index, entry in enumerate(report["rounds"]):
        for arm in entry["order"]:
            for workload, payload in entry.get(arm, {}).items():
                if "started_at" not in payload:
                    continue
                windows.append(
                    Window(
                        round=index,
                        arm=arm,
                        workload=workload,
                        start=payload["started_at"],
                        end=payload.get("ended_at", payload["started_at"] + payload["seconds"]),
                        seconds=payload["seconds"],
                        output_tok_s=payload.get("output_tok_s"),
                        preempted=payload.get("preempted"),
                    )
                )
    return sorted(windows, key=lambda w: w.start)


def cpu_shares(samples: list[CpuSample], start: float, end: float) -> dict[str, float] | None:
    """Shares of the host's CPU time between the last sample at or before ``start`` and the
    first at or after ``end``: busy (all but idle and iowait), steal, iowait; None where the
    samples do not cover the window."""
    before = [s for s in samples if s.time <= start]
    after = [s for s in samples if s.time >= end]
    if not before or not after:
        return None
    first, last = before[-1], after[0]
    delta = {k: last.ticks[k] - first.ticks[k] for k in CPU_FIELDS}
    total = sum(delta.values())
    if total <= 0:
        return None
    return {
        "busy": (total - delta["idle"] - delta["iowait"]) / total,
        "steal": delta["steal"] / total,
        "iowait": delta["iowait"] / total,
    }


def window_summary(window: Window, gpu: list[GpuSample], cpu: list[CpuSample]) -> dict[str, Any]:
    """One timed workload with the GPU samples inside its window (count, utilization median and
    minimum, the busy time they imply, SM clock minimum, power median) and the host's CPU shares
    over it."""
    inside = [s for s in gpu if window.start <= s.time <= window.end]
    row: dict[str, Any] = {
        "round": window.round,
        "arm": window.arm,
        "workload": window.workload,
        "started_at": window.start,
        "seconds": round(window.seconds, 3),
        "output_tok_s": None if window.output_tok_s is None else round(window.output_tok_s, 1),
        "preempted": window.preempted,
        "gpu_samples": len(inside),
    }
    if inside:
        utilization = [s.utilization for s in inside]
        row.update(
            utilization_median=statistics.median(utilization),
            utilization_min=min(utilization),
            gpu_busy_s=round((window.end - window.start) * statistics.mean(utilization) / 100, 3),
            sm_mhz_min=min(s.sm_mhz for s in inside),
            power_w_median=round(statistics.median(s.power_w for s in inside), 1),
        )
    shares = cpu_shares(cpu, window.start, window.end)
    if shares is not None:
        row.update({f"cpu_{k}": round(v, 4) for k, v in shares.items()})
    return row


def round_samples(
    report: dict[str, Any], gpu: list[GpuSample], cpu: list[CpuSample]
) -> list[dict[str, Any]]:
    """``window_summary`` of every timed workload of ``report``, in the order they ran."""
    return [window_summary(w, gpu, cpu) for w in timed_windows(report)]
