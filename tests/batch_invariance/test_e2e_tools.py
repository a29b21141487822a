"""The end-to-end tools on CPU: bitwise comparison, refusal lines, case matrix, argument
errors, the plugin site vLLM's loader reads, and the weighted models' checkpoints."""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys

import pytest
import torch

from gdn_evidence.e2e import bench, determinism, ranks
from gdn_evidence.e2e.determinism import Completion, cases_for, compare, root_cause
from gdn_evidence.e2e.engine_options import add_engine_arguments, engine_options, llm_kwargs
from gdn_evidence.e2e.plugin_site import (
    CONTROL_WITHOUT_ROUTING,
    PLUGIN,
    engine_env,
    plugin_site,
)
from gdn_evidence.harness import provenance
from vllm_gdn_invariant.models.weighted import (
    qwen3_5_config,
    qwen3_5_weights,
    qwen3_next_weights,
    tensor_parallel_problems,
    write_weighted_model,
)


def test_compare_is_bitwise_and_finds_the_first_divergence():
    alone = Completion([5, 6, 7], [-0.5, -1.25, -2.0])
    assert compare(alone, Completion([5, 6, 7], [-0.5, -1.25, -2.0]))["logprobs_identical"]
    nudged = Completion([5, 6, 7], [-0.5, float.fromhex("-0x1.4000000000001p+0"), -2.0])
    result = compare(alone, nudged)  # one ULP at position 1: tokens equal, logprobs not
    assert result == {"tokens_identical": True, "logprobs_identical": False, "first_divergence": 1}
    other = compare(alone, Completion([5, 9, 7], [-0.5, -1.25, -2.0]))
    assert other["first_divergence"] == 1 and not other["tokens_identical"]


def test_negative_zero_is_not_zero():
    result = compare(Completion([1], [0.0]), Completion([1], [-0.0]))
    assert not result["logprobs_identical"]


def test_root_cause_prefers_vllms_batch_invariance_refusal():
    log = "\n".join(
        [
            "(EngineCore pid=1) ERROR ... Traceback",
            "(EngineCore pid=1) ERROR ... RuntimeError: VLLM batch_invariant mode is not "
            "supported for GDN_ATTN.",
            "RuntimeError: Engine core initialization failed. See root cause above.",
        ]
    )
    assert root_cause(log) == "VLLM batch_invariant mode is not supported for GDN_ATTN."
    assert root_cause("x\nValueError: bad block size\n") == "ValueError: bad block size"


def test_arms_one_to_three_run_eager_only_and_four_five_in_both_settings():
    cases = cases_for(["qwen3_next"], [1, 2, 3, 4, 5], ["eager", "default"], 1)
    assert [(c.arm, c.setting) for c in cases] == [
        (1, "eager"),
        (2, "eager"),
        (3, "eager"),
        (4, "default"),
        (4, "eager"),
        (5, "default"),
        (5, "eager"),
    ]


def usage_error(main, out, argv: list[str], capsys) -> str:
    """``main(["--out", out, *argv])`` exits 2 without writing ``out``; its stderr."""
    with pytest.raises(SystemExit) as info:
        main(["--out", str(out), *argv])
    assert info.value.code == 2
    assert not out.exists()
    return capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--arms", "1,9"], "--arms: '9' is not one of"),
        (["--models", "llama"], "--models: 'llama' is not one of"),
        (["--arms", "1", "--settings", "default"], "no case"),
        (["--tensor-parallel-size", "0"], "--tensor-parallel-size must be at least 1"),
        (
            ["--tensor-parallel-size", "4"],
            "qwen3_next: linear_num_key_heads=2 does not divide by tensor_parallel_size=4",
        ),
        (
            ["--models", "qwen3_5", "--tensor-parallel-size", "3"],
            "qwen3_5: num_key_value_heads=2 neither divides nor is divided by",
        ),
    ],
)
def test_bad_arguments_exit_2_before_anything_is_written(tmp_path, capsys, argv, words):
    assert words in usage_error(determinism.main, tmp_path / "e2e.json", argv, capsys)


