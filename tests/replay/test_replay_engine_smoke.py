"""The engine evidence's records and comparison on the CPU: the smoke mode of
scripts/replay_engine_check.py (``gdn_evidence.e2e.replay_engine.main``) end to end, and the
comparison failing where it must (a changed served bit, rows given to the wrong request, a
control that does not differ, a skipped position, nothing captured)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from gdn_evidence.e2e.replay_engine import check_store, main
from gdn_evidence.harness.replay_capture import CaptureStore, StepLayout
from gdn_evidence.harness.replay_check import CONTROL_PARTS, REPLAY_PARTS, check_layer, verdict
from gdn_evidence.harness.replay_synthetic import (
    CPU_PATHS,
    HEAD_K,
    HEAD_V,
    NUM_K_HEADS,
    NUM_V_HEADS,
    SMOKE_LAYERS,
    SMOKE_NEW_TOKENS,
    SMOKE_PROMPTS,
    WIDTH,
    serve_synthetic,
    synthetic_schedule,
)
from vllm_gdn_invariant.shadow.bits import raw_bits

LAYER = SMOKE_LAYERS[0]


@pytest.fixture(scope="module")
def store():
    store = CaptureStore()
    serve_synthetic(store)
    return store


def requests_of(store, layer=LAYER):
    captured = store.requests(layer)
    return [captured[f"request-{k}"] for k in range(len(SMOKE_PROMPTS))]


def by_request(cases, kind):
    return {c["request"]: c for c in cases if c["kind"] == kind}


def expected_elements(prompt: int, response: int) -> dict[str, int]:
    dim = 2 * NUM_K_HEADS * HEAD_K + NUM_V_HEADS * HEAD_V
    conv, state = dim * (WIDTH - 1), NUM_V_HEADS * HEAD_V * HEAD_K
    return {
        "prompt_out": prompt * NUM_V_HEADS * HEAD_V,
        "prompt_conv_state": conv,
        "prompt_state": state,
        "response_out": response * NUM_V_HEADS * HEAD_V,
        "final_conv_state": conv,
        "final_state": state,
    }


def test_the_smoke_run_replays_every_layer_and_request_bitwise_and_the_controls_differ(tmp_path):
    out = tmp_path / "replay_smoke.json"
    assert main(["--smoke", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["provenance"]["source_sha256"] and record["provenance"]["smoke"]
    steps = record["provenance"]["engines"]["synthetic"]
    assert steps["steps_mixing_decode_and_prompt_rows"] > 0
    cases = record["cases"]
    assert verdict(cases, min_tokens=SMOKE_NEW_TOKENS - 1) == []
    keys = {(c["layer"], c["request"], c["kind"]) for c in cases}
    assert keys == {
        (layer, k, kind)
        for layer in SMOKE_LAYERS
        for k in range(len(SMOKE_PROMPTS))
        for kind in ("replay", "control")
    }
    for c in cases:
        prompt, response = SMOKE_PROMPTS[c["request"]], SMOKE_NEW_TOKENS - 1
        assert (c["prompt_tokens"], c["tokens"]) == (prompt, response)
        names = REPLAY_PARTS if c["kind"] == "replay" else CONTROL_PARTS
        expected = {n: expected_elements(prompt, response)[n] for n in names}
        assert {n: p["compared"] for n, p in c["parts"].items()} == expected
        assert c["compared_elements"] == sum(expected.values())
    controls = by_request(cases, "control").values()
    assert all(c["parts"]["response_out"]["differing"] > 0 for c in controls)


def test_a_changed_served_bit_is_one_differing_element(store):
    requests = requests_of(store)
    victim = requests[1]
    row = victim.prompt_tokens + 3  # a response token
    changed = victim.out.clone()
    raw_bits(changed)[row, 2, 5] ^= 1
    requests[1] = dataclasses.replace(victim, out=changed)
    cases = check_layer("synthetic", LAYER, store.weights[LAYER], requests, CPU_PATHS)
    replay = by_request(cases, "replay")
    assert replay[1]["differing_elements"] == 1
    assert replay[1]["parts"]["response_out"]["differing"] == 1
    assert replay[0]["differing_elements"] == replay[2]["differing_elements"] == 0


def test_rows_given_to_another_request_differ(store):
    """One response token's inputs exchanged between two requests (a wrong row owner)."""
    requests = requests_of(store)
    first, second = requests[0], requests[1]
    i, j = first.prompt_tokens + 2, second.prompt_tokens + 2
    x0, x1 = first.x.clone(), second.x.clone()
    x0[i], x1[j] = second.x[j], first.x[i]
    requests[0] = dataclasses.replace(first, x=x0)
    requests[1] = dataclasses.replace(second, x=x1)
    cases = check_layer("synthetic", LAYER, store.weights[LAYER], requests, CPU_PATHS)
    replay = by_request(cases, "replay")
    for k in (0, 1):
        assert replay[k]["parts"]["response_out"]["differing"] > 0
        assert replay[k]["parts"]["final_state"]["differing"] > 0
    assert replay[2]["differing_elements"] == 0


