"""The JSONL records of the shadow checker and the per-process file they go to.

A check record (``"kind": "check"``), one per layer, step and reference::

    {"kind": "check", "time": 1733200000.123, "pid": 4242, "process": "VllmWorker-0",
     "layer": "model.layers.0.linear_attn", "step": 17, "step_kind": "mixed",
     "provider": "routed", "mode": "route", "reference": "golden",
     "reference_impl": "golden-kernels",
     "state_dtype": "float32", "conv_state_dtype": "bfloat16", "rows": 4,
     "decode_rows": 12, "snapshot_bytes": 8405120,
     "output": {"compared": ..., "differing": ..., "max_abs_diff": ..., "max_ulp": ...,
                "nan_mismatches": ..., "ulp_histogram": {"0": ..., "1": ..., ...}},
     "recurrent_state": {...}, "conv_state": {...}}

``step_kind`` is ``decode`` (a decode-only step) or ``mixed`` (decode rows beside prefills);
``provider`` says what served the rows (checker.py), ``reference_impl`` what computed the
reference (``goldens``, ``golden-kernels`` or ``vllm-decode-only``: reference.py);
``step`` counts this process's steps.
A failure record (``"kind": "failure"``) has time, pid, process, ``stage`` and ``error``.
This module imports neither torch nor vLLM (the ``report`` command reads records with it).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm_gdn_invariant.shadow.compare import FieldStats

FIELDS = ("output", "recurrent_state", "conv_state")  # the fields of a check, in order


def process_fields() -> dict[str, Any]:
    return {
        "time": round(time.time(), 6),
        "pid": os.getpid(),
        "process": multiprocessing.current_process().name,
    }


def check_record(
    *,
    layer: str,
    step: int,
    step_kind: str,
    provider: str,
    mode: str,
    reference: str,
    reference_impl: str,
    state_dtype: str,
    conv_state_dtype: str,
    rows: int,
    decode_rows: int,
    snapshot_bytes: int,
    stats: dict[str, FieldStats],
) -> dict[str, Any]:
    record: dict[str, Any] = {"kind": "check", **process_fields()}
    record.update(
        layer=layer,
        step=step,
        step_kind=step_kind,
        provider=provider,
        mode=mode,
        reference=reference,
        reference_impl=reference_impl,
        state_dtype=state_dtype,
        conv_state_dtype=conv_state_dtype,
        rows=rows,
        decode_rows=decode_rows,
        snapshot_bytes=snapshot_bytes,
    )
    for name in FIELDS:
        record[name] = stats[name].to_json()
    return record


def failure_record(stage: str, error: str) -> dict[str, Any]:
    return {"kind": "failure", **process_fields(), "stage": stage, "error": error}


class JsonlWriter:
    """Appends records to this process's file (``path_for(pid)``), opened on first write and
    reopened when the process's pid changes (a fork)."""

    def __init__(self, path_for) -> None:
        self._path_for = path_for
        self._file: IO[str] | None = None
        self._pid: int | None = None
        self._lock = threading.Lock()

    @property
    def path(self) -> Path:
        return Path(self._path_for(os.getpid()))

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":")) + "\n"
        with self._lock:
            if self._file is None or self._pid != os.getpid():
                self._pid = os.getpid()
                self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
            self._file.write(line)
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """The records of one JSONL file; raises ValueError naming the file and line of a bad one."""
    records = []
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not JSON ({exc.msg})") from None
            if not isinstance(record, dict) or "kind" not in record:
                raise ValueError(f"{path}:{number}: not a shadow record")
            records.append(record)
    return records
