#!/usr/bin/env bash
# GPU machine: vLLM 0.26.0's real engine set up in three calls instead of two, for a working
# tree that, with the whole .device-engine carried, passes the 64 MiB a call takes. It does what
# .device-engine/enter.sh does on its first run, in two parts, each in its own call; enter.sh
# then finds the engine set up and only sets the paths. Each call within 30 s of the one
# before it (a machine idle for 30 s goes back):
#   call 1: bash .device-engine-so/stage.sh
#           carry .device-engine-so (where the tree with it passes 64 MiB too, as at 60f08a8:
#           scripts/split_engine_so.sh here, then two calls, .device-engine-so-1 and -2)
#   call 2: bash scripts/h200_engine_stage.sh moe
#           carry .device-engine/moe.xz and .device-engine/vllm-0.26.0.tar.xz
#   call 3: bash scripts/h200_engine_stage.sh deps && source .device-engine/enter.sh && ...
#           carry .device-engine/deps.tar.xz, .device-engine/sitecustomize.py,
#           .device-engine/enter.sh and .device-commit (python scripts/record_commit.py, run
#           here first: the evidence's provenance takes the commit from it)
# GDN_ENGINE_ROOT moves the target from enter.sh's /tmp/gdn-engine (the tests' own folder).
set -euo pipefail
engine=$PWD/.device-engine
target=${GDN_ENGINE_ROOT:-/tmp/gdn-engine}
if [ ! -f $target/_C_stable_libtorch.abi3.so ]; then
  echo "no $target/_C_stable_libtorch.abi3.so: run .device-engine-so/stage.sh first" >&2
  exit 1
fi
case ${1:-} in
  moe)  # vLLM's Python code with both op libraries
    mkdir -p $target/vllm
    tar -C $target/vllm -xJf "$engine/vllm-0.26.0.tar.xz"
    xz -T0 -dc "$engine/moe.xz" > $target/vllm/vllm/_moe_C_stable_libtorch.abi3.so
    cp $target/_C_stable_libtorch.abi3.so $target/vllm/vllm/
    touch $target/.moe
    ;;
  deps)  # the Python packages, then the mark enter.sh looks for
    [ -f $target/.moe ] || { echo "run h200_engine_stage.sh moe first" >&2; exit 1; }
    mkdir -p $target/site
    tar -C $target/site -xJf "$engine/deps.tar.xz"
    cp "$engine/sitecustomize.py" "$engine/enter.sh" $target/site/
    cp "$engine/enter.sh" $target/enter.sh
    touch $target/.done
    ;;
  *)
    echo "usage: h200_engine_stage.sh moe|deps" >&2
    exit 2
    ;;
esac
ls -la $target
