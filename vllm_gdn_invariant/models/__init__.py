"""Small model folders for the demo, the tests and the evidence scripts: ``tiny.py`` (config
and tokenizer, served with dummy weights) and ``weighted.py`` (tiny Qwen3-Next and Qwen3.5
with seeded random weights as safetensors, for end-to-end comparisons)."""
