"""docs/replay.md's engine evidence: the workload it describes is the runner's, and against
docs/evidence/replay_engine.json (skipped while the file is absent) the doc's tables are the
file's and the file holds the acceptance of issue 21 (every GDN layer of every model replayed
bit for bit for requests of at least 64 response tokens, controls differing, steps that mixed
requests)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gdn_evidence.e2e.replay_engine import (
    MAX_NUM_BATCHED_TOKENS,
    NEW_TOKENS,
    PROMPTS,
    evidence_tables,
)
from gdn_evidence.harness.replay_check import MIN_RESPONSE_TOKENS, verdict

from ..doc_blocks import marked_block

ROOT = Path(__file__).resolve().parents[2]
EVIDENCE = ROOT / "docs" / "evidence" / "replay_engine.json"
DOC = ROOT / "docs" / "replay.md"
MODELS = {"qwen3_next", "qwen3_next_dims", "qwen3_5"}
GDN_LAYERS = 3  # each model: 4 layers, every fourth full attention


@pytest.fixture(scope="module")
def record():
    if not EVIDENCE.exists():
        pytest.skip("docs/evidence/replay_engine.json not yet run")
    return json.loads(EVIDENCE.read_text())


def test_the_doc_describes_the_runners_workload():
    text = " ".join(DOC.read_text().split())
    *first, last = PROMPTS
    assert f"Four prompts of {', '.join(map(str, first))} and {last} tokens" in text
    assert len(PROMPTS) == 4 and all(p % 64 for p in PROMPTS)
    assert f"each generating {NEW_TOKENS} greedy tokens" in text
    assert f"step budget of {MAX_NUM_BATCHED_TOKENS} tokens" in text
    assert f"each request's response is {NEW_TOKENS - 1} tokens" in text


def test_the_docs_tables_are_the_evidence_files(record):
    text = DOC.read_text()
    assert marked_block(text, "replay-engine-tables") == evidence_tables(record)


def test_every_replay_is_bitwise_and_every_control_differs(record):
    cases = record["cases"]
    assert verdict(cases, MIN_RESPONSE_TOKENS) == []
    controls = [c for c in cases if c["kind"] == "control"]
    assert all(c["parts"]["final_conv_state"]["differing"] == 0 for c in controls)


def test_every_gdn_layer_of_every_model_and_every_request_is_covered(record):
    cases = record["cases"]
    assert {c["model"] for c in cases} == MODELS
    for model in MODELS:
        engine = record["provenance"]["engines"][model]
        assert len(engine["gdn_layers"]) == GDN_LAYERS
        assert engine["generated_tokens"] == [NEW_TOKENS] * len(PROMPTS)
        assert engine["recurrent_state"] == "torch.float32"
        assert engine["steps_mixing_decode_and_prompt_rows"] > 0
        replay = [c for c in cases if c["model"] == model and c["kind"] == "replay"]
        assert {(c["layer"], c["request"]) for c in replay} == {
            (layer, k) for layer in engine["gdn_layers"] for k in range(len(PROMPTS))
        }
        assert all(c["prompt_tokens"] == PROMPTS[c["request"]] for c in replay)
        assert all(c["tokens"] == NEW_TOKENS - 1 >= MIN_RESPONSE_TOKENS for c in replay)
        assert all(c["shared_steps"] > 0 for c in replay)
    assert any(p % 64 for p in record["provenance"]["prompts"])


def test_each_engine_ran_mode_golden_under_batch_invariant_mode_eager(record):
    for engine in record["provenance"]["engines"].values():
        assert (engine["mode"], engine["batch_invariant"]) == ("golden", "1")
        assert "mode=golden" in engine["plugin"]
        assert engine["cudagraph_mode"].endswith("NONE")


def test_the_doc_quotes_how_much_the_controls_differ(record):
    controls = [c for c in record["cases"] if c["kind"] == "control"]
    shares = [c["differing_elements"] / c["compared_elements"] for c in controls]
    text = " ".join(DOC.read_text().split())
    assert (
        f"differed in {100 * min(shares):.0f} to {100 * max(shares):.0f} % of the elements" in text
    )
