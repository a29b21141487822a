"""A GDN layer's served rows put back together per request: what the engine evidence of the
response replay captures (docs/replay.md, "The engine evidence").

An engine step runs each GDN layer once over the rows of every scheduled request, packed
request after request. :class:`StepLayout` says which request owns which rows of a step and
from which position of its sequence. :class:`CaptureStore` takes, per layer and step, the
rows' inputs (``mixed_qkv``: q | k | v before the convolution, ``a``, ``b``), their outputs,
and the conv and recurrent state blocks of the step's requests after the step, and keeps them
on their device. :meth:`CaptureStore.requests` gives a layer's rows per request, in position
order (every position from 0 exactly once, checked as the rows arrive), as
:class:`RequestCapture`: the request's token inputs and outputs, its states after the step that
ended its prompt and after its last step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass(frozen=True)
class StepLayout:
    """The rows of one engine step: request ``requests[i]`` owns the next ``counts[i]`` rows,
    its tokens ``starts[i]`` to ``starts[i] + counts[i] - 1``; its prompt has
    ``prompt_lengths[i]`` tokens.

    A request's rows in a step are prompt tokens, or one token after its prompt (a decode
    row): a step whose rows cross a prompt's end is refused (without speculative decoding or
    preemption, vLLM never schedules one).
    """

    requests: tuple[str, ...]
    counts: tuple[int, ...]
    starts: tuple[int, ...]
    prompt_lengths: tuple[int, ...]

    def __post_init__(self) -> None:
        sizes = {len(self.requests), len(self.counts), len(self.starts), len(self.prompt_lengths)}
        if len(sizes) != 1:
            raise ValueError(f"a step layout needs one entry per request in each field: {self}")
        if len(set(self.requests)) != len(self.requests):
            raise ValueError(f"a request appears twice in one step: {self.requests}")
        for request, count, start, prompt in self.rows():
            if count < 1 or start < 0:
                raise ValueError(f"request {request}: {count} rows from position {start}")
            if start < prompt < start + count or (start >= prompt and count != 1):
                raise ValueError(
                    f"request {request}: rows {start} to {start + count - 1} cross the end of "
                    f"its {prompt}-token prompt or are several tokens after it"
                )

    def rows(self) -> list[tuple[str, int, int, int]]:
        """(request, count, start, prompt length) of each request, in row order."""
        return list(zip(self.requests, self.counts, self.starts, self.prompt_lengths, strict=True))

    @property
    def num_rows(self) -> int:
        return sum(self.counts)

    @property
    def decode_rows(self) -> int:
        """Rows past their request's prompt."""
        return sum(c for _, c, s, p in self.rows() if s >= p)

    @property
    def mixes_decode_and_prompt_rows(self) -> bool:
        return 0 < self.decode_rows < self.num_rows


@dataclass(frozen=True)
class LayerWeights:
    """What a GDN layer's core computes with: ``conv_weight`` [dim, W] (vLLM's
    ``conv1d.weight[:, 0]``), ``conv_bias`` [dim] or None, ``A_log`` and ``dt_bias`` [HV],
    the head counts and sizes of this rank, the conv's activation."""

    A_log: Tensor
    dt_bias: Tensor
    conv_weight: Tensor
    conv_bias: Tensor | None
    num_k_heads: int
    head_k_dim: int
    head_v_dim: int
    activation: str | None

    @property
    def scale(self) -> float:
        """The recurrent step's query scale, as vLLM passes it."""
        return self.head_k_dim**-0.5


@dataclass
class RequestCapture:
    """One request's rows of one layer: ``x`` [T, dim], ``a``, ``b`` [T, HV] and the served
    ``out`` [T, HV, V] of its tokens 0 to T-1 (the prompt's ``prompt_tokens``, then the
    response tokens that were fed back); its conv [dim, W-1] and recurrent [HV, V, K] states
    after its prompt and after its last token; how many steps held its rows, how many of those
    held other requests' rows too, and how many mixed decode rows with prompt rows."""

    request: str
    prompt_tokens: int
    x: Tensor
    a: Tensor
    b: Tensor
    out: Tensor
    prompt_conv_state: Tensor
    prompt_state: Tensor
    final_conv_state: Tensor
    final_state: Tensor
    steps: int
    shared_steps: int
    mixed_steps: int

    @property
    def response_tokens(self) -> int:
        return self.x.shape[0] - self.prompt_tokens


