"""The ranks an end-to-end script can start here: visible GPUs, and CPU thread groups.

vLLM's CPU build runs each tensor-parallel rank as a process whose OpenMP threads it binds to
a NUMA node by default, and refuses more ranks than nodes; ``VLLM_CPU_OMP_THREADS_BIND``
(``"0,1|2,3"``: one group of CPUs per rank) binds them explicitly.
"""

from __future__ import annotations

import os
from collections.abc import Callable

CPU_BINDING_ENV = "VLLM_CPU_OMP_THREADS_BIND"


def visible_gpus() -> int | None:
    """CUDA devices this process sees; None without CUDA (vLLM's CPU build runs ranks as
    processes)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else None


def cpu_thread_binding(ranks: int, cpus: list[int]) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``ranks`` CPU workers: ``cpus`` split into equal
    contiguous groups."""
    if len(cpus) < ranks:
        raise ValueError(f"{ranks} CPU ranks need {ranks} CPUs; this process may use {len(cpus)}")
    per = len(cpus) // ranks
    groups = [sorted(cpus)[r * per : (r + 1) * per] for r in range(ranks)]
    return "|".join(",".join(map(str, group)) for group in groups)


def rank_problems(size: int, gpus: int | None) -> str | None:
    """Why ``size`` ranks cannot start here (None: they can)."""
    if gpus is not None and gpus < size:
        return f"--tensor-parallel-size {size} needs as many GPUs; this machine shows {gpus}"
    return None


def thread_binding_for(size: int, gpus: int | None) -> str | None:
    """The binding to give CPU ranks (None: on GPUs, one rank, or the user set one).
    Raises ValueError when there are fewer CPUs than ranks."""
    if gpus is not None or size <= 1 or CPU_BINDING_ENV in os.environ:
        return None
    return cpu_thread_binding(size, sorted(os.sched_getaffinity(0)))


def check_tensor_parallel(size: int, sharding_problems: Callable[[int], list[str]]) -> str | None:
    """Validate ``--tensor-parallel-size`` ``size`` for a script whose models' sharding
    problems at a size are ``sharding_problems(size)``; return the CPU thread binding to give
    the engines (None: none needed). Raises ValueError with the message for the user."""
    if size < 1:
        raise ValueError("--tensor-parallel-size must be at least 1")
    problems = sharding_problems(size)
    if problems:
        raise ValueError("--tensor-parallel-size: " + "; ".join(problems))
    gpus = visible_gpus()
    problem = rank_problems(size, gpus)
    if problem:
        raise ValueError(problem)
    try:
        return thread_binding_for(size, gpus)
    except ValueError as exc:
        raise ValueError(f"--tensor-parallel-size: {exc}") from None
