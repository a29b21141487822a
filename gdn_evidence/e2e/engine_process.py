"""Engines in processes of their own, for the evidence scripts that run several at once.

The orchestrating process starts each engine as ``python -m MODULE --run-engine SPEC --result
PATH`` (:func:`start_engine_process`), with the plugin loaded and the engine core in-process
(:func:`in_process_engine_env`), its output in a log file. In the engine's process
:func:`write_outcome` runs the script's engine function on the JSON spec and writes what it
returned, or the exception it raised, to the result file. :func:`run_engine_processes` keeps a
given number of engines running until every one has exited or the time is up, and hands each
outcome to the script as its engine ends.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from gdn_evidence.e2e.plugin_site import PLUGIN, engine_env

Item = TypeVar("Item")
EngineProcess = tuple[subprocess.Popen, Path, Path]  # (process, result file, log file)
POLL_SECONDS = 1.0


def in_process_engine_env(site: Path, *, mode: str, batch_invariant: bool) -> dict[str, str]:
    """This process's environment with the plugin loaded from ``site`` in ``mode``,
    ``VLLM_BATCH_INVARIANT`` as asked, the engine core in the engine's process (where the
    scripts reach the scheduler and model runner) and vLLM's sampler off FlashInfer."""
    env = engine_env(os.environ, [PLUGIN], site)
    env.update(
        VLLM_BATCH_INVARIANT="1" if batch_invariant else "0",
        VLLM_GDN_INVARIANT_MODE=mode,
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        VLLM_USE_FLASHINFER_SAMPLER="0",
        PYTHONUNBUFFERED="1",
    )
    return env


def start_engine_process(
    module: str, spec: dict[str, Any], env: dict[str, str], prefix: str
) -> EngineProcess:
    """Start ``python -m module --run-engine SPEC --result PATH`` in a new folder named from
    ``prefix``; returns the process, its result file and its log (stdout and stderr)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    result, log = folder / "result.json", folder / "engine.log"
    command = [
        sys.executable,
        "-m",
        module,
        "--run-engine",
        json.dumps(spec),
        "--result",
        str(result),
    ]
    with log.open("w") as sink:
        proc = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT)
    return proc, result, log


def write_outcome(run: Callable[[dict[str, Any]], dict[str, Any]], spec: str, result: Path) -> None:
    """In the engine's process: ``run`` on the JSON ``spec``, its return value written to
    ``result``; an exception is written as ``{"error": ..., "trace": ...}``."""
    try:
        outcome = run(json.loads(spec))
    except Exception as exc:  # noqa: BLE001 - reported to the orchestrator
        outcome = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()}
    result.write_text(json.dumps(outcome))


def run_engine_processes(
    items: Iterable[Item],
    start: Callable[[Item], EngineProcess],
    finished: Callable[[Item, dict[str, Any], str], None],
    *,
    parallel: int,
    timeout: float,
) -> None:
    """Start ``items``' engines in order, ``parallel`` at a time, until every one has exited;
    those still running ``timeout`` seconds after the call are killed. As each ends,
    ``finished(item, outcome, log)``: the JSON its process wrote, else ``{"error": "timed out"}``
    or ``{"error": "exited N"}``, and its log's text."""
    pending = list(items)
    running: list[tuple[Item, subprocess.Popen, Path, Path]] = []
    deadline = time.monotonic() + timeout
    while pending or running:
        while pending and len(running) < parallel:
            item = pending.pop(0)
            running.append((item, *start(item)))
        time.sleep(POLL_SECONDS)
        for entry in list(running):
            item, proc, result, log = entry
            timed_out = time.monotonic() > deadline
            if proc.poll() is None and not timed_out:
                continue
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            outcome = (
                json.loads(result.read_text())
                if result.exists()
                else {"error": "timed out" if timed_out else f"exited {proc.returncode}"}
            )
            finished(item, outcome, log.read_text(errors="replace"))
            running.remove(entry)


def write_json(path: Path, provenance: dict[str, Any], cases: list[dict[str, Any]]) -> None:
    """The scripts' evidence file: ``{"provenance": ..., "cases": [...]}``."""
    path.write_text(json.dumps({"provenance": provenance, "cases": cases}, indent=1))
