#!/usr/bin/env bash
# GPU machine, vLLM 0.26.0's real engine: the preemption evidence in two stages, one device
# call each (every call after the staging one carries .device-engine; see
# ../shared/device/README.md, "The real engine"):
#   call 1: bash .device-engine-so/stage.sh                              (carry .device-engine-so)
#   call 2: source .device-engine/enter.sh && bash scripts/h200_preemption_evidence.sh $OUT eager
#   call 3: source .device-engine/enter.sh && bash scripts/h200_preemption_evidence.sh $OUT graphs
# and the response replay's engine evidence (issue 21), one call after the staging one:
#   source .device-engine/enter.sh && bash scripts/h200_preemption_evidence.sh $OUT replay
# Stages:
#   eager   one engine per model and mode, enforce_eager, prefix caching off, in parallel; beside
#           them the GPU tests of the history replay and of the pinned prefill configs
#   graphs  the same engines under vLLM's defaults (torch.compile, CUDA graphs, prefix caching)
#   v2      the tiny Qwen3-Next and the dims model, eager and graphs, on Model Runner V2
#           (VLLM_USE_V2_MODEL_RUNNER=1; vLLM 0.26 picks V1 for hybrid models by itself)
#   cached  the graphs stage (its engines also run forced-cached and multi-turn: prefix caching
#           is on there) beside the GPU tests of the replay API, the history replay and the
#           golden kernels' direct launch
#   replay  scripts/replay_engine_check.py: the three tiny models in mode golden, eager, every
#           GDN layer captured and replayed (prompt_state, replay_response) with its control;
#           98 s at 67cd0fa (engines start in parallel, ~47 s each eager, plus Triton
#           compiles), LIMIT 290 s by default; copy $OUT/replay_engine.json to
#           docs/evidence/replay_engine.json
# Usage: h200_preemption_evidence.sh OUT STAGE [LIMIT]; PREEMPTION_MODELS overrides the models.
# Merge afterwards into docs/evidence/preemption.json (scripts/preemption_determinism.py --merge).
set -u
out=$1
stage=$2
limit=${3:-560}
mkdir -p "$out"
export VLLM_CACHE_ROOT=${VLLM_CACHE_ROOT:-/tmp/vllm-cache}
models=${PREEMPTION_MODELS:-qwen3_next,qwen3_5,qwen3_next_dims}
run=(python scripts/preemption_determinism.py --models "$models" --modes route,golden
  --parallel 6 --timeout $((limit - 20)))
case $stage in
  eager)
    timeout "$limit" python -m pytest -q -p no:cacheprovider -rs \
      tests/gpu/test_history_replay_gpu.py tests/gpu/test_autotune_pin_gpu.py \
      > "$out/pytest_gpu.log" 2>&1 &
    timeout "$limit" "${run[@]}" --graphs eager --out "$out/preemption_eager.json" \
      > "$out/preemption_eager.log" 2>&1
    wait
    ;;
  graphs)
    timeout "$limit" "${run[@]}" --graphs graphs --out "$out/preemption_graphs.json" \
      > "$out/preemption_graphs.log" 2>&1
    ;;
  cached)
    timeout "$limit" python -m pytest -q -p no:cacheprovider -rs \
      tests/gpu/test_replay_gpu.py tests/gpu/test_history_replay_gpu.py \
      tests/gpu/test_kernels_launch.py > "$out/pytest_gpu.log" 2>&1 &
    timeout "$limit" "${run[@]}" --graphs graphs --out "$out/preemption_graphs.json" \
      > "$out/preemption_graphs.log" 2>&1
    wait
    ;;
  v2)
    timeout "$limit" python scripts/preemption_determinism.py --models qwen3_next,qwen3_next_dims \
      --modes route,golden --graphs eager,graphs --model-runner v2 --parallel 8 \
      --timeout $((limit - 20)) --out "$out/preemption_v2.json" > "$out/preemption_v2.log" 2>&1
    ;;
  replay)
    limit=${3:-290}
    timeout "$limit" python scripts/replay_engine_check.py --timeout $((limit - 30)) \
      --out "$out/replay_engine.json" > "$out/replay_engine.log" 2>&1
    ;;
  *)
    echo "unknown stage $stage" >&2
    exit 2
    ;;
esac
tail -n 40 "$out"/*.log