def test_tensor_parallel_two_fits_both_models_and_needs_two_gpus(tmp_path, capsys, monkeypatch):
    assert tensor_parallel_problems("qwen3_next", 2) == []
    assert tensor_parallel_problems("qwen3_5", 2) == []
    monkeypatch.setattr(ranks, "visible_gpus", lambda: 1)
    err = usage_error(
        determinism.main, tmp_path / "e2e.json", ["--tensor-parallel-size", "2"], capsys
    )
    assert "--tensor-parallel-size 2 needs as many GPUs; this machine shows 1" in err


def test_cpu_ranks_get_equal_disjoint_thread_groups():
    assert ranks.cpu_thread_binding(2, [0, 1]) == "0|1"
    assert ranks.cpu_thread_binding(2, [4, 5, 6, 7, 0, 1, 2, 3]) == "0,1,2,3|4,5,6,7"
    assert ranks.cpu_thread_binding(1, [0, 1]) == "0,1"
    with pytest.raises(ValueError, match="2 CPU ranks need 2 CPUs; this process may use 1"):
        ranks.cpu_thread_binding(2, [0])


def test_cpu_ranks_are_bound_only_when_several_and_unset(monkeypatch):
    monkeypatch.delenv(ranks.CPU_BINDING_ENV, raising=False)
    assert ranks.thread_binding_for(1, None) is None
    assert ranks.thread_binding_for(2, 2) is None  # GPUs: vLLM binds nothing
    monkeypatch.setattr(ranks.os, "sched_getaffinity", lambda pid: {0, 1})
    assert ranks.thread_binding_for(2, None) == "0|1"
    monkeypatch.setenv(ranks.CPU_BINDING_ENV, "0-1|2-3")
    assert ranks.thread_binding_for(2, None) is None  # the user's binding stands


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--tensor-parallel-size", "3"], "bench model: linear_num_key_heads=16 does not divide"),
        (["--tiny", "--tensor-parallel-size", "4"], "tiny Qwen3-Next: linear_num_key_heads=2"),
        (["--tensor-parallel-size", "0"], "--tensor-parallel-size must be at least 1"),
    ],
)
def test_the_benchmark_refuses_a_tensor_parallel_size_its_model_cannot_take(
    tmp_path, capsys, argv, words
):
    assert words in usage_error(bench.main, tmp_path / "bench.json", argv, capsys)


def test_engine_options_follow_the_command_line_and_empty_leaves_the_choice_to_vllm():
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser, gpu_memory_utilization=0.3)
    args = parser.parse_args([])
    options = engine_options(
        args.attention_backend, args.prefill_backend, args.gpu_memory_utilization, args.kv_cache_gib
    )
    assert options == {
        "logprobs_mode": "processed_logprobs",
        "gpu_memory_utilization": 0.3,
        "attention_backend": "TRITON_ATTN",
        "additional_config": {"gdn_prefill_backend": "triton"},
    }
    args = parser.parse_args(
        ["--attention-backend", "", "--prefill-backend", "", "--kv-cache-gib", "1.5"]
    )
    options = engine_options(args.attention_backend, args.prefill_backend, 0.3, args.kv_cache_gib)
    assert "attention_backend" not in options and "additional_config" not in options
    assert options["kv_cache_memory_bytes"] == 3 * 2**29


def test_llm_kwargs_take_the_specs_engine_options_and_the_scripts_settings():
    spec = {
        "model": "qwen3_5",
        "model_dir": "/models/q",
        "attention_backend": "",
        "prefill_backend": "triton",
        "gpu_memory_utilization": 0.2,
        "kv_cache_gib": 0.5,
    }
    kwargs = llm_kwargs(spec, max_model_len=512, enforce_eager=True)
    assert kwargs == {
        "model": "/models/q",
        "enable_chunked_prefill": True,
        "seed": 0,
        "max_model_len": 512,
        "enforce_eager": True,
        "logprobs_mode": "processed_logprobs",
        "gpu_memory_utilization": 0.2,
        "additional_config": {"gdn_prefill_backend": "triton"},
        "kv_cache_memory_bytes": 2**29,
        "language_model_only": True,
    }
    without_kv = {k: v for k, v in spec.items() if k != "kv_cache_gib"}
    kwargs = llm_kwargs({**without_kv, "model": "qwen3_next"})
    assert "kv_cache_memory_bytes" not in kwargs and "language_model_only" not in kwargs


