"""The engine benchmark's diagnostics, on CPU with a stand-in ``vllm``: every timed workload's
answer says when it started and ended, with ``--log-stats`` how many requests its engine
preempted during it, and each engine's report keeps vLLM's KV cache capacity line."""

from __future__ import annotations

import io
import json
import sys
import time
import types
from types import SimpleNamespace

from gdn_evidence.e2e import bench

from .test_bench_engine_loss import engine_specs
from .test_bench_engine_loss import spec as engine_spec

PREEMPTED_PER_GENERATE = 2  # the stand-in preempts this many requests per generate call


class StandInLLM:
    """``vllm.LLM`` as ``bench.serve`` uses it: ``generate`` gives every prompt its tokens and
    counts ``PREEMPTED_PER_GENERATE`` preemptions; ``get_metrics`` reads them the way vLLM's
    snapshot does (a counter per engine core, among other metrics)."""

    made: list[dict] = []

    def __init__(self, **kwargs) -> None:
        StandInLLM.made.append(kwargs)
        self.preempted = 0

    def generate(self, prompts, params, use_tqdm=False):
        self.preempted += PREEMPTED_PER_GENERATE
        tokens = list(range(params.max_tokens))
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=tokens)]) for _ in prompts]

    def get_metrics(self):
        counter = SimpleNamespace(name=bench.PREEMPTIONS, value=self.preempted)
        idle = SimpleNamespace(name=bench.PREEMPTIONS, value=0)  # a second engine core
        other = SimpleNamespace(name="vllm:num_requests_running", value=7)
        return [other, counter, idle]


def stand_in_vllm() -> types.ModuleType:
    module = types.ModuleType("vllm")
    module.LLM = StandInLLM
    module.SamplingParams = lambda **kwargs: SimpleNamespace(**kwargs)
    return module


def spec(**settings) -> dict:
    """An engine spec ``bench.serve`` runs: the loss tests' with the workloads' fields."""
    serving = {"scale": 8, "profile_root": None, "workloads": ["itl", "decode"]}
    return engine_spec(**serving, decode_new_tokens=16, **settings)


def serve(monkeypatch, capsys, ops: list[str], **settings) -> dict[str, dict]:
    """``bench.serve`` on the stand-in, asked ``ops``: each answer's payload by op."""
    StandInLLM.made.clear()
    monkeypatch.setitem(sys.modules, "vllm", stand_in_vllm())
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(f"{op}\n" for op in ops + ["quit"])))
    bench.serve(spec(**settings))
    answers = {}
    for line in capsys.readouterr().out.splitlines():
        if line.startswith(bench.PROTOCOL):
            kind, payload = line[len(bench.PROTOCOL) :].split(" ", 1)
            answers[kind] = json.loads(payload)
    return answers


def test_each_timed_workload_says_when_it_started_and_what_it_preempted(monkeypatch, capsys):
    before = time.time()
    ops = [bench.WARMED, "decode", "itl", "throughput", "prefill"]
    answers = serve(monkeypatch, capsys, ops, log_stats=True)
    assert StandInLLM.made[0]["disable_log_stats"] is False
    assert answers[bench.WARMED] == {}
    decode, itl = answers["decode"], answers["itl"]
    assert before <= decode["started_at"] <= itl["started_at"] <= time.time() + 1
    for op in ops[1:]:
        assert answers[op]["started_at"] <= answers[op]["ended_at"] <= time.time() + 1
    assert decode["ended_at"] <= itl["started_at"]
    # Per workload, not since the engine started (its warm-ups preempted 6 already).
    assert decode["preempted"] == PREEMPTED_PER_GENERATE
    assert itl["preempted"] == 2 * PREEMPTED_PER_GENERATE  # two generate calls
    assert decode["output_tok_s"] > 0 and "itl_ms" in itl
    for op in ("throughput", "prefill"):
        assert answers[op]["preempted"] == PREEMPTED_PER_GENERATE
        assert itl["started_at"] <= answers[op]["started_at"]
    assert answers["throughput"]["total_tok_s"] > answers["throughput"]["output_tok_s"]


def test_without_log_stats_the_engine_keeps_vllms_default_and_counts_nothing(monkeypatch, capsys):
    answers = serve(monkeypatch, capsys, ["decode"])
    assert "disable_log_stats" not in StandInLLM.made[0]
    assert "preempted" not in answers["decode"] and "started_at" in answers["decode"]


def test_preemptions_are_the_sum_of_vllms_preemption_counters():
    metrics = StandInLLM().get_metrics()
    metrics[1].value = 5
    assert bench.preemption_count(metrics) == 5
    assert bench.preemption_count(metrics + [metrics[1]]) == 10
    assert bench.preemption_count([]) == 0


def test_the_kv_cache_lines_are_vllms_capacity_lines():
    log = "\n".join(
        [
            "(EngineCore pid=7) INFO 12-07 [kv_cache_utils.py:1] GPU KV cache size: 69,632 "
            "tokens, Maximum concurrency for 2,048 tokens per request: 34.00x",
            "INFO 12-07 [gpu_model_runner.py:2] Model loading took 9.1 GiB",
            "  GPU KV cache size: 1 tokens (a second core)",
            "  GPU KV cache size: 2 tokens (a third)",
        ]
    )
    lines = bench.kv_cache_lines(log)
    assert lines == [log.splitlines()[0], "GPU KV cache size: 1 tokens (a second core)"]


def test_log_stats_reaches_the_engine_spec_and_the_provenance(tmp_path, monkeypatch):
    argv = ["--out", str(tmp_path / "bench.json"), "--tiny", "--log-stats"]
    assert engine_specs(monkeypatch, argv)[0]["log_stats"] is True
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["provenance"]["engine"]["log_stats"] is True
    assert bench.build_parser().parse_args([]).log_stats is False
