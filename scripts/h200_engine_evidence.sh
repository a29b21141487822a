#!/usr/bin/env bash
# GPU machine, vLLM 0.26.0's real engine: the batch-invariance, golden-mode and shadow evidence
# in stages that each fit one device call. Every job is cut at LIMIT seconds and writes its
# JSON as it goes (the scripts rewrite their file after every case), so what finished comes back.
#   call 1: bash .device-engine-so/stage.sh                       (carry .device-engine-so)
#   call 2: source .device-engine/enter.sh && bash scripts/h200_engine_evidence.sh $OUT eager
#   call 3: source .device-engine/enter.sh && bash scripts/h200_engine_evidence.sh $OUT graphs
#   ...     the other stages below, one call each or several in one call
# (every call after the first carries .device-engine; a machine idle for 30 s goes back, so
# issue them back to back. Where the whole .device-engine and the tree pass the 64 MiB a call
# takes, scripts/h200_engine_stage.sh sets the engine up in three calls instead.)
# Usage: h200_engine_evidence.sh OUT STAGE [LIMIT]; E2E_MODELS (default "qwen3_next qwen3_5").
# Stages:
#   eager         e2e arms 1-5 eager per model, the GPU kernel tests of batch-invariant mode and
#                 of the shadow checker; in parallel
#   graphs        e2e arms 4 and 5 in vLLM's default setting (torch.compile, CUDA graphs, prefix
#                 caching) per model, one process per model and arm, in parallel
#   bench         the engine benchmark with its kernel-time profile (alone on the GPU)
#   golden-bench  mode golden against mode route in the engine benchmark: the decode-heavy
#                 workload (1536 new tokens, rounds of ~9 s per arm) and inter-token latency,
#                 9 rounds, each engine on its own share of the CPUs, then one profiled decode
#                 run per arm (device time by kernel category; alone on the GPU;
#                 copy $OUT/bench_engine_golden.json to docs/evidence/)
#   golden-profile mode golden against mode route by device time: one short timed round, then
#                 3 profiled decode runs per arm, arms alternating (each round's device-time
#                 ratio and their spread, which the host's noise does not move)
#   engine-decode the recurrent step on the engine's own tensors (engine_decode_layout.py,
#                 vLLM's own call in mode route, then mode golden's launch): the first pays
#                 the cold Triton cache's compiles of vLLM's kernels (at 168d930 mode golden's
#                 first did not reach its first step in 160 s), so it gets 300 s, the second
#                 200 s; one call (stage golden-profile counts the decode launches by grid)
#   golden-deep   golden-bench's decode workload (512 new tokens, 7 rounds, then 3 profiled
#                 runs per arm) with a deeper bench model: DEEP_LAYERS layers (default 24, a
#                 multiple of 4) and max_num_seqs DEEP_MAX_NUM_SEQS (default 256, above the
#                 workload's 128 sequences): with 48 layers the default 8 GiB KV cache held 642
#                 Mamba cache blocks, and vLLM refused its default 1024 sequences
#   golden-long   the acceptance run of mode golden against mode route: golden-deep's model,
#                 golden-bench's workloads (1536 new tokens, rounds of ~12.5 s per arm with 24
#                 layers on an H100, and inter-token latency), one untimed round, then 6
#                 timed ones (about 530 s: the engines took 200-270 s to start, a round about
#                 33 s; at 60f08a8, with 7, the limit cut the 6th), no profile, vLLM's engine
#                 stats on (each round's preemptions), $OUT/gpu_samples.csv and
#                 gpu_samples_cpu.txt beside it (nvidia-smi and /proc/stat every 2 s), and
#                 then $OUT/round_samples.json and .log: engine_round_samples.py's lines;
#                 DEEP_LAYERS (default 24) and LONG_NEW_TOKENS (default 1536) set the model's
#                 layers and the decode rounds' new tokens (48 and 768: Qwen3-Next's depth, a
#                 GPU step twice as long for the same host work, rounds as long as 24 x 1536);
#                 START_TIMEOUT (default 400 s) the engines' start limit
#                 (copy $OUT/bench_engine_golden_long.json to docs/evidence/bench_engine_golden.json)
#   kernels       the golden kernels' GPU tests (bitwise against the goldens, launch path), then
#                 bench_decode.py --quick --rounds 7 --what-if at every batch size (alone on the
#                 GPU; copy $OUT/bench_decode.json to docs/evidence/; on an H100 the tests
#                 took 226-268 s and the bench 113 s to 135+ s: LIMIT 180); needs no stage.sh
#                 either: source scripts/h200_layer_env.sh
#   kernel-sweep  the recurrent and conv kernels' launch shapes that bench_decode.py --sweep
#                 times, checked for the goldens' bits, then timed at every batch size, the
#                 largest first (alone on the GPU; the JSON is rewritten after every case;
#                 python scripts/bench_decode.py --sweep-table $OUT/bench_decode_sweep.json);
#                 one call: source scripts/h200_layer_env.sh instead of enter.sh, no stage.sh
#   pipelined     the recurrent kernel's loop software-pipelined (bench_decode.py --pipelined:
#                 the variants of gdn_evidence/harness/pipelined_kernel.py against vLLM and ours,
#                 alternating, with their bits compared with ours) from B = 1024 down to 8
#                 (alone on the GPU); one call: source scripts/h200_layer_env.sh, no stage.sh
#   loads-ahead   the recurrent kernel with its loads earlier
#                 (gdn_evidence/harness/loads_ahead_kernel.py): every load that does not depend
#                 on the state's block first (bench_decode.py --early-loads), the state asked
#                 into L2 ahead (--l2-prefetch), each set against vLLM and ours, alternating,
#                 with its bits compared with ours, from B = 1024 down to 1 (alone on the GPU);
#                 one call: source scripts/h200_layer_env.sh, no stage.sh
#   output-store  each block's outputs stored from the K-sum's layout, not through shared
#                 memory (bench_decode.py --output-store: loads_ahead_kernel's OUT_AS_HELD, with
#                 and without the L2 request), against vLLM and ours, alternating, with its bits
#                 compared with ours, B = 1024 down to 1 (alone on the GPU); source
#                 scripts/h200_layer_env.sh, no stage.sh
#   flushes       which L2 flush before a cold call makes bench_decode.py's recurrent step time as
#                 the engine's profile does (82bf7a3 at B = 128: vLLM 91.03, ours 94.96, ours
#                 with the L2 request 98.55 µs a launch): --l2-prefetch (ours, l2_ahead_1, ...)
#                 with --flush read, then --flush rewrite, B = 1024 down to 64 (alone on the GPU);
#                 source scripts/h200_layer_env.sh, no stage.sh
#   block-order   a program's blocks taken from block i_nh % CHUNKS on (bench_decode.py
#                 --block-order: harness/block_order_kernel.py, rotated and in ours' order), then
#                 --flush read (the cold calls as 82bf7a3's engine profile timed them), against
#                 vLLM and ours, alternating, with its bits compared with ours, B = 1024 down to
#                 32 (alone on the GPU); source scripts/h200_layer_env.sh, no stage.sh
#   tma           the state's blocks read through a tensor descriptor (bench_decode.py --tma:
#                 harness/tma_kernel.py, 1 to 4 stages), --flush read, against vLLM and ours,
#                 alternating, with its bits compared with ours, B = 1024 down to 32 (alone on
#                 the GPU); source scripts/h200_layer_env.sh, no stage.sh
#   full-lines    ours with each warp's load of the state covering whole 128-byte lines
#                 (bench_decode.py --full-lines), against vLLM and ours, alternating, with its
#                 bits compared with ours, B = 1024 down to 8 (alone on the GPU); source
#                 scripts/h200_layer_env.sh, no stage.sh
#   counters      Nsight Compute's counters for vLLM's recurrent kernel and ours at B = 1, 4, 8
#                 and 128 (profile_recurrent.py; alone on the GPU); source
#                 scripts/h200_layer_env.sh, no stage.sh
#   shadow        the shadow engine check, one process per mode (route, off, golden), and the
#                 prefill stage diagnostic; in parallel
#   shadow-bench  the shadow overhead in the engine, then the decode kernels' launch-shape
#                 sweep (one after the other, alone on the GPU)
#   shadow-overhead  the shadow checker's GPU tests, then its overhead: the compare alone, the
#                 layer level, the engine (one after the other, alone on the GPU)
#   shadow-engine the shadow overhead in the engine (alone), then the shadow engine check's
#                 route arm beside the shadow compare and reference GPU tests
#   shadow-profile the shadow compare and reference GPU tests, then where a checked layer's
#                 time goes and the overhead: the layer level, the engine (alone on the GPU),
#                 then the shadow checker's layer GPU tests
#   shadow-layer  the shadow overhead at the layer level alone (where a checked layer's host
#                 time goes)
#   checks        timing-free: the shadow engine check's mode off arm, its mode golden arm with
#                 a float32 state, the mixed-step compositions in mode golden, and the GPU
#                 kernel tests of batch-invariant mode and of mode golden; in parallel
# Engines that start together get a fixed KV cache (--kv-cache-gib), so that none sizes its
# cache from the memory the others happen to hold at that moment.
# Merge afterwards: python scripts/e2e_determinism.py --out docs/evidence/e2e_determinism.json \
#   --merge <the e2e_*.json files>
# EVIDENCE_DRY_RUN=1 prints each job's command line (shell-quoted, one a line) instead of
# running it (tests/harness/test_evidence_stages.py parses them with their scripts' parsers).
set -u
dry=${EVIDENCE_DRY_RUN:-}
out=$1
stage=$2
limit=${3:-560}
mkdir -p "$out"
export VLLM_CACHE_ROOT=${VLLM_CACHE_ROOT:-/tmp/vllm-cache}
models=${E2E_MODELS:-qwen3_next qwen3_5}
e2e=(python scripts/e2e_determinism.py --gpu-memory-utilization 0.12 --kv-cache-gib 2
  --case-timeout "$limit")