def test_every_engine_process_runs_with_nvlink_multicast_off(tmp_path):
    base = {**os.environ, "NCCL_NVLS_ENABLE": "1"}
    env = engine_env(base, [PLUGIN], plugin_site(tmp_path / "site"))
    assert env["NCCL_NVLS_ENABLE"] == "0"
    assert env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert env["NVSHMEM_DISABLE_NVLS"] == "1"


def test_vllms_plugin_loader_finds_the_plugin_site(tmp_path):
    site = plugin_site(tmp_path / "site")
    env = engine_env(os.environ, [CONTROL_WITHOUT_ROUTING], site)
    code = (
        "from vllm.plugins import DEFAULT_PLUGINS_GROUP, load_plugins_by_group; "
        "print('LOADED', sorted(load_plugins_by_group(DEFAULT_PLUGINS_GROUP)))"
    )
    proc = subprocess.run(  # elsewhere than the checkout: gdn_evidence only via PYTHONPATH
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    loaded = [line for line in proc.stdout.splitlines() if line.startswith("LOADED")]
    assert loaded == [f"LOADED {[CONTROL_WITHOUT_ROUTING]}"], proc.stdout + proc.stderr[-2000:]


def test_no_plugin_loads_with_an_empty_plugin_list(tmp_path):
    env = engine_env(os.environ, [], plugin_site(tmp_path / "site"))
    assert env["VLLM_PLUGINS"] == ""
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(tmp_path / "site")
    assert engine_env(os.environ, [PLUGIN], None)["VLLM_PLUGINS"] == PLUGIN


def test_qwen3_5_checkpoint_names_and_shapes_are_the_hugging_face_ones():
    transformers = pytest.importorskip("transformers")
    config = qwen3_5_config()
    hf_config = transformers.Qwen3_5Config(
        text_config=config["text_config"], vision_config=config["vision_config"]
    )
    with torch.device("meta"):
        model = transformers.Qwen3_5ForConditionalGeneration(hf_config)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items() if "visual" not in k}
    ours = {k: tuple(v.shape) for k, v in qwen3_5_weights(config["text_config"], 0).items()}
    assert ours == expected


def test_weights_are_seeded_and_greedy_relevant(tmp_path):
    from vllm_gdn_invariant.models.weighted import QWEN3_NEXT_E2E

    a = qwen3_next_weights(QWEN3_NEXT_E2E, seed=0)
    b = qwen3_next_weights(QWEN3_NEXT_E2E, seed=0)
    c = qwen3_next_weights(QWEN3_NEXT_E2E, seed=1)
    name = "model.layers.0.linear_attn.in_proj_qkvz.weight"
    assert torch.equal(a[name], b[name]) and not torch.equal(a[name], c[name])
    assert a[name].abs().max() > 0.1  # not vLLM's dummy range (±1e-3)
    assert len([k for k in a if ".mlp.experts." in k]) == 4 * 16 * 3
    folder = write_weighted_model(tmp_path / "m", "qwen3_next", seed=0)
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["Qwen3NextForCausalLM"] and config["num_experts"] == 16
    assert (folder / "model.safetensors").stat().st_size > 1_000_000


def test_unknown_model_is_refused_before_writing(tmp_path):
    with pytest.raises(ValueError, match="qwen3_next, qwen3_5"):
        write_weighted_model(tmp_path / "m", "llama")
    assert not (tmp_path / "m").exists()


def bench_round(order, tok_s, prefill_s, itl_ms):
    return {
        "order": order,
        **{
            arm: {
                "throughput": {"output_tok_s": t, "total_tok_s": 5 * t, "seconds": 1000 / t},
                "prefill": {"seconds": p},
                "itl": {"itl_ms": i},
            }
            for arm, t, p, i in zip(order, tok_s, prefill_s, itl_ms, strict=True)
        },
    }