def test_a_control_on_the_replays_own_path_does_not_differ_and_fails_the_verdict(store):
    same = dataclasses.replace(CPU_PATHS, control=CPU_PATHS.prompt)
    cases = check_layer("synthetic", LAYER, store.weights[LAYER], requests_of(store), same)
    assert all(c["differing_elements"] == 0 for c in cases)
    problems = verdict(cases, min_tokens=1)
    assert problems == [
        f"synthetic {LAYER} request {k}: the control does not differ"
        for k in range(len(SMOKE_PROMPTS))
    ]


def test_the_verdict_names_failing_replays_short_responses_errors_and_missing_kinds(store):
    cases = check_layer("synthetic", LAYER, store.weights[LAYER], requests_of(store), CPU_PATHS)
    assert verdict(cases, min_tokens=SMOKE_NEW_TOKENS - 1) == []
    assert len(verdict(cases, min_tokens=SMOKE_NEW_TOKENS)) == len(SMOKE_PROMPTS)
    broken = [dict(c) for c in cases]
    broken[0]["differing_elements"] = 1
    del broken[-1]
    broken.append({"model": "qwen3_next", "error": "RuntimeError: boom"})
    assert verdict(broken, min_tokens=1) == [
        "qwen3_next: RuntimeError: boom",
        f"synthetic {LAYER} request 0: replay differs in 1 of "
        f"{cases[0]['compared_elements']} elements",
        f"synthetic {LAYER} request {len(SMOKE_PROMPTS) - 1}: only ['replay']",
    ]


def record_zeros(store: CaptureStore, weights, layout: StepLayout) -> None:
    """A step of ``layout`` recorded into ``store`` for LAYER, every tensor zeros."""
    step = store.begin_step(layout)
    rows, n, dim = layout.num_rows, len(layout.requests), weights.conv_weight.shape[0]
    store.record(
        LAYER, weights, step, torch.zeros(rows, dim), torch.zeros(rows, NUM_V_HEADS),
        torch.zeros(rows, NUM_V_HEADS), torch.zeros(rows, NUM_V_HEADS, HEAD_V),
        torch.zeros(n, dim, WIDTH - 1), torch.zeros(n, NUM_V_HEADS, HEAD_V, HEAD_K),
    )  # fmt: skip


def test_a_skipped_or_repeated_position_is_refused():
    layouts = synthetic_schedule((5, 3), 3, 4)
    store = CaptureStore()
    serve_synthetic(store, prompts=(5, 3), new_tokens=3, budget=4)
    assert [len(store.requests(layer)) for layer in SMOKE_LAYERS] == [2, 2]
    fresh = CaptureStore()

    def record(layout):
        record_zeros(fresh, store.weights[LAYER], layout)

    record(layouts[0])
    assert layouts[0].requests == ("request-0",) and layouts[0].counts == (4,)
    for start in (5, 3):
        late = StepLayout(("request-0",), (1,), (start,), (5,))
        with pytest.raises(ValueError, match=f"request-0 has rows from position {start} .* 4 was"):
            record(late)
    with pytest.raises(ValueError, match="inside its 5-token prompt"):
        fresh.requests(LAYER)


def test_a_refused_step_records_nothing_of_its_other_requests():
    store = CaptureStore()
    serve_synthetic(store, prompts=(5, 3), new_tokens=3, budget=4)
    fresh = CaptureStore()

    def record(layout):
        record_zeros(fresh, store.weights[LAYER], layout)

    def progress():
        return {
            name: (len(r.chunks), r.next_position, r.steps, r.shared_steps, r.latest is None)
            for name, r in fresh.rows[LAYER].items()
        }

    record(StepLayout(("r", "s"), (2, 1), (0, 0), (5, 3)))
    before = progress()
    assert before == {"r": (1, 2, 1, 1, False), "s": (1, 1, 1, 1, False)}
    # r's rows go on from 2; s's skip position 1 and a new request t starts: the step is refused
    bad = StepLayout(("r", "s", "t"), (1, 1, 1), (2, 2, 0), (5, 3, 4))
    with pytest.raises(ValueError, match="request s has rows from position 2"):
        record(bad)
    assert progress() == before


def test_a_step_whose_rows_cross_a_prompts_end_is_refused():
    with pytest.raises(ValueError, match="request r: rows 3 to 6 cross the end of its 5-token"):
        StepLayout(requests=("r",), counts=(4,), starts=(3,), prompt_lengths=(5,))
    with pytest.raises(ValueError, match="rows 5 to 6 cross .* or are several tokens after"):
        StepLayout(requests=("r",), counts=(2,), starts=(5,), prompt_lengths=(5,))
    layout = StepLayout(requests=("r", "s"), counts=(1, 2), starts=(5, 0), prompt_lengths=(5, 9))
    assert layout.mixes_decode_and_prompt_rows and layout.decode_rows == 1


def test_an_engine_whose_layers_were_never_captured_is_an_error_not_an_empty_pass():
    with pytest.raises(RuntimeError, match="_forward_core never ran"):
        check_store("qwen3_next", CaptureStore(), list(SMOKE_LAYERS), [5], 4, CPU_PATHS)


def test_a_request_that_fed_back_fewer_tokens_is_an_error(store):
    with pytest.raises(RuntimeError, match="did not feed back 7 generated tokens"):
        check_store("synthetic", store, [LAYER], list(SMOKE_PROMPTS), 8, CPU_PATHS)
