"""Replaying captured requests of a GDN layer and comparing them with what was served, bit for
bit (docs/replay.md, "The engine evidence").

For one layer, :func:`check_layer` packs its captured requests (replay_capture.py) back to back,
as a trainer would, and runs

* the **replay**: the prompts through the prompt path (in the engine, ``prompt_state``: vLLM's
  batch-invariant prefill), then the responses through ``replay_response`` from the prompt
  path's states. Every prompt and response output, the states after the prompt and the final
  states are compared with the served ones;
* the **control**: the control path (in the engine, ``prompt_state`` over prompt + response,
  i.e. vLLM's chunk kernels over the response too) from fresh states. Its response outputs and
  final states are compared the same way; they must differ.

Each comparison counts the elements whose bit patterns differ (``shadow/bits.py``); a dtype or
shape that differs is an error, not a count. The results are the JSON cases of
``docs/evidence/replay_engine.json``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from gdn_evidence.harness.replay_capture import LayerWeights, RequestCapture
from vllm_gdn_invariant.replay import prompt_state, replay_response
from vllm_gdn_invariant.shadow.bits import differ

# (x, a, b, weights, cu_seqlens, conv_state_dtype) -> (out, final conv states, final states)
# of fresh sequences packed by cu_seqlens
PrefillPath = Callable[
    [Tensor, Tensor, Tensor, LayerWeights, Tensor, torch.dtype], tuple[Tensor, Tensor, Tensor]
]
REPLAY_PARTS = (
    "prompt_out",
    "prompt_conv_state",
    "prompt_state",
    "response_out",
    "final_conv_state",
    "final_state",
)
CONTROL_PARTS = ("response_out", "final_conv_state", "final_state")
MIN_RESPONSE_TOKENS = 64  # the engine acceptance: responses of at least 64 tokens


@dataclass(frozen=True)
class ReplayPaths:
    """The prompt path the replay starts from and the control path, with their names."""

    prompt: PrefillPath
    control: PrefillPath
    prompt_name: str
    control_name: str


def vllm_prefill(
    x: Tensor,
    a: Tensor,
    b: Tensor,
    weights: LayerWeights,
    cu_seqlens: Tensor,
    conv_state_dtype: torch.dtype,
) -> tuple[Tensor, Tensor, Tensor]:
    """``prompt_state`` on fresh sequences: vLLM's batch-invariant prefill (CUDA)."""
    return prompt_state(
        x,
        a,
        b,
        weights.A_log,
        weights.dt_bias,
        weights.conv_weight,
        cu_seqlens,
        num_k_heads=weights.num_k_heads,
        head_k_dim=weights.head_k_dim,
        head_v_dim=weights.head_v_dim,
        conv_bias=weights.conv_bias,
        activation=weights.activation,
        conv_state_dtype=conv_state_dtype,
    )


def replay_arguments(
    weights: LayerWeights,
    x: Tensor,
    a: Tensor,
    b: Tensor,
    conv_state: Tensor,
    state: Tensor,
    cu_seqlens: Tensor,
) -> tuple[tuple[Tensor, ...], dict[str, Any]]:
    """(positional, keyword) arguments of ``replay_response`` (and of ``check_replay_args``)
    for the tokens ``x``, ``a``, ``b`` of ``weights``' layer from the given states."""
    args = (x, a, b, weights.A_log, weights.dt_bias, weights.conv_weight, conv_state, state)
    kwargs = {
        "num_k_heads": weights.num_k_heads,
        "scale": weights.scale,
        "conv_bias": weights.conv_bias,
        "activation": weights.activation,
        "use_qk_l2norm": True,
    }
    return (*args, cu_seqlens), kwargs


VLLM_PATHS = ReplayPaths(
    prompt=vllm_prefill,
    control=vllm_prefill,
    prompt_name="prompt_state (vLLM's prefill functions)",
    control_name="prompt_state over prompt + response (vLLM's chunk kernels on the response)",
)


def offsets(lengths: Iterable[int]) -> Tensor:
    """cu_seqlens (int32, on the CPU) of sequences of ``lengths``."""
    ends = [0]
    for length in lengths:
        ends.append(ends[-1] + length)
    return torch.tensor(ends, dtype=torch.int32)


def compare_part(name: str, got: Tensor, served: Tensor) -> dict[str, int]:
    """Elements compared and elements whose bits differ; a dtype or shape that differs raises."""
    if got.dtype != served.dtype or got.shape != served.shape:
        raise ValueError(
            f"{name}: got {got.dtype}{tuple(got.shape)}, served {served.dtype}{tuple(served.shape)}"
        )
    return {"compared": got.numel(), "differing": differ(got, served)}


def case(kind: str, parts: dict[str, dict[str, int]], **fields: Any) -> dict[str, Any]:
    return {
        "kind": kind,
        **fields,
        "compared_elements": sum(p["compared"] for p in parts.values()),
        "differing_elements": sum(p["differing"] for p in parts.values()),
        "parts": parts,
    }