def test_the_benchmark_summary_is_medians_their_ratios_and_the_spread():
    arms = ["vllm", "route", "bi"]
    rounds = [
        bench_round(arms, [100, 110, 80], [1.0, 1.0, 1.2], [2.0, 2.0, 2.5]),
        bench_round(arms, [120, 90, 70], [1.1, 0.9, 1.3], [2.2, 2.1, 2.4]),
        bench_round(arms, [90, 100, 75], [0.9, 1.0, 1.1], [2.1, 2.0, 2.6]),
    ]
    summary = bench.summarize(rounds)
    assert summary["medians"]["vllm"]["output_tok_s"] == 100
    assert summary["medians"]["bi"]["output_tok_s"] == 75
    assert summary["spread"]["vllm"]["output_tok_s"] == [90, 120]
    assert summary["ratios"]["route"]["throughput_vs_vllm"] == 1.0
    assert summary["ratios"]["bi"]["throughput_vs_vllm"] == 0.75
    assert summary["ratios"]["bi"]["throughput_overhead"] == 1 / 0.75 - 1  # 1 / ratio - 1
    assert summary["ratios"]["bi"]["itl_vs_vllm"] == 2.5 / 2.1  # medians' quotient
    # round by round, each arm against vLLM in the same round
    assert summary["round_ratios"]["route"]["throughput_vs_vllm"] == [1.1, 90 / 120, 100 / 90]
    assert summary["round_ratios"]["bi"]["throughput_overhead"] == [
        100 / 80 - 1,
        120 / 70 - 1,
        90 / 75 - 1,
    ]
    # both medians clear their targets, but the rounds fall on both sides of them
    assert summary["ratios"]["route"]["throughput_vs_vllm"] >= 0.99
    assert summary["ratios"]["bi"]["throughput_overhead"] < 0.34
    assert summary["targets"] == {
        "route_throughput_at_least_0.99x": "inconclusive",
        "bi_throughput_overhead_below_34_percent": "inconclusive",
    }


@pytest.mark.parametrize(
    "route, bi, verdicts",
    [
        # every round clears both targets (route >= 0.99x, bi overhead < 34 %)
        ([100, 99, 120], [80, 75, 90], ("met", "met")),
        # route 0.98x in one round; bi's overhead 40 % in one round
        ([100, 98, 120], [80, 75, 60], ("inconclusive", "inconclusive")),
        # no round clears: route below 0.99x and bi's overhead at least 34 % in every round
        ([98, 90, 80], [74, 60, 50], ("not met", "not met")),
    ],
)
def test_a_target_is_met_only_when_every_round_clears_it(route, bi, verdicts):
    rounds = [
        bench_round(["vllm", "route", "bi"], [100, r, b], [1.0, 1.0, 1.0], [2.0, 2.0, 2.0])
        for r, b in zip(route, bi, strict=True)
    ]
    targets = bench.summarize(rounds)["targets"]
    assert (
        targets["route_throughput_at_least_0.99x"],
        targets["bi_throughput_overhead_below_34_percent"],
    ) == verdicts


def test_a_target_with_one_round_missing_its_arm_is_judged_on_the_paired_rounds():
    rounds = [
        bench_round(["vllm", "route"], [100, 120], [1.0, 1.0], [2.0, 2.0]),
        bench_round(["vllm", "route", "bi"], [100, 100, 50], [1.0, 1.0, 1.0], [2.0, 2.0, 2.0]),
        bench_round(["route", "bi"], [50, 100], [1.0, 1.0], [2.0, 2.0]),  # no vLLM: unpaired
    ]
    summary = bench.summarize(rounds)
    assert summary["round_ratios"]["route"]["throughput_vs_vllm"] == [1.2, 1.0]
    assert summary["targets"] == {
        "route_throughput_at_least_0.99x": "met",
        "bi_throughput_overhead_below_34_percent": "not met",
    }


def golden_round(order, decode_tok_s, itl_ms):
    return {
        "order": order,
        **{
            arm: {"decode": {"output_tok_s": d, "seconds": 1000 / d}, "itl": {"itl_ms": i}}
            for arm, d, i in zip(order, decode_tok_s, itl_ms, strict=True)
        },
    }