pids=()
job() {  # job NAME COMMAND...: run in the background, cut at $limit, log to $out/NAME.log
  local name=$1
  shift
  if [ -n "$dry" ]; then printf '%q ' "$@"; echo; return; fi
  timeout "$limit" "$@" > "$out/$name.log" 2>&1 &
  pids+=($!)
}
samplers=()
samples() {  # samples NAME: every 2 s until the stage's jobs end, the GPU's clocks, power,
  # temperature, clock event reasons and utilization ($out/NAME.csv), and the host's CPU time
  # by kind, steal included ($out/NAME_cpu.txt: Unix time, then /proc/stat's cpu line)
  [ -n "$dry" ] && return
  nvidia-smi --format=csv -l 2 --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,\
temperature.gpu,clocks_event_reasons.active,utilization.gpu > "$out/$1.csv" 2>&1 &
  samplers+=($!)
  while true; do echo "$(date +%s.%N) $(head -n 1 /proc/stat)"; sleep 2; done \
    > "$out/$1_cpu.txt" &
  samplers+=($!)
}
now() {  # now NAME SECONDS COMMAND...: run in the foreground, cut at SECONDS
  local name=$1 seconds=$2
  shift 2
  if [ -n "$dry" ]; then printf '%q ' "$@"; echo; return; fi
  timeout "$seconds" "$@" > "$out/$name.log" 2>&1
  echo "job $name exit $?"
}
case $stage in
  eager)
    for model in $models; do
      job "e2e_${model}_eager" "${e2e[@]}" --out "$out/e2e_${model}_eager.json" \
        --models "$model" --settings eager
    done
    job pytest_gpu python -m pytest -q -p no:cacheprovider -rs \
      tests/batch_invariance/test_gpu_kernels.py tests/gpu/test_shadow_gpu.py
    ;;
  graphs)
    for model in $models; do
      for arm in 4 5; do
        job "e2e_${model}_default_arm${arm}" "${e2e[@]}" \
          --out "$out/e2e_${model}_default_arm${arm}.json" --models "$model" --arms "$arm" \
          --settings default
      done
    done
    ;;
  bench)
    job bench_engine python scripts/bench_engine.py --out "$out/bench_engine.json" \
      --start-timeout 300 --profile
    ;;
  golden-bench)
    job bench_engine_golden python scripts/bench_engine.py --arms route,golden \
      --workloads decode,itl --decode-new-tokens 1536 --rounds 9 --start-timeout 300 \
      --pin-cpus --profile decode --out "$out/bench_engine_golden.json"
    ;;
  golden-profile)
    now bench_engine_golden_profile "$limit" python scripts/bench_engine.py --arms route,golden \
      --workloads decode --decode-new-tokens 256 --rounds 1 --start-timeout 300 --pin-cpus \
      --profile decode --profile-rounds 3 --out "$out/bench_engine_golden_profile.json"
    ;;
  engine-decode)
    now engine_decode_layout_route 300 python scripts/engine_decode_layout.py --mode route \
      --out "$out/engine_decode_layout_route.json"
    now engine_decode_layout 200 python scripts/engine_decode_layout.py \
      --out "$out/engine_decode_layout.json"
    ;;
  golden-deep)
    job bench_engine_golden_deep python scripts/bench_engine.py --arms route,golden \
      --workloads decode --decode-new-tokens 512 --rounds 7 --start-timeout 400 --pin-cpus \
      --num-layers "${DEEP_LAYERS:-24}" --gpu-memory-utilization 0.4 \
      --max-num-seqs "${DEEP_MAX_NUM_SEQS:-256}" --profile decode \
      --profile-rounds 3 --out "$out/bench_engine_golden_deep.json"
    ;;
  golden-long)
    samples gpu_samples
    job bench_engine_golden_long python scripts/bench_engine.py --arms route,golden \
      --workloads decode,itl --decode-new-tokens "${LONG_NEW_TOKENS:-1536}" --rounds 6 \
      --settle-rounds 1 --start-timeout "${START_TIMEOUT:-400}" --pin-cpus \
      --num-layers "${DEEP_LAYERS:-24}" \
      --gpu-memory-utilization 0.4 --max-num-seqs "${DEEP_MAX_NUM_SEQS:-256}" --log-stats \
      --out "$out/bench_engine_golden_long.json"
    ;;
  kernels)
    now pytest_kernels 300 python -m pytest -q -p no:cacheprovider -rs \
      tests/gpu/test_kernels_bitwise.py tests/gpu/test_kernels_launch.py \
      tests/gpu/test_profiling_gpu.py
    now bench_decode "$limit" python scripts/bench_decode.py --quick --rounds 7 --what-if \
      --out "$out/bench_decode.json"
    ;;
  kernel-sweep)
    now pytest_sweep_shapes 180 python -m pytest -q -p no:cacheprovider -rs \
      tests/gpu/test_kernels_bitwise.py -k launch_shapes_of_the_sweep
    now bench_decode_sweep "${SWEEP_LIMIT:-370}" python scripts/bench_decode.py --quick \
      --ops recurrent,conv --sweep recurrent,conv --sweep-from 1 \
      --batch-sizes 1024,512,256,128,64,32,16,8,4,2,1 --out "$out/bench_decode_sweep.json"
    ;;
  pipelined)
    now bench_decode_pipelined "$limit" python scripts/bench_decode.py --quick --rounds 1 \
      --ops recurrent --pipelined --batch-sizes 1024,512,256,128,64,32,16,8 \
      --out "$out/bench_decode_pipelined.json"
    ;;
  loads-ahead)
    now bench_decode_loads_ahead "$limit" python scripts/bench_decode.py --quick --rounds 1 \
      --ops recurrent --early-loads --l2-prefetch \
      --batch-sizes 1024,512,256,128,64,32,16,8,4,2,1 --out "$out/bench_decode_loads_ahead.json"
    ;;
  flushes)
    for flush in read rewrite; do
      now "bench_decode_flush_$flush" "$limit" python scripts/bench_decode.py --quick --rounds 3 \
        --ops recurrent --l2-prefetch --flush "$flush" --batch-sizes 1024,512,256,128,64 \
        --out "$out/bench_decode_flush_$flush.json"
    done
    ;;
  output-store)
    now bench_decode_output_store "$limit" python scripts/bench_decode.py --quick --rounds 1 \
      --ops recurrent --output-store \
      --batch-sizes 1024,512,256,128,64,32,16,8,4,2,1 --out "$out/bench_decode_output_store.json"
    ;;
  block-order)
    now bench_decode_block_order "$limit" python scripts/bench_decode.py --quick --rounds 1 \
      --ops recurrent --block-order --flush read --batch-sizes 1024,512,256,128,64,32 \
      --out "$out/bench_decode_block_order.json"
    ;;
  tma)
    now bench_decode_tma "$limit" python scripts/bench_decode.py --quick --rounds 1 \
      --ops recurrent --tma --flush read --batch-sizes 1024,512,256,128,64,32 \
      --out "$out/bench_decode_tma.json"
    ;;
  full-lines)
    now bench_decode_full_lines "$limit" python scripts/bench_decode.py --quick --rounds 1 \
      --ops recurrent --full-lines --batch-sizes 1024,512,256,128,64,32,16,8 \
      --out "$out/bench_decode_full_lines.json"
    ;;
  counters)
    now ncu_recurrent "$limit" python scripts/profile_recurrent.py --batch-sizes 1,4,8,128 \
      --out "$out/ncu_recurrent.json"
    ;;
  shadow)
    for arm in route off golden; do
      job "shadow_engine_$arm" python scripts/shadow_engine_check.py --kv-cache-gib 4 \
        --arms "$arm" --out "$out/shadow_engine_${arm}_0.26.0.json"
    done
    job prefill_stage_bits python scripts/prefill_stage_bits.py --out "$out/prefill_stage_bits.json"
    ;;
  shadow-bench)
    now bench_shadow "$limit" python scripts/bench_shadow.py --engine \
      --out "$out/bench_shadow_engine_0.26.0.json"
    now bench_decode "${SWEEP_LIMIT:-240}" python scripts/bench_decode.py --sweep \
      --batch-sizes 64,256,1024 --out "$out/bench_decode_sweep_0.26.0.json"
    ;;
  shadow-overhead)
    now pytest_shadow_gpu 240 python -m pytest -q -p no:cacheprovider -rs \
      tests/gpu/test_shadow_compare_gpu.py tests/gpu/test_shadow_reference_gpu.py \
      tests/gpu/test_shadow_gpu.py
    now bench_shadow_compare 90 python scripts/bench_shadow.py --compare --steps 20 \
      --out "$out/bench_shadow_compare_0.26.0.json"
    now bench_shadow_layer 150 python scripts/bench_shadow.py --steps 32 \
      --out "$out/bench_shadow_layer_0.26.0.json"
    now bench_shadow "$limit" python scripts/bench_shadow.py --engine \
      --out "$out/bench_shadow_engine_0.26.0.json"
    ;;
  shadow-engine)
    now bench_shadow "$limit" python scripts/bench_shadow.py --engine \
      --out "$out/bench_shadow_engine_0.26.0.json"
    job shadow_engine_route python scripts/shadow_engine_check.py --kv-cache-gib 4 \
      --arms route --out "$out/shadow_engine_route_0.26.0.json"
    job pytest_shadow_gpu python -m pytest -q -p no:cacheprovider -rs \
      tests/gpu/test_shadow_compare_gpu.py tests/gpu/test_shadow_reference_gpu.py
    ;;
  shadow-profile)
    now pytest_shadow_gpu 90 python -m pytest -q -p no:cacheprovider -rs \
      tests/gpu/test_shadow_compare_gpu.py tests/gpu/test_shadow_reference_gpu.py
    now bench_shadow_layer 150 python scripts/bench_shadow.py --steps 32 \
      --out "$out/bench_shadow_layer_0.26.0.json"
    now bench_shadow "$limit" python scripts/bench_shadow.py --engine \
      --out "$out/bench_shadow_engine_0.26.0.json"
    now pytest_shadow_layer_gpu 170 python -m pytest -q -p no:cacheprovider -rs \
      tests/gpu/test_shadow_gpu.py
    ;;
  shadow-layer)
    now bench_shadow_layer "$limit" python scripts/bench_shadow.py --steps 32 \
      --out "$out/bench_shadow_layer_0.26.0.json"
    ;;
  checks)
    job shadow_engine_off python scripts/shadow_engine_check.py --kv-cache-gib 4 \
      --arms off --out "$out/shadow_engine_off_0.26.0.json"
    job shadow_engine_golden_fp32 python scripts/shadow_engine_check.py --kv-cache-gib 4 \
      --arms golden --state-dtype float32 --out "$out/shadow_engine_golden_fp32_0.26.0.json"
    job msi_golden python scripts/mixed_step_invariance.py --mode golden \
      --out "$out/msi_0.26.0_golden.json"
    job pytest_gpu python -m pytest -q -p no:cacheprovider -rs \
      tests/batch_invariance/test_gpu_kernels.py tests/gpu/test_golden_mode.py
    ;;
  *)
    echo "unknown stage $stage (eager, graphs, bench, golden-bench, golden-profile, engine-decode, golden-deep, golden-long, kernels, kernel-sweep, pipelined, loads-ahead, flushes, output-store, block-order, tma, full-lines, counters, shadow, shadow-bench, shadow-overhead, shadow-engine, shadow-profile, shadow-layer or checks)" >&2
    exit 2
    ;;
esac
[ -n "$dry" ] && exit 0
for pid in "${pids[@]}"; do
  wait "$pid"
  echo "job pid $pid exit $?"
done
[ ${#samplers[@]} -gt 0 ] && kill "${samplers[@]}"
if [ "$stage" = golden-long ]; then  # the timed workloads lined up with the samples
  python scripts/engine_round_samples.py "$out/bench_engine_golden_long.json" \
    --gpu "$out/gpu_samples.csv" --cpu "$out/gpu_samples_cpu.txt" \
    --json "$out/round_samples.json" > "$out/round_samples.log" 2>&1
fi
tail -n 4 "$out"/*.log
