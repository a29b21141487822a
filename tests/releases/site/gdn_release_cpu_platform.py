"""A ``vllm.platform_plugins`` entry point of the release trees: vLLM's own CPU platform.

Releases differ in how they detect a CPU build (a ``+cpu`` version, ``VLLM_TARGET_DEVICE``);
an out-of-tree platform plugin is the one mechanism all of them honour.
"""


def cpu_platform() -> str:
    return "vllm.platforms.cpu.CpuPlatform"