def test_mode_golden_is_compared_with_mode_route_and_the_spread_is_reported():
    rounds = [
        golden_round(["route", "golden"], [100, 99], [2.0, 2.1]),
        golden_round(["golden", "route"], [103, 100], [2.0, 2.0]),
        golden_round(["route", "golden"], [100, 100], [2.0, 2.2]),
    ]
    summary = bench.summarize(rounds)
    assert summary["round_ratios"]["golden"]["decode_throughput_vs_route"] == [0.99, 1.03, 1.0]
    assert summary["ratios"]["golden"] == {"decode_throughput_vs_route": 1.0, "itl_vs_route": 1.05}
    spread = summary["ratio_spread"]["golden"]["decode_throughput_vs_route"]
    assert spread["spread"] == (1.03 - 0.99) / 1.0 and spread["rounds"] == 3
    assert spread["median"] == 1.0
    assert spread["median_interval"]["interval"] is None  # 3 rounds cannot give 95 %
    assert summary["targets"] == {"golden_decode_throughput_at_least_0.99x_route": "met"}
    assert "route" not in summary["ratios"]  # no vLLM arm, no ratio to it
    rounds.append(golden_round(["route", "golden"], [100, 98], [2.0, 2.0]))
    assert bench.summarize(rounds)["targets"] == {
        "golden_decode_throughput_at_least_0.99x_route": "inconclusive"
    }


@pytest.mark.parametrize(
    "n, k, coverage",
    [(6, 1, 1 - 2 / 64), (9, 2, 1 - 2 * 10 / 512), (20, 6, 1 - 2 * 21700 / 2**20)],
)
def test_the_median_interval_is_the_widest_order_statistics_pair_with_enough_coverage(
    n, k, coverage
):
    """[x_(k), x_(n+1-k)] covers the median with probability 1 - 2 P(Bin(n, 1/2) < k): 6
    rounds give the whole range at 96.9 %, 9 rounds the second and eighth (96.1 %), 20 rounds
    the sixth and fifteenth (95.9 %); k + 1 would fall below 95 % in each."""
    values = [float(v) for v in reversed(range(n))]  # unsorted on purpose
    result = bench.median_interval(values)
    assert result["interval"] == [float(k - 1), float(n - k)]
    assert result["coverage"] == pytest.approx(coverage)
    assert result["coverage"] >= 0.95
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    assert 1 - 2 * tail < 0.95  # a narrower pair would not reach 95 %


def test_five_rounds_give_no_95_percent_interval_for_the_median():
    result = bench.median_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    assert result["interval"] is None
    assert result["coverage"] == pytest.approx(1 - 2 / 32)


def test_a_report_without_mode_golden_keeps_its_summary_fields():
    arms = ["vllm", "route", "bi"]
    summary = bench.summarize([bench_round(arms, [100, 110, 80], [1.0, 1.0, 1.2], [2.0] * 3)])
    assert set(summary) == {
        "medians", "spread", "ratios", "round_ratios", "targets", "target_rule",
    }  # fmt: skip
    assert set(summary["ratios"]["route"]) == {
        "throughput_vs_vllm", "throughput_overhead", "prefill_time_vs_vllm", "itl_vs_vllm",
        "itl_overhead",
    }  # fmt: skip


def test_each_arm_runs_with_its_mode_and_batch_invariance(tmp_path):
    golden = bench.arm_env("golden", {}, tmp_path)
    assert golden["VLLM_GDN_INVARIANT_MODE"] == "golden"
    assert golden["VLLM_BATCH_INVARIANT"] == "0" and golden["VLLM_PLUGINS"]
    route = bench.arm_env("route", {}, tmp_path)
    assert "VLLM_GDN_INVARIANT_MODE" not in route and route["VLLM_PLUGINS"]
    assert bench.arm_env("bi", {}, tmp_path)["VLLM_BATCH_INVARIANT"] == "1"
    assert bench.arm_env("vllm", {}, tmp_path)["VLLM_PLUGINS"] == ""


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--workloads", "decode,train"], "--workloads: train; valid:"),
        (["--workloads", ","], "--workloads: empty"),
        (["--workloads", "decode", "--profile"], "--profile throughput profiles the throughput"),
        (["--workloads", "itl", "--profile", "decode"], "--profile decode profiles the decode"),
        (["--workloads", "decode", "--profile", "prefill"], "--profile: invalid choice"),
        (["--arms", "route,gold"], "--arms: gold; valid: vllm, route, bi, golden"),
        (["--profile-rounds", "3"], "more than 1 only with --profile"),
        (["--num-layers", "6"], "--num-layers must be a positive multiple of 4"),
        (["--num-layers", "0"], "--num-layers must be a positive multiple of 4"),
        (["--workloads", "decode", "--profile", "decode", "--profile-rounds", "0"], "1 or more"),
    ],
)
def test_the_benchmark_refuses_bad_workloads_and_arms_before_writing(tmp_path, capsys, argv, words):
    assert words in usage_error(bench.main, tmp_path / "bench.json", argv, capsys)


