#!/usr/bin/env bash
# GPU machine, vLLM 0.26.0's real engine: the batch-invariance, golden-mode and shadow evidence
# in stages that each fit one device call. Every job is cut at LIMIT seconds and writes its
# JSON as it goes (the scripts rewrite their file after every case), so what finished comes back.
#   call 1: bash .device-engine-so/stage.sh                       (carry .device-engine-so)
#   call 2: source .device-engine/enter.sh && bash scripts/h200_engine_evidence.sh $OUT eager
#   call 3: source .device-engine/enter.sh && bash scripts/h200_engine_evidence.sh $OUT graphs
#   call 4: source .device-engine/enter.sh && bash scripts/h200_engine_evidence.sh $OUT bench
# (calls 2-4 carry .device-engine; a machine idle for 30 s goes back, so issue them back to back.)
# Stages:
#   eager   e2e arms 1-5 eager for both models, the GPU kernel tests of batch-invariant mode and
#           of the shadow checker, the shadow engine check (modes route, off, golden); in parallel
#   graphs  e2e arms 4 and 5 in vLLM's default setting (torch.compile, CUDA graphs, prefix
#           caching) for both models, one process per model and arm, in parallel
#   bench   the engine benchmark, then the shadow overhead in the engine (alone on the GPU)
# Merge afterwards: python scripts/e2e_determinism.py --out docs/evidence/e2e_determinism.json \
#   --merge <the e2e_*.json files>
set -u
out=$1
stage=$2
limit=${3:-560}
export VLLM_CACHE_ROOT=${VLLM_CACHE_ROOT:-/tmp/vllm-cache}
e2e=(python scripts/e2e_determinism.py --gpu-memory-utilization 0.12 --case-timeout 300)
pids=()
job() {  # job NAME COMMAND...: run in the background, cut at $limit, log to $out/NAME.log
  local name=$1
  shift
  timeout "$limit" "$@" > "$out/$name.log" 2>&1 &
  pids+=($!)
}
case $stage in
  eager)
    for model in qwen3_next qwen3_5; do
      job "e2e_${model}_eager" "${e2e[@]}" --out "$out/e2e_${model}_eager.json" \
        --models "$model" --settings eager
    done
    job pytest_gpu python -m pytest -q -p no:cacheprovider -rs \
      tests/batch_invariance/test_gpu_kernels.py tests/gpu/test_shadow_gpu.py
    job shadow_engine python scripts/shadow_engine_check.py --out "$out/shadow_engine_0.26.0.json"
    ;;
  graphs)
    for model in qwen3_next qwen3_5; do
      for arm in 4 5; do
        job "e2e_${model}_default_arm${arm}" "${e2e[@]}" --case-timeout 540 \
          --out "$out/e2e_${model}_default_arm${arm}.json" --models "$model" --arms "$arm" \
          --settings default
      done
    done
    ;;
  bench)
    timeout "$limit" bash -c "python scripts/bench_engine.py --out '$out/bench_engine.json' \
      --start-timeout 300 > '$out/bench_engine.log' 2>&1; python scripts/bench_shadow.py \
      --engine --out '$out/bench_shadow_engine_0.26.0.json' > '$out/bench_shadow.log' 2>&1" &
    pids+=($!)
    ;;
  *)
    echo "unknown stage $stage (eager, graphs or bench)" >&2
    exit 2
    ;;
esac
for pid in "${pids[@]}"; do
  wait "$pid"
  echo "job pid $pid exit $?"
done
tail -n 4 "$out"/*.log