def check_layer(
    model: str,
    layer: str,
    weights: LayerWeights,
    requests: list[RequestCapture],
    paths: ReplayPaths,
) -> list[dict[str, Any]]:
    """One replay and one control case per request of ``requests`` (module docstring); a
    case's ``request`` is the request's index in ``requests``."""
    if not requests:
        raise ValueError(f"layer {layer}: no request captured")
    prompts = [r.prompt_tokens for r in requests]
    responses = [r.response_tokens for r in requests]
    conv_dtype = requests[0].final_conv_state.dtype

    prompt_part = [slice(0, p) for p in prompts]
    response_part = [slice(p, None) for p in prompts]

    def packed(name: str, parts: list[slice]) -> Tensor:
        return torch.cat([getattr(r, name)[part] for r, part in zip(requests, parts, strict=True)])

    prompt_out, prompt_conv, prompt_final = paths.prompt(
        packed("x", prompt_part),
        packed("a", prompt_part),
        packed("b", prompt_part),
        weights,
        offsets(prompts),
        conv_dtype,
    )
    response_cu = offsets(responses)
    args, kwargs = replay_arguments(
        weights,
        packed("x", response_part),
        packed("a", response_part),
        packed("b", response_part),
        prompt_conv,
        prompt_final,
        response_cu,
    )
    response_out, final_conv, final_state = replay_response(*args, **kwargs)
    whole_cu = offsets(p + n for p, n in zip(prompts, responses, strict=True))
    control_out, control_conv, control_state = paths.control(
        torch.cat([r.x for r in requests]),
        torch.cat([r.a for r in requests]),
        torch.cat([r.b for r in requests]),
        weights,
        whole_cu,
        conv_dtype,
    )

    prompt_cu = offsets(prompts).tolist()
    response_at = response_cu.tolist()
    whole_at = whole_cu.tolist()
    cases = []
    for k, r in enumerate(requests):
        p, n = r.prompt_tokens, r.response_tokens
        common = {
            "model": model,
            "layer": layer,
            "request": k,
            "request_id": r.request,
            "prompt_tokens": p,
            "tokens": n,
        }
        served = {
            "prompt_out": r.out[:p],
            "prompt_conv_state": r.prompt_conv_state,
            "prompt_state": r.prompt_state,
            "response_out": r.out[p:],
            "final_conv_state": r.final_conv_state,
            "final_state": r.final_state,
        }
        replayed = {
            "prompt_out": prompt_out[prompt_cu[k] : prompt_cu[k + 1]],
            "prompt_conv_state": prompt_conv[k],
            "prompt_state": prompt_final[k],
            "response_out": response_out[response_at[k] : response_at[k + 1]],
            "final_conv_state": final_conv[k],
            "final_state": final_state[k],
        }
        control = {
            "response_out": control_out[whole_at[k] + p : whole_at[k + 1]],
            "final_conv_state": control_conv[k],
            "final_state": control_state[k],
        }
        cases.append(
            case(
                "replay",
                {name: compare_part(name, replayed[name], served[name]) for name in REPLAY_PARTS},
                **common,
                path=paths.prompt_name + ", then replay_response",
                steps=r.steps,
                shared_steps=r.shared_steps,
                mixed_steps=r.mixed_steps,
            )
        )
        cases.append(
            case(
                "control",
                {name: compare_part(name, control[name], served[name]) for name in CONTROL_PARTS},
                **common,
                path=paths.control_name,
            )
        )
    return cases


def verdict(cases: list[dict[str, Any]], min_tokens: int = MIN_RESPONSE_TOKENS) -> list[str]:
    """What keeps ``cases`` from being the evidence (empty: nothing): an error record, a
    replay case with a differing element or nothing compared or fewer than ``min_tokens``
    response tokens, a control case without a differing element, a (model, layer, request)
    without both kinds."""
    problems = [f"{c.get('model')}: {c['error']}" for c in cases if "error" in c]
    kinds: dict[tuple, set[str]] = {}
    for c in cases:
        if "error" in c:
            continue
        where = f"{c['model']} {c['layer']} request {c['request']}"
        kinds.setdefault((c["model"], c["layer"], c["request"]), set()).add(c["kind"])
        if c["kind"] == "replay":
            if c["differing_elements"] or not c["compared_elements"]:
                problems.append(
                    f"{where}: replay differs in {c['differing_elements']} of "
                    f"{c['compared_elements']} elements"
                )
            if c["tokens"] < min_tokens:
                problems.append(f"{where}: {c['tokens']} response tokens (< {min_tokens})")
        elif not c["differing_elements"]:
            problems.append(f"{where}: the control does not differ")
    problems += [
        f"{model} {layer} request {request}: only {sorted(found)}"
        for (model, layer, request), found in kinds.items()
        if found != {"replay", "control"}
    ]
    return problems


def results_table(cases: list[dict[str, Any]]) -> str:
    """The Markdown table of a file's cases: per model and layer, the requests, their prompt and
    response tokens, and the elements compared and differing in the replay and the control."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for c in cases:
        if "error" in c:
            continue
        row = rows.setdefault((c["model"], c["layer"]), {"prompts": [], "tokens": 0})
        totals = row.setdefault(c["kind"], [0, 0])
        totals[0] += c["differing_elements"]
        totals[1] += c["compared_elements"]
        if c["kind"] == "replay":
            row["prompts"].append(c["prompt_tokens"])
            row["tokens"] += c["tokens"]
    lines = [
        "| model | layer | prompts (tokens) | response tokens | replay: differing / compared "
        "| control: differing / compared |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for (model, layer), row in sorted(rows.items()):
        replay, control = row.get("replay", [0, 0]), row.get("control", [0, 0])
        lines.append(
            f"| {model} | {layer} | {', '.join(map(str, row['prompts']))} | {row['tokens']} "
            f"| {replay[0]:,} / {replay[1]:,} | {control[0]:,} / {control[1]:,} |"
        )
    return "\n".join(lines)