@dataclass
class RowsSoFar:
    """A request's rows of one layer as they arrive, and its latest state snapshots."""

    prompt_tokens: int
    chunks: list[tuple[Tensor, Tensor, Tensor, Tensor]] = field(default_factory=list)
    next_position: int = 0
    after_prompt: tuple[Tensor, Tensor] | None = None
    latest: tuple[Tensor, Tensor] | None = None
    steps: int = 0
    shared_steps: int = 0
    mixed_steps: int = 0


class CaptureStore:
    """Every layer's rows and state snapshots, step by step (module docstring)."""

    def __init__(self) -> None:
        self.steps: list[StepLayout] = []
        self.weights: dict[str, LayerWeights] = {}
        self.rows: dict[str, dict[str, RowsSoFar]] = {}

    def begin_step(self, layout: StepLayout) -> int:
        """Register a step's layout (once per step, before its layers record); its index."""
        self.steps.append(layout)
        return len(self.steps) - 1

    def record(
        self,
        layer: str,
        weights: LayerWeights,
        step: int,
        x: Tensor,
        a: Tensor,
        b: Tensor,
        out: Tensor,
        conv_blocks: Tensor,
        state_blocks: Tensor,
    ) -> None:
        """Layer ``layer`` in step ``step``: its rows' inputs ``x`` [R, dim], ``a``, ``b``
        [R, HV] and outputs ``out`` [R, HV, V], packed as the step's layout says, and each of
        the step's requests' conv [dim, W-1] and recurrent [HV, V, K] blocks after the step
        (``conv_blocks``, ``state_blocks``, one per request, in layout order). Tensors are
        kept, not copied: pass tensors nothing writes afterwards. Every check is made before
        anything is recorded: a refused step leaves the store as it was."""
        layout = self.steps[step]
        rows = layout.num_rows
        if x.shape[0] != rows or a.shape[0] != rows or b.shape[0] != rows or out.shape[0] != rows:
            raise ValueError(
                f"layer {layer}, step {step}: the layout has {rows} rows, got "
                f"x {tuple(x.shape)}, a {tuple(a.shape)}, b {tuple(b.shape)}, "
                f"out {tuple(out.shape)}"
            )
        requests = len(layout.requests)
        if conv_blocks.shape[0] != requests or state_blocks.shape[0] != requests:
            raise ValueError(
                f"layer {layer}, step {step}: {requests} requests, got "
                f"{conv_blocks.shape[0]} conv and {state_blocks.shape[0]} "
                "state blocks"
            )
        known = self.rows.get(layer, {})
        for request, _, start, prompt in layout.rows():  # every request, before any is written
            so_far = known.get(request, RowsSoFar(prompt_tokens=prompt))
            if start != so_far.next_position or prompt != so_far.prompt_tokens:
                raise ValueError(
                    f"layer {layer}, step {step}: request {request} has rows from position "
                    f"{start} (prompt {prompt}) where {so_far.next_position} was next "
                    f"(prompt {so_far.prompt_tokens}): a position skipped or repeated"
                )
        self.weights.setdefault(layer, weights)
        per_request = self.rows.setdefault(layer, {})
        first = 0
        for i, (request, count, start, prompt) in enumerate(layout.rows()):
            so_far = per_request.setdefault(request, RowsSoFar(prompt_tokens=prompt))
            end = first + count
            so_far.chunks.append((x[first:end], a[first:end], b[first:end], out[first:end]))
            so_far.next_position = start + count
            so_far.latest = (conv_blocks[i], state_blocks[i])
            if so_far.next_position == prompt:
                so_far.after_prompt = so_far.latest
            so_far.steps += 1
            so_far.shared_steps += requests > 1
            so_far.mixed_steps += layout.mixes_decode_and_prompt_rows
            first = end

    def requests(self, layer: str) -> dict[str, RequestCapture]:
        """Layer ``layer``'s rows per request (module docstring); every request's prompt must
        have ended."""
        captured = {}
        for request, so_far in self.rows.get(layer, {}).items():
            if so_far.after_prompt is None or so_far.latest is None:
                raise ValueError(
                    f"layer {layer}: request {request} stopped at position "
                    f"{so_far.next_position}, inside its {so_far.prompt_tokens}-token prompt"
                )
            x, a, b, out = (torch.cat(parts) for parts in zip(*so_far.chunks, strict=True))
            captured[request] = RequestCapture(
                request=request,
                prompt_tokens=so_far.prompt_tokens,
                x=x,
                a=a,
                b=b,
                out=out,
                prompt_conv_state=so_far.after_prompt[0],
                prompt_state=so_far.after_prompt[1],
                final_conv_state=so_far.latest[0],
                final_state=so_far.latest[1],
                steps=so_far.steps,
                shared_steps=so_far.shared_steps,
                mixed_steps=so_far.mixed_steps,
            )
        return captured
