"""Small model folders (config, tokenizer) that vLLM serves with dummy weights: for the demo,
the tests and the evidence harness."""