def test_the_benchmark_model_takes_the_layers_asked_for_three_in_four_gdn():
    deep = bench.bench_model(False, 48)
    assert deep["num_hidden_layers"] == 48 and deep["full_attention_interval"] == 4
    assert {k: v for k, v in deep.items() if k != "num_hidden_layers"} == {
        k: v for k, v in bench.BENCH_QWEN3_NEXT.items() if k != "num_hidden_layers"
    }
    assert bench.bench_model(False, None) is bench.BENCH_QWEN3_NEXT
    assert bench.bench_model(True, 8)["num_hidden_layers"] == 8


def test_resummarize_recomputes_the_summary_from_the_rounds_and_records_it(tmp_path, monkeypatch):
    arms = ["vllm", "route", "bi"]
    rounds = [
        bench_round(arms, [100, 50, 80], [1.0, 1.0, 1.2], [2.0, 2.0, 2.5]),
        bench_round(arms, [100, 150, 90], [1.0, 0.9, 1.3], [2.0, 2.1, 2.4]),
    ]
    as_run = {"targets": {"route_throughput_at_least_0.99x": True}}
    path = tmp_path / "bench.json"
    path.write_text(
        json.dumps({"provenance": {"git_commit": "abc"}, "rounds": rounds, "summary": as_run})
    )
    monkeypatch.setattr(provenance, "git_state", lambda: ("f00d", False))
    assert bench.main(["--resummarize", str(path)]) == 0
    report = json.loads(path.read_text())
    assert report["rounds"] == rounds and report["provenance"] == {"git_commit": "abc"}
    assert report["summary"] == bench.summarize(rounds)
    assert report["summary"]["targets"]["route_throughput_at_least_0.99x"] == "inconclusive"
    recomputed = report["summary_recomputed"]
    assert recomputed["git_commit"] == "f00d" and recomputed["from"] == "rounds"
    assert recomputed["rounds_sha256"] == bench.rounds_digest(rounds)
    assert recomputed["summary_as_run"] == as_run
    bench.main(["--resummarize", str(path)])  # again: the summary as run stays the first one
    assert json.loads(path.read_text())["summary_recomputed"]["summary_as_run"] == as_run


def test_resummarize_refuses_a_dirty_checkout_before_writing(tmp_path, monkeypatch, capsys):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"rounds": [], "summary": {}}))
    before = path.read_bytes()
    monkeypatch.setattr(provenance, "git_state", lambda: ("f00d", True))
    with pytest.raises(SystemExit) as info:
        bench.main(["--resummarize", str(path)])
    assert info.value.code == 2 and "dirty" in capsys.readouterr().err
    assert path.read_bytes() == before


def test_pinned_engines_get_disjoint_cpu_sets_covering_the_cpus():
    sets = bench.cpu_sets({0, 1, 2, 3, 4, 5, 6, 7, 9}, 2)
    assert sets == [[0, 1, 2, 3, 4], [5, 6, 7, 9]]
    assert bench.cpu_sets({3}, 1) == [[3]]
    with pytest.raises(ValueError, match="1 CPUs cannot give 2 engines"):
        bench.cpu_sets({0}, 2)


