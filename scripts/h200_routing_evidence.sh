#!/usr/bin/env bash
# GPU machine: the routing evidence of the vLLM on PYTHONPATH, all arms at once (their bits do
# not depend on what else shares the GPU), each cut at LIMIT seconds so that its JSON (written
# after every case) and log come back within one device call.
#   source .device-bundle/enter.sh 0.34.0   # and FlashInfer on PYTHONPATH (docs/routing.md)
#   bash scripts/h200_routing_evidence.sh OUTDIR [LIMIT] [ARM...]
# Arms: triton (Triton prefill, prefix caching off), flashinfer (FlashInfer prefill,
# mamba_cache_mode=align with 64-token blocks), pytest (the whole test tree in one process,
# minus the tests that download wheels).
set -u
out=$1
limit=${2:-540}
shift 2 || shift $#
arms=("${@:-triton flashinfer pytest}")
v=$(python -c "import vllm; print(vllm.__version__)")
pids=()
for arm in ${arms[@]}; do
  case $arm in
    triton)
      timeout "$limit" python scripts/mixed_step_invariance.py \
        --out "$out/msi_${v}_triton.json" > "$out/msi_${v}_triton.log" 2>&1 & ;;
    flashinfer)
      timeout "$limit" python scripts/mixed_step_invariance.py --prefill-backend flashinfer \
        --align-block-size 64 --out "$out/msi_${v}_flashinfer_align.json" \
        > "$out/msi_${v}_flashinfer_align.log" 2>&1 & ;;
    pytest)
      timeout "$limit" python -m pytest -q -p no:cacheprovider -rs -m "not wheels" tests \
        > "$out/pytest_${v}.log" 2>&1 & ;;
    *) echo "unknown arm $arm" >&2; exit 2 ;;
  esac
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; echo "arm pid $pid exit $?"; done
tail -n 3 "$out"/*.log
