# GPU machine, one call: vLLM 0.26.0's Python code with every compiled op library stubbed, for
# the stages that drive kernels only (kernel-sweep). Source from the project's root in a call
# that carries .device-engine/deps.tar.xz, .device-engine/vllm-0.26.0.tar.xz and
# .device-engine/sitecustomize.py (with the whole folder the call passes 64 MiB), and
# .device-commit (python scripts/record_commit.py, run here first); no stage.sh
# call is needed (the engine stages still need it).
_e=$PWD/.device-engine
_t=/tmp/gdn-layer
if [ ! -f $_t/.done ]; then
  mkdir -p $_t/vllm $_t/site $_t/stubs
  tar -C $_t/vllm -xJf "$_e/vllm-0.26.0.tar.xz" || return 1
  tar -C $_t/site -xJf "$_e/deps.tar.xz" || return 1
  sed 's/"vllm._C", "vllm._moe_C",/"vllm._C", "vllm._moe_C", "vllm._C_stable_libtorch", "vllm._moe_C_stable_libtorch",/' \
    "$_e/sitecustomize.py" > $_t/stubs/sitecustomize.py
  grep -q '"vllm._C_stable_libtorch"' $_t/stubs/sitecustomize.py || { echo "stub list not extended" >&2; return 1; }
  touch $_t/.done
fi
export PYTHONPATH="$PWD:$_t/vllm:$_t/stubs:$_t/site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 VLLM_NATIVE_STUBS=1
unset _e _t
