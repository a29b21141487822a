"""Engine benchmark: throughput and inter-token latency, arms alternating in one run.

The engines live side by side on the GPU, each in its own process (the plugin patches the
process it loads in): ``vllm`` (vLLM alone, batch-invariant mode off), ``route`` (the plugin,
mode route, batch-invariant mode off), ``bi`` (the plugin with ``VLLM_BATCH_INVARIANT=1``) and
``golden`` (the plugin in mode golden, batch-invariant mode off), the arms ``--arms`` names.
Each engine runs every workload once untimed after it starts, and the first round begins
once every engine has answered that its warm-up is done (``warm_wait_seconds`` per engine:
how long the run waited for it), so that no timed round shares the GPU with another engine's
warm-up; ``--settle-rounds N`` then runs N rounds that are not timed (``settle_rounds``), so
that no engine's first timed run is its first after the warm-ups. They run the same workloads
in rounds, the order rotating every round, so that every arm sees the same machine conditions;
medians over rounds are reported with the ratios ``route / vllm`` (target >= 0.99 in
throughput), ``bi / vllm`` (target: overhead below
SGLang's reported 34 %) and ``golden / route`` (target >= 0.99 in decode throughput), and the
same ratios round by round with their spread. A target is ``met`` only when every round's ratio
clears it, ``not met`` when none does, and ``inconclusive`` otherwise.
``--resummarize FILE`` recomputes a report's summary from its recorded rounds with this code
and records that it did (``summary_recomputed``).

Workloads, per arm and round:

* ``throughput``: 128 prompts of 64 to 1024 tokens, 128 new tokens each, all at once
  (chunked prefill, mixed steps, then decode); output and total tokens per second.
* ``prefill``: the same prompts, 1 new token: the prefill share of ``throughput``.
* ``itl``: 32 prompts of 64 tokens; inter-token latency = (time for 257 new tokens - time
  for 1) / 256, decode-only steps at batch 32.
* ``decode`` (decode-heavy): 128 prompts of 64 tokens, 512 new tokens each
  (``--decode-new-tokens``), all at once; output tokens per second.

``--workloads`` picks them (default ``throughput,prefill,itl``); a ratio or target whose
workload did not run is left out. Each timed workload's answer carries ``started_at`` and
``ended_at`` (Unix time, to line it up with GPU samples taken beside the run) and, with
``--log-stats`` (vLLM's
engine stats on, as ``vllm serve`` has them), ``preempted``: the requests its engine preempted
during it. Each engine's entry in ``engines`` keeps vLLM's line with its KV cache capacity
(``kv_cache``). ``spread`` in ``ratio_spread`` is a round ratio's range over
its median, ``(max - min) / median``, reported with the rounds' count, the median and a
distribution-free 95 % interval for it (``median_interval``). ``--pin-cpus`` runs each
engine's processes on a disjoint share of the CPUs (``pinned_cpus`` in the provenance's engine
spec).

With ``--profile`` (``throughput``, or ``decode``: the decode prompts with
``PROFILE_DECODE_NEW_TOKENS`` new tokens), after the rounds each arm runs that workload once
more under vLLM's torch profiler, and the report gives its device time by kernel category
(``e2e/kernel_profile.py``; with the share of the run's device span in which the GPU ran
nothing, ``device_idle_share``) and, for every other arm, the extra time per category against
``vllm`` (or ``route`` where vLLM alone did not run): where the time goes. The profiler is
configured at engine start and runs only for those profiled runs. ``--profile-rounds N`` runs
N of them per arm, arms alternating, and gives each arm's device time over the base arm's
round by round with its spread: a ratio the host's noise does not move.

The model has Qwen3-Next's GDN dimensions per layer (16 key heads, 32 value heads, 128-dim
heads, 4-wide conv) with fewer layers and experts (``BENCH_QWEN3_NEXT``), and dummy weights: the
time goes to the same kernels as the full model's GDN layers. ``--num-layers`` sets its layers
(Qwen3-Next's 48 make a step's device time a larger share of the step than the bench model's 8).
``--max-num-seqs`` sets vLLM's ``max_num_seqs`` (recorded in the provenance's engine spec): a
deep model's engine refuses to start where vLLM's default exceeds its Mamba cache blocks.

An engine that exits, answers FAILED or gives no answer in ``--op-timeout`` during the wait
for the warm-ups, the rounds or the profile ends the run: its entry in ``engines`` records
``status`` (``DIED``, ``FAILED`` or ``TIMEOUT``), the ``op`` and ``round`` it was asked (round
0: the wait for its warm-up or a settling round), its ``returncode`` where it has exited, the
``error``, the ``root_cause`` line and the last lines of its log (``log_tail``); the
rounds finished before it and their summary stay, one line on stderr names it, and the exit
status is 1.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import operator
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gdn_evidence.e2e.determinism import plugin_lines, root_cause
from gdn_evidence.e2e.engine_options import add_engine_arguments, engine_options
from gdn_evidence.e2e.kernel_profile import compare_to, kernel_time_summary
from gdn_evidence.e2e.plugin_site import PLUGIN, engine_env, plugin_site
from gdn_evidence.e2e.ranks import CPU_BINDING_ENV, check_tensor_parallel
from gdn_evidence.harness import provenance
from gdn_evidence.harness.scratch import scratch_folder
from vllm_gdn_invariant.models.tiny import (
    BENCH_QWEN3_NEXT,
    TINY_QWEN3_NEXT,
    words,
    write_tiny_model,
)
from vllm_gdn_invariant.models.weighted import sharding_problems
from vllm_gdn_invariant.plugin.config import MODE_ENV

PROTOCOL = "GDNBENCH "
ARMS = {
    "vllm": {"plugins": [], "batch_invariant": False},
    "route": {"plugins": [PLUGIN], "batch_invariant": False},
    "bi": {"plugins": [PLUGIN], "batch_invariant": True},
    "golden": {"plugins": [PLUGIN], "batch_invariant": False, "mode": "golden"},
}
WORKLOADS = ("throughput", "prefill", "itl", "decode")
DEFAULT_WORKLOADS = ("throughput", "prefill", "itl")
THROUGHPUT_PROMPTS = 128
THROUGHPUT_NEW_TOKENS = 128
ITL_PROMPTS = 32
ITL_NEW_TOKENS = 256
DECODE_PROMPTS = 128
DECODE_NEW_TOKENS = 512
MAX_DECODE_NEW_TOKENS = 1792  # with the prompt's tokens, within max_model_len (2048)
PROFILE_WORKLOADS = ("throughput", "decode")
PROFILE_DECODE_NEW_TOKENS = 128  # a profiled decode run: the decode prompts, this many tokens
WARMED = "warmed"  # the op an engine answers once its warm-ups are done
PREEMPTIONS = "vllm:num_preemptions"  # vLLM's counter of preempted requests
KV_CACHE_LINE = "KV cache size"  # vLLM's startup line with the KV cache's capacity


def throughput_prompts() -> list[str]:
    lengths = [64 + (i * 379) % 961 for i in range(THROUGHPUT_PROMPTS)]  # 64..1024
    return [words(n, start=13 * i) for i, n in enumerate(lengths)]


def kv_cache_lines(log: str) -> list[str]:
    """vLLM's lines of an engine's ``log`` with its KV cache capacity (tokens, and the
    concurrency it allows at the model's length)."""
    return [line.strip() for line in log.splitlines() if KV_CACHE_LINE in line][:2]


def preemption_count(metrics: list[Any]) -> int:
    """The requests vLLM preempted, from ``LLM.get_metrics()``: the sum of its
    ``vllm:num_preemptions`` counters (one per engine core)."""
    return sum(int(m.value) for m in metrics if m.name == PREEMPTIONS)


# --- an engine, in its own process --------------------------------------------------------


def serve(spec: dict[str, Any]) -> None:
    """Start the engine, say READY, then run the workloads the parent sends on stdin."""
    from vllm import LLM, SamplingParams

    def say(kind: str, payload: dict[str, Any]) -> None:
        print(PROTOCOL + kind + " " + json.dumps(payload), flush=True)

    started = time.monotonic()
    profile_dir = profile_folder(spec)
    try:
        llm = LLM(**serve_kwargs(spec))
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        say("FAILED", {"error": f"{type(exc).__name__}: {exc}"})
        return
    say("READY", {"start_seconds": round(time.monotonic() - started, 1)})
    scale = spec.get("scale", 1)  # --tiny: a CPU smoke run of the same protocol
    long_prompts = throughput_prompts()[: THROUGHPUT_PROMPTS // scale]
    short_prompts = [words(64, start=7 * i) for i in range(ITL_PROMPTS // scale)]
    decode_prompts = [words(64, start=11 * i) for i in range(DECODE_PROMPTS // scale)]
    new_tokens, itl_tokens = THROUGHPUT_NEW_TOKENS // scale, ITL_NEW_TOKENS // scale
    decode_tokens = spec.get("decode_new_tokens", DECODE_NEW_TOKENS) // scale

    def timed(prompts: list[str], new_tokens: int) -> tuple[float, int]:
        params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
        t0 = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - t0
        return seconds, sum(len(o.outputs[0].token_ids) for o in outputs)

    def preemptions() -> int | None:
        """The engine's preempted requests so far (vLLM's ``vllm:num_preemptions``), None
        without its stats."""
        if not spec.get("log_stats"):
            return None
        return preemption_count(llm.get_metrics())

    profiled: set[Path] = set()
    timed(long_prompts, new_tokens)  # warm-up: every shape the timed workloads reach
    timed(short_prompts, itl_tokens + 1)
    if "decode" in spec.get("workloads", DEFAULT_WORKLOADS):
        timed(decode_prompts, decode_tokens)
    for line in sys.stdin:
        op = line.strip()
        if op == "quit":
            break
        if op == WARMED:  # read only after the warm-ups above
            say(op, {})
            continue
        started_at, preempted_before = time.time(), preemptions()
        if op == "throughput":
            seconds, new = timed(long_prompts, new_tokens)
            total = new + sum(len(p.split()) for p in long_prompts)
            payload = {
                "seconds": seconds,
                "output_tok_s": new / seconds,
                "total_tok_s": total / seconds,
            }
        elif op == "prefill":
            seconds, _ = timed(long_prompts, 1)
            payload = {"seconds": seconds}
        elif op == "decode":
            seconds, new = timed(decode_prompts, decode_tokens)
            payload = {"seconds": seconds, "output_tok_s": new / seconds}
        elif op == "profile" and profile_dir is not None:
            if spec.get("profile_workload", "throughput") == "decode":
                prompts, tokens = decode_prompts, PROFILE_DECODE_NEW_TOKENS // scale
            else:
                prompts, tokens = long_prompts, new_tokens
            llm.start_profile()
            seconds, _ = timed(prompts, tokens)
            llm.stop_profile()
            traces = trace_files(profile_dir, earlier=frozenset(profiled))
            profiled.update(traces)  # a later profile reads its own traces only
            payload = {"seconds": seconds, **kernel_time_summary(traces)}
        elif op == "itl":
            first, _ = timed(short_prompts, 1)
            full, _ = timed(short_prompts, itl_tokens + 1)
            payload = {"itl_ms": 1000 * (full - first) / itl_tokens, "seconds": full}
        else:
            say("FAILED", {"error": f"unknown op {op!r}"})
            continue
        payload["started_at"] = round(started_at, 3)  # Unix time: lines up with GPU samples
        payload["ended_at"] = round(time.time(), 3)  # itl's two runs: longer than its seconds
        if preempted_before is not None:
            payload["preempted"] = preemptions() - preempted_before
        say(op, payload)


def profile_folder(spec: dict[str, Any]) -> Path | None:
    """The folder of an engine's profiler traces, None where it does not profile."""
    return Path(spec["profile_root"], spec["arm"]) if spec.get("profile_root") else None


def serve_kwargs(spec: dict[str, Any]) -> dict[str, Any]:
    """The ``LLM`` keyword arguments of an engine's ``spec``: dummy weights, its TP size, CUDA
    graphs, backends, memory share, KV cache, ``max_num_seqs`` where the spec has one (else
    vLLM's default), and the torch profiler where it profiles."""
    kwargs: dict[str, Any] = dict(
        model=spec["model_dir"],
        load_format="dummy",
        tensor_parallel_size=spec["tensor_parallel_size"],
        max_model_len=2048,
        enforce_eager=not spec["cuda_graphs"],
        enable_prefix_caching=False,
        seed=0,
        **engine_options(
            spec["attention_backend"],
            spec["prefill_backend"],
            spec["gpu_memory_utilization"],
            spec["kv_cache_gib"],
        ),
    )
    if spec.get("max_num_seqs"):
        kwargs["max_num_seqs"] = spec["max_num_seqs"]
    if spec.get("log_stats"):
        kwargs["disable_log_stats"] = False
    profile_dir = profile_folder(spec)
    if profile_dir is not None:
        kwargs["profiler_config"] = {
            "profiler": "torch",
            "torch_profiler_dir": str(profile_dir),
            "torch_profiler_with_stack": False,
            "torch_profiler_use_gzip": False,
            "ignore_frontend": True,
        }
    return kwargs


def trace_files(folder: Path, settle: float = 60.0, earlier: frozenset = frozenset()) -> list[Path]:
    """The traces under ``folder`` but ``earlier``'s, once there are some and their sizes stop
    changing (at most ``settle`` s)."""
    deadline = time.monotonic() + settle
    sizes: dict[Path, int] = {}
    while True:
        now = {
            p: p.stat().st_size for p in folder.rglob("*.json*") if p.is_file() and p not in earlier
        }
        if (now and now == sizes) or time.monotonic() > deadline:
            return sorted(now)
        sizes = now
        time.sleep(2.0)


# --- the parent -----------------------------------------------------------------------------


def arm_env(arm: str, spec: dict[str, Any], site: Path) -> dict[str, str]:
    """The environment of ``arm``'s engine process: its plugins, batch-invariant mode and, for
    a plugin arm with a mode of its own, ``VLLM_GDN_INVARIANT_MODE``."""
    env = engine_env(os.environ, ARMS[arm]["plugins"], site)
    env["VLLM_BATCH_INVARIANT"] = "1" if ARMS[arm]["batch_invariant"] else "0"
    if "mode" in ARMS[arm]:
        env[MODE_ENV] = ARMS[arm]["mode"]
    env.setdefault("PYTHONUNBUFFERED", "1")
    if spec.get("cpu_thread_binding"):
        env[CPU_BINDING_ENV] = spec["cpu_thread_binding"]
    return env


def cpu_sets(available: set[int], count: int) -> list[list[int]]:
    """``available`` split into ``count`` disjoint sets of consecutive CPUs, as even as they
    go (the first ones one CPU larger); one engine's processes each."""
    cpus = sorted(available)
    if count < 1 or len(cpus) < count:
        raise ValueError(f"{len(cpus)} CPUs cannot give {count} engines one CPU each")
    size, extra = divmod(len(cpus), count)
    sets, start = [], 0
    for i in range(count):
        end = start + size + (1 if i < extra else 0)
        sets.append(cpus[start:end])
        start = end
    return sets


def pin_to(cpus: list[int] | None) -> Callable[[], None] | None:
    """A ``preexec_fn`` that runs the child (and every process it starts) on ``cpus``; None
    for no pinning."""
    if cpus is None:
        return None
    return functools.partial(os.sched_setaffinity, 0, cpus)


LOG_TAIL_LINES = 40
LOST_STATUS = {"EXIT": "DIED", "FAILED": "FAILED", "TIMEOUT": "TIMEOUT"}


class EngineLost(RuntimeError):
    """An engine that gave no answer to ``op``: ``status`` DIED (it exited, or its stdin is
    closed), FAILED (it answered FAILED) or TIMEOUT; the round it was asked in (1-based, set by
    :func:`ask_round`), its return code where it has exited, the error, and its log's root
    cause and last :data:`LOG_TAIL_LINES` lines."""

    def __init__(
        self, arm: str, op: str, status: str, returncode: int | None, error: str | None, log: str
    ) -> None:
        super().__init__(arm, op, status)
        self.arm, self.op, self.status = arm, op, status
        self.returncode, self.error = returncode, error
        self.round: int | None = None
        self.root_cause = root_cause(log)
        self.log_tail = log.splitlines()[-LOG_TAIL_LINES:]

    def record(self) -> dict[str, Any]:
        """The report's fields for the lost engine."""
        return {
            "status": self.status,
            "op": self.op,
            "round": self.round,
            "returncode": self.returncode,
            "error": self.error,
            "root_cause": self.root_cause,
            "log_tail": self.log_tail,
        }

    def __str__(self) -> str:
        cause = self.root_cause or self.error or "no error line in its log"
        return (
            f"engine {self.arm} {self.status} at op {self.op!r} in round {self.round} "
            f"(return code {self.returncode}): {cause}"
        )


def serve_command(arm: str, spec: dict[str, Any]) -> list[str]:
    """The command line of ``arm``'s engine process: this module serving ``spec``."""
    return [
        sys.executable,
        "-m",
        "gdn_evidence.e2e.bench",
        "--serve",
        json.dumps({**spec, "arm": arm}),
    ]


class Engine:
    """One arm's engine process and its protocol lines."""

    def __init__(
        self,
        arm: str,
        spec: dict[str, Any],
        site: Path,
        log: Path,
        cpus: list[int] | None = None,
        command: list[str] | None = None,
    ) -> None:
        """``cpus``: the CPUs the engine's processes run on (all of them inherit it);
        ``command``: the process's command line (default :func:`serve_command`)."""
        self.arm = arm
        env = arm_env(arm, spec, site)
        self.log = log.open("w")
        self.proc = subprocess.Popen(
            command or serve_command(arm, spec),
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            preexec_fn=pin_to(cpus),
        )
        self.lines: list[tuple[str, dict[str, Any]]] = []
        self.cond = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.cond:
                if line.startswith(PROTOCOL):
                    kind, _, payload = line[len(PROTOCOL) :].partition(" ")
                    self.lines.append((kind, json.loads(payload)))
                else:
                    try:  # vLLM logs to stdout: its errors belong in the log
                        self.log.write(line)
                        self.log.flush()
                    except ValueError:  # closed by stop()
                        pass
                self.cond.notify_all()
        with self.cond:
            self.lines.append(("EXIT", {"returncode": self.proc.wait()}))
            self.cond.notify_all()

    def wait_for(self, kinds: set[str], timeout: float) -> tuple[str, dict[str, Any]]:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for i, (kind, payload) in enumerate(self.lines):
                    if kind in kinds or kind in ("FAILED", "EXIT"):
                        del self.lines[i]
                        return kind, payload
                left = deadline - time.monotonic()
                if left <= 0:
                    return "TIMEOUT", {"error": f"no answer in {timeout:.0f} s"}
                self.cond.wait(left)

    def ask(self, op: str, timeout: float) -> dict[str, Any]:
        """The engine's answer to ``op``; :class:`EngineLost` where it gives none."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(op + "\n")
            self.proc.stdin.flush()
        except OSError as exc:  # BrokenPipeError: the process has exited
            self.reader.join(10.0)  # its last output, in the log
            raise self.lost(op, "DIED", {"error": f"{type(exc).__name__}: {exc}"}) from None
        kind, payload = self.wait_for({op}, timeout)
        if kind != op:
            raise self.lost(op, LOST_STATUS.get(kind, kind), payload)
        return payload

    def log_text(self) -> str:
        """What the engine's processes have written to its log so far."""
        with self.cond:
            self.log.flush()
        return Path(self.log.name).read_text(errors="replace")

    def lost(self, op: str, status: str, payload: dict[str, Any]) -> EngineLost:
        """:class:`EngineLost` for ``op`` from the engine's answer ``payload`` and its log."""
        returncode = payload.get("returncode", self.proc.poll())
        return EngineLost(self.arm, op, status, returncode, payload.get("error"), self.log_text())

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:  # a write the exited process never read
            pass
        self.log.close()


def median(values: list[float]) -> float:
    return statistics.median(values)


METRICS = {  # name in the summary: (workload, field)
    "output_tok_s": ("throughput", "output_tok_s"),
    "total_tok_s": ("throughput", "total_tok_s"),
    "throughput_seconds": ("throughput", "seconds"),
    "prefill_seconds": ("prefill", "seconds"),
    "itl_ms": ("itl", "itl_ms"),
    "decode_tok_s": ("decode", "output_tok_s"),
}
TARGETS = {  # name: (arm, per-round ratio, threshold, whether a value clears it)
    "route_throughput_at_least_0.99x": ("route", "throughput_vs_vllm", 0.99, operator.ge),
    "bi_throughput_overhead_below_34_percent": ("bi", "throughput_overhead", 0.34, operator.lt),
    "golden_decode_throughput_at_least_0.99x_route": (
        "golden",
        "decode_throughput_vs_route",
        0.99,
        operator.ge,
    ),
}
TARGET_RULE = (
    "met: every round's ratio clears the threshold; not met: none does; inconclusive: the "
    "rounds' ratios fall on both sides"
)


def flat(done: dict[str, Any]) -> dict[str, float]:
    """One arm's round as the summary's metric names (those of the workloads it ran)."""
    return {
        name: done[workload][field]
        for name, (workload, field) in METRICS.items()
        if workload in done
    }


def arm_ratios(arm: dict[str, Any], base: dict[str, Any]) -> dict[str, float]:
    """One arm's ratios to vLLM alone from values of the same kind (one round's, or medians),
    for the metrics both have."""
    ratios = {}
    if "output_tok_s" in arm and "output_tok_s" in base:
        ratios["throughput_vs_vllm"] = arm["output_tok_s"] / base["output_tok_s"]
        ratios["throughput_overhead"] = 1 / ratios["throughput_vs_vllm"] - 1
    if "prefill_seconds" in arm and "prefill_seconds" in base:
        ratios["prefill_time_vs_vllm"] = arm["prefill_seconds"] / base["prefill_seconds"]
    if "itl_ms" in arm and "itl_ms" in base:
        ratios["itl_vs_vllm"] = arm["itl_ms"] / base["itl_ms"]
        ratios["itl_overhead"] = ratios["itl_vs_vllm"] - 1
    if "decode_tok_s" in arm and "decode_tok_s" in base:
        ratios["decode_throughput_vs_vllm"] = arm["decode_tok_s"] / base["decode_tok_s"]
    return ratios


def golden_ratios(golden: dict[str, Any], route: dict[str, Any]) -> dict[str, float]:
    """Mode golden's ratios to mode route (one round's values, or medians), for the metrics
    both have."""
    pairs = {
        "decode_throughput_vs_route": "decode_tok_s",
        "throughput_vs_route": "output_tok_s",
        "itl_vs_route": "itl_ms",
    }
    return {
        ratio: golden[metric] / route[metric]
        for ratio, metric in pairs.items()
        if metric in golden and metric in route
    }


# Each compared arm: the arm it is compared with and the ratios of the comparison.
BASES = {
    "route": ("vllm", arm_ratios),
    "bi": ("vllm", arm_ratios),
    "golden": ("route", golden_ratios),
}


MEDIAN_CONFIDENCE = 0.95


def median_interval(values: list[float], confidence: float = MEDIAN_CONFIDENCE) -> dict[str, Any]:
    """A distribution-free interval for the median of the rounds' population: the order
    statistics [x_(k), x_(n+1-k)] with the largest k whose coverage, 1 - 2 P(Bin(n, 1/2) < k),
    is at least ``confidence`` (rounds independent, each as likely above the median as below).
    ``interval`` is None when even the whole range covers less (n < 6 at 95 %)."""
    n = len(values)
    ordered = sorted(values)

    def coverage(k: int) -> float:
        return 1.0 - 2.0 * sum(math.comb(n, i) for i in range(k)) / 2.0**n

    ks = [k for k in range(1, n // 2 + 1) if coverage(k) >= confidence]
    if not ks:
        return {"interval": None, "coverage": coverage(1) if n else 0.0, "confidence": confidence}
    k = max(ks)
    return {
        "interval": [ordered[k - 1], ordered[n - k]],
        "coverage": coverage(k),
        "confidence": confidence,
    }


def ratio_spread(values: list[float]) -> dict[str, Any]:
    """A round ratio's range over its median, the rounds it was measured in, their median and
    a distribution-free interval for it (``median_interval``)."""
    middle = median(values)
    return {
        "spread": (max(values) - min(values)) / middle,
        "rounds": len(values),
        "median": middle,
        "median_interval": median_interval(values),
    }


def verdict(values: list[float], threshold: float, clears: Callable[[float, float], bool]) -> str:
    """``met`` when every value clears ``threshold``, ``not met`` when none does, otherwise
    ``inconclusive`` (:data:`TARGET_RULE`)."""
    cleared = [clears(v, threshold) for v in values]
    if cleared and all(cleared):
        return "met"
    if not any(cleared):
        return "not met"
    return "inconclusive"


def summarize(rounds: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Medians per arm (``medians``), each metric's range over the rounds (``spread``: min and
    max), the medians' ratios to vLLM alone (``ratios``), the same ratios round by round
    (``round_ratios``: each arm against vLLM alone in the same round, the rounds where both
    ran), and each target's verdict on the round ratios (``targets``, :data:`TARGET_RULE`):
    a target is met only when the whole spread clears it."""
    values: dict[str, dict[str, list[float]]] = {}
    for arm in ARMS:
        done = [flat(r[arm]) for r in rounds if arm in r]
        if done:
            names = [name for name in METRICS if all(name in d for d in done)]
            values[arm] = {name: [d[name] for d in done] for name in names}
    per_arm = {arm: {name: median(v) for name, v in m.items()} for arm, m in values.items()}
    spread = {arm: {name: [min(v), max(v)] for name, v in m.items()} for arm, m in values.items()}
    ratios: dict[str, dict[str, float]] = {}
    by_round: dict[str, dict[str, list[float]]] = {}
    for arm, (base, compare) in BASES.items():
        if base not in per_arm or arm not in per_arm:
            continue
        ratios[arm] = compare(per_arm[arm], per_arm[base])
        paired = [compare(flat(r[arm]), flat(r[base])) for r in rounds if arm in r and base in r]
        by_round[arm] = {name: [p[name] for p in paired] for name in ratios[arm]}
    targets = {
        name: verdict(by_round[arm][ratio], threshold, clears)
        for name, (arm, ratio, threshold, clears) in TARGETS.items()
        if arm in by_round and ratio in by_round[arm]
    }
    summary = {
        "medians": per_arm,
        "spread": spread,
        "ratios": ratios,
        "round_ratios": by_round,
        "targets": targets,
        "target_rule": TARGET_RULE,
    }
    if "golden" in by_round:  # only where this run measured it: earlier reports stay as they were
        summary["ratio_spread"] = {
            "golden": {name: ratio_spread(v) for name, v in by_round["golden"].items() if v}
        }
    return summary


def resummarize(path: Path) -> dict[str, Any]:
    """Recompute the summary of the report at ``path`` from its recorded rounds with this
    code, and record that: ``summary_recomputed`` (this checkout's commit and dirty flag, the
    SHA-256 of the rounds as recomputed from, and the earlier summary, kept as it was under
    ``summary_as_run``). The rounds and everything else stay as they were."""
    report = json.loads(path.read_text())
    commit, dirty = provenance.git_state()
    if dirty is not False:
        raise ValueError(
            f"the checkout is dirty or not a git checkout (commit {commit}, dirty {dirty}): "
            "commit the summary code first, so that the recomputation names it"
        )
    as_run = report.get("summary_recomputed", {}).get("summary_as_run", report.get("summary"))
    report["summary"] = summarize(report["rounds"])
    report["summary_recomputed"] = {
        "git_commit": commit,
        "git_dirty": dirty,
        "from": "rounds",
        "rounds_sha256": rounds_digest(report["rounds"]),
        "summary_as_run": as_run,
    }
    path.write_text(json.dumps(report, indent=1))
    return report


def rounds_digest(rounds: list[dict[str, Any]]) -> str:
    """SHA-256 of the rounds as canonical JSON (sorted keys)."""
    return hashlib.sha256(json.dumps(rounds, sort_keys=True).encode()).hexdigest()


def round_order(arms: list[str], r: int) -> list[str]:
    """The arms in round ``r``'s order: each round starts one arm later than the one before."""
    if not arms:
        return []
    return arms[r % len(arms) :] + arms[: r % len(arms)]


def ask_round(
    engine: Engine, ops: list[str], timeout: float, round_number: int
) -> dict[str, dict[str, Any]]:
    """``engine``'s answers to ``ops`` in round ``round_number`` (1-based; 0 is the wait for
    the warm-ups); an :class:`EngineLost` on the way names that round."""
    try:
        return {op: engine.ask(op, timeout) for op in ops}
    except EngineLost as lost:
        lost.round = round_number
        raise


def profile(
    engines: dict[str, Engine],
    ready: list[str],
    timeout: float,
    workload: str = "throughput",
    rounds: int = 1,
) -> dict[str, Any]:
    """``rounds`` profiled runs of ``workload`` per arm, arms alternating as in the timed rounds:
    the first round's summaries (``arms``), and each other arm's extra device time in it against
    vLLM's (``vs_vllm``), or against mode route's where vLLM alone did not run (``vs_route``).
    With more than one round, also each arm's device time per round (``device_us_rounds``) and,
    per other arm, its device time over the base arm's per round with their spread
    (``device_time_ratio_rounds``, ``device_time_ratio_spread``: ``ratio_spread``). An engine
    that gives no profile raises :class:`EngineLost` (op ``profile``, its profile round)."""
    result: dict[str, Any] = {"workload": workload}
    per_round: list[dict[str, Any]] = []
    for r in range(rounds):
        order = round_order(ready, r)
        done = {
            arm: ask_round(engines[arm], ["profile"], 3 * timeout, r + 1)["profile"]
            for arm in order
        }
        per_round.append(done)
        for arm in order:
            summary = done[arm]
            print(
                f"profile {arm} ({r + 1}/{rounds}): {summary['device_us'] / 1e3:.1f} ms on the "
                f"device, idle {summary.get('device_idle_share') or 0:.1%} of its span, "
                + ", ".join(f"{k} {v:.0%}" for k, v in summary["categories_share"].items()),
                flush=True,
            )
    result["arms"] = {arm: per_round[0][arm] for arm in ready}
    base_arm = next((arm for arm in ("vllm", "route") if arm in result["arms"]), None)
    base = result["arms"].get(base_arm)
    if base and base["device_us"]:
        result[f"vs_{base_arm}"] = {
            arm: compare_to(base, result["arms"][arm]) for arm in ready if arm != base_arm
        }
    if rounds > 1:
        result["device_us_rounds"] = {
            arm: [d[arm]["device_us"] for d in per_round] for arm in ready
        }
        if f"vs_{base_arm}" in result and all(d[base_arm]["device_us"] for d in per_round):
            for arm, compared in result[f"vs_{base_arm}"].items():
                ratios = [d[arm]["device_us"] / d[base_arm]["device_us"] for d in per_round]
                compared["device_time_ratio_rounds"] = ratios
                compared["device_time_ratio_spread"] = ratio_spread(ratios)
    return result


def bench_model(tiny: bool, num_layers: int | None) -> dict[str, Any]:
    """The config of the model the engines serve: the bench model (or the tiny one) with
    ``num_layers`` layers where given, a positive multiple of its full-attention interval
    (ValueError otherwise)."""
    model = TINY_QWEN3_NEXT if tiny else BENCH_QWEN3_NEXT
    if num_layers is None:
        return model
    interval = model["full_attention_interval"]
    if num_layers < interval or num_layers % interval:
        raise ValueError(f"--num-layers must be a positive multiple of {interval}")
    return {**model, "num_hidden_layers": num_layers}


def positive_int(text: str) -> int:
    """``text`` as an integer of at least 1 (argparse's error otherwise)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bench_engine.py",
        description="Throughput and inter-token latency of vLLM alone, the plugin (route) and "
        "the plugin with VLLM_BATCH_INVARIANT=1, engines side by side, arms alternating.",
    )
    parser.add_argument("--out", type=Path, help="JSON file to write")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--settle-rounds",
        type=int,
        default=0,
        help="rounds of the same workloads run before the timed ones, arms alternating, and "
        "left out of the summary (settle_rounds in the report): the first timed round is then "
        "no engine's first run after the warm-ups",
    )
    parser.add_argument("--arms", default="vllm,route,bi", help=f"of {', '.join(ARMS)}")
    parser.add_argument(
        "--workloads",
        default=",".join(DEFAULT_WORKLOADS),
        help=f"comma-separated, of {', '.join(WORKLOADS)}",
    )
    parser.add_argument(
        "--decode-new-tokens",
        type=int,
        default=DECODE_NEW_TOKENS,
        help=f"new tokens per prompt of the decode workload (1 to {MAX_DECODE_NEW_TOKENS}; "
        "longer rounds average more of the machine's jitter)",
    )
    parser.add_argument("--eager", action="store_true", help="enforce_eager (no CUDA graphs)")
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    add_engine_arguments(parser, gpu_memory_utilization=0.25, kv_cache_gib=8.0)
    parser.add_argument(
        "--max-num-seqs",
        type=positive_int,
        default=None,
        help="vLLM's max_num_seqs (default: vLLM's); a deep model's engine refuses to start "
        "where it exceeds the Mamba cache blocks its memory holds",
    )
    parser.add_argument(
        "--start",
        choices=("concurrent", "sequential"),
        default="concurrent",
        help="start the engines together (compiles overlap) or one after another",
    )
    parser.add_argument(
        "--pin-cpus",
        action="store_true",
        help="run each engine's processes on its own share of this process's CPUs (disjoint "
        "sets, os.sched_setaffinity), so that no engine's host work lands on another's CPUs",
    )
    parser.add_argument(
        "--log-stats",
        action="store_true",
        help="vLLM's engine stats on, as vllm serve has them (LLM turns them off): each timed "
        "workload then reports the requests its engine preempted during it (preempted)",
    )
    parser.add_argument("--start-timeout", type=float, default=420.0)
    parser.add_argument("--op-timeout", type=float, default=120.0)
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="the tiny Qwen3-Next and an 8x smaller workload: a smoke run (CPU), not evidence",
    )
    parser.add_argument(
        "--num-layers",
        type=int,
        default=None,
        help="the model's layers (default: its own, 8 for the bench model; Qwen3-Next has 48), "
        "a multiple of its full-attention interval (4), so that 3 in 4 are GDN layers; more "
        "layers make a step's device time a larger share of it (more GPU memory per engine: "
        "--gpu-memory-utilization)",
    )
    parser.add_argument(
        "--profile",
        nargs="?",
        const="throughput",
        choices=PROFILE_WORKLOADS,
        help="after the rounds, profile one run of this workload per arm (default throughput; "
        f"decode: the decode prompts with {PROFILE_DECODE_NEW_TOKENS} new tokens): device time "
        "by kernel category (not part of the timed rounds)",
    )
    parser.add_argument(
        "--profile-rounds",
        type=int,
        default=1,
        help="profiled runs per arm, arms alternating (default 1); from 2, the device-time "
        "ratios per round and their spread",
    )
    parser.add_argument(
        "--resummarize",
        type=Path,
        metavar="FILE",
        help="recompute FILE's summary from its recorded rounds with this code (a clean "
        "checkout: its commit is recorded), rewrite FILE, run nothing",
    )
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.serve is not None:
        serve(json.loads(args.serve))
        return 0
    if args.resummarize is not None:
        try:
            report = resummarize(args.resummarize)
        except (OSError, ValueError, KeyError) as exc:
            parser.error(f"--resummarize {args.resummarize}: {exc}")
        print(json.dumps(report["summary"]["targets"], indent=1))
        return 0
    if args.out is None:
        parser.error("--out is required")
    if not args.out.parent.is_dir():
        parser.error(f"--out: folder {args.out.parent} does not exist")
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms:
        parser.error(f"--arms: {', '.join(unknown) or 'empty'}; valid: {', '.join(ARMS)}")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.settle_rounds < 0:
        parser.error("--settle-rounds must be 0 or more")
    if not 1 <= args.decode_new_tokens <= MAX_DECODE_NEW_TOKENS:
        parser.error(f"--decode-new-tokens must be 1 to {MAX_DECODE_NEW_TOKENS}")
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown or not workloads:
        parser.error(f"--workloads: {', '.join(unknown) or 'empty'}; valid: {', '.join(WORKLOADS)}")
    if args.profile and args.profile not in workloads:
        parser.error(
            f"--profile {args.profile} profiles the {args.profile} workload (its prompts are "
            "warmed up with the timed ones): add it to --workloads"
        )
    if args.profile_rounds < 1 or (args.profile_rounds > 1 and not args.profile):
        parser.error("--profile-rounds takes 1 or more, and more than 1 only with --profile")
    name = "tiny Qwen3-Next" if args.tiny else "bench model"
    try:
        model = bench_model(args.tiny, args.num_layers)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        binding = check_tensor_parallel(
            args.tensor_parallel_size, lambda size: sharding_problems(model, size, name)
        )
    except ValueError as exc:
        parser.error(str(exc))
    pinned: dict[str, list[int]] = {}
    if args.pin_cpus:
        try:
            pinned = dict(zip(arms, cpu_sets(os.sched_getaffinity(0), len(arms)), strict=True))
        except ValueError as exc:
            parser.error(f"--pin-cpus: {exc}")
    work = scratch_folder("gdn_bench_")  # the model, logs, traces
    site = plugin_site(work / "plugin-site")
    model_dir = write_tiny_model(work / "model", **model)
    spec = {
        "scale": 8 if args.tiny else 1,
        "model_dir": str(model_dir),
        "tensor_parallel_size": args.tensor_parallel_size,
        "cpu_thread_binding": binding,
        "cuda_graphs": not args.eager,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "kv_cache_gib": args.kv_cache_gib or None,
        "max_num_seqs": args.max_num_seqs,
        "attention_backend": args.attention_backend or None,
        "prefill_backend": args.prefill_backend or None,
        "profile_root": str(work / "profile") if args.profile else None,
        "profile_workload": args.profile,
        "workloads": workloads,
        "decode_new_tokens": args.decode_new_tokens,
        "pinned_cpus": pinned or None,
        "log_stats": args.log_stats,
    }
    info = provenance.provenance(
        script="scripts/bench_engine.py",
        model=model,
        tiny=args.tiny,
        workloads={
            "throughput": [THROUGHPUT_PROMPTS, THROUGHPUT_NEW_TOKENS],
            "itl": [ITL_PROMPTS, ITL_NEW_TOKENS],
            "decode": [DECODE_PROMPTS, args.decode_new_tokens],
        },
        engine=spec,
        vllm_cache_root=os.environ.get("VLLM_CACHE_ROOT"),
    )
    report: dict[str, Any] = {"provenance": info, "engines": {}, "rounds": []}

    def write() -> None:
        args.out.write_text(json.dumps(report, indent=1))

    engines: dict[str, Engine] = {}
    lost: EngineLost | None = None
    try:
        for arm in arms:
            cpus = pinned.get(arm)
            engines[arm] = Engine(arm, spec, site, work / f"{arm}.log", cpus)
            if args.start == "sequential":
                kind, payload = engines[arm].wait_for({"READY"}, args.start_timeout)
                report["engines"][arm] = {"status": kind, **payload}
        if args.start == "concurrent":
            for arm, engine in engines.items():
                kind, payload = engine.wait_for({"READY"}, args.start_timeout)
                report["engines"][arm] = {"status": kind, **payload}
        for arm, engine in engines.items():
            log = engine.log_text()
            report["engines"][arm]["plugin_log"] = plugin_lines(log)[:6]
            report["engines"][arm]["kv_cache"] = kv_cache_lines(log)
            if report["engines"][arm]["status"] != "READY":
                report["engines"][arm]["root_cause"] = root_cause(log)
        write()
        ready = [a for a in arms if report["engines"][a]["status"] == "READY"]
        for arm in ready:  # no timed round while another engine still warms up on the GPU
            waited = time.monotonic()
            ask_round(engines[arm], [WARMED], args.op_timeout, 0)
            report["engines"][arm]["warm_wait_seconds"] = round(time.monotonic() - waited, 1)
        for r in range(args.settle_rounds):  # untimed: every engine has run before round 1
            order = round_order(ready, r)
            settled: dict[str, Any] = {"order": order}
            for arm in order:
                settled[arm] = ask_round(engines[arm], workloads, args.op_timeout, 0)
            report.setdefault("settle_rounds", []).append(settled)
            write()
        for r in range(args.rounds):
            order = round_order(ready, r)
            done: dict[str, Any] = {"order": order}
            for arm in order:
                done[arm] = ask_round(engines[arm], workloads, args.op_timeout, r + 1)
            report["rounds"].append(done)
            report["summary"] = summarize(report["rounds"])
            write()
            print(f"round {r + 1}: " + json.dumps(report["summary"]["ratios"]), flush=True)
        if args.profile and ready:
            report["profile"] = profile(
                engines, ready, args.op_timeout, args.profile, args.profile_rounds
            )
            write()
    except EngineLost as exc:
        lost = exc
        report["engines"][exc.arm].update(exc.record())
    finally:
        for engine in engines.values():
            engine.stop()
        write()
    print(json.dumps(report.get("summary", {}), indent=1))
    if lost is not None:
        print(f"bench_engine: {lost}; report: {args.out}", file=sys.stderr, flush=True)
        return 1
    return 0 if len(report["rounds"]) == args.rounds else 1


if __name__ == "__main__":
    sys.exit(main())