def test_a_pinned_engine_process_runs_on_its_cpus_only():
    """The affinity reaches the engine's process (and so the processes it starts)."""
    cpus = sorted(os.sched_getaffinity(0))[-1:]
    command = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]
    assert bench.pin_to(None) is None
    probe = subprocess.run(
        command,
        preexec_fn=bench.pin_to(cpus),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.stdout.strip() == str(cpus)


class ProfiledEngine:
    """An engine whose n-th profile has ``categories_us`` with each value times ``scales[n]``;
    ``log`` records (arm, op) across engines in the order asked."""

    def __init__(
        self,
        categories_us: dict[str, float],
        scales: tuple[float, ...] = (1.0,),
        name: str = "",
        log: list | None = None,
    ) -> None:
        self.categories_us, self.scales, self.name = categories_us, scales, name
        self.log = [] if log is None else log
        self.asked: list[str] = []

    def ask(self, op: str, timeout: float) -> dict:
        scale = self.scales[len(self.asked) % len(self.scales)]
        self.asked.append(op)
        self.log.append((self.name, op))
        categories = {k: v * scale for k, v in self.categories_us.items()}
        total = sum(categories.values())
        return {
            "device_us": total,
            "categories_us": categories,
            "categories_share": {k: v / total for k, v in categories.items()},
        }


def test_a_profile_without_vllm_alone_compares_every_arm_with_mode_route():
    engines = {
        "route": ProfiledEngine({"gdn_decode": 100.0, "moe": 400.0}),
        "golden": ProfiledEngine({"gdn_decode": 104.0, "moe": 400.0, "other": 3.0}),
    }
    result = bench.profile(engines, ["route", "golden"], 1.0, "decode")
    assert result["workload"] == "decode" and "vs_vllm" not in result
    extra = result["vs_route"]["golden"]
    assert extra["device_us_extra"] == 7.0
    assert extra["categories_us_extra"] == {"gdn_decode": 4.0, "moe": 0.0, "other": 3.0}
    assert all(engine.asked == ["profile"] for engine in engines.values())


def test_a_profile_with_vllm_alone_compares_the_plugin_arms_with_it():
    engines = {
        "vllm": ProfiledEngine({"gdn_decode": 100.0}),
        "route": ProfiledEngine({"gdn_decode": 101.0}),
        "golden": ProfiledEngine({"gdn_decode": 104.0}),
    }
    result = bench.profile(engines, ["vllm", "route", "golden"], 1.0)
    assert result["workload"] == "throughput" and "vs_route" not in result
    assert {arm: v["device_us_extra"] for arm, v in result["vs_vllm"].items()} == {
        "route": 1.0,
        "golden": 4.0,
    }


def test_profile_rounds_alternate_the_arms_and_give_each_rounds_device_time_ratio():
    """Three rounds: route first, then golden first, then route first; each round's own ratio
    (golden's device time over route's in that round), not a ratio across rounds, and the
    first round's summaries as ``arms``."""
    log: list = []
    engines = {
        "route": ProfiledEngine({"gdn_decode": 100.0}, (1.0, 2.0, 1.0), "route", log),
        "golden": ProfiledEngine({"gdn_decode": 101.0}, (1.0, 2.0, 1.1), "golden", log),
    }
    result = bench.profile(engines, ["route", "golden"], 1.0, "decode", rounds=3)
    assert [arm for arm, _ in log] == ["route", "golden", "golden", "route", "route", "golden"]
    assert result["device_us_rounds"] == {
        "route": [100.0, 200.0, 100.0],
        "golden": [101.0, 202.0, pytest.approx(111.1)],
    }
    golden = result["vs_route"]["golden"]
    assert golden["device_time_ratio_rounds"] == pytest.approx([1.01, 1.01, 1.111])
    assert golden["device_time_ratio_spread"]["median"] == pytest.approx(1.01)
    assert golden["device_time_ratio"] == 1.01 and golden["device_us_extra"] == 1.0
    assert result["arms"]["route"]["device_us"] == 100.0


def test_one_profile_round_records_no_per_round_fields():
    engines = {
        "route": ProfiledEngine({"gdn_decode": 100.0}),
        "golden": ProfiledEngine({"gdn_decode": 104.0}),
    }
    result = bench.profile(engines, ["route", "golden"], 1.0, "decode")
    assert "device_us_rounds" not in result
    assert "device_time_ratio_rounds" not in result["vs_route"]["golden"]


def test_a_later_profile_reads_only_the_traces_written_since_the_earlier_ones(tmp_path):
    old = tmp_path / "rank0.1.pt.trace.json"
    old.write_text("{}")
    assert bench.trace_files(tmp_path, settle=0.0) == [old]
    assert bench.trace_files(tmp_path, settle=0.0, earlier=frozenset({old})) == []
    new = tmp_path / "rank0.2.pt.trace.json"
    new.write_text("{}")
    assert bench.trace_files(tmp_path, settle=5.0, earlier=frozenset({old})) == [new]
