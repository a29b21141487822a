"""The shadow checker (``VLLM_GDN_INVARIANT_SHADOW``): staging validation of served decode rows.

For a sample of decode rows in each GDN layer it copies the rows' inputs and state blocks
before the step, lets the serving kernels run, recomputes the rows from the copies with a
reference (the PyTorch goldens, or vLLM's decode-only path) and compares output, recurrent
state and conv state bit for bit, writing one JSONL record per check and Prometheus metrics.
It never changes what is served. One module per job:

* ``config.py``: the setting (rate, reference, output file, seed, caps);
* ``sampling.py``: which decode rows of a step are checked;
* ``snapshot.py``: the copies taken before the step;
* ``reference.py``: the goldens, or vLLM's decode-only path, on the copies;
* ``bits.py``: equal bits, differing elements and ULP distances of float tensors (also the
  terms of every bitwise test and evidence script);
* ``compare.py``: served against reference, in the terms of ``bits.py``, and
  ``compare_kernel.py``: the same statistics in one pass on CUDA;
* ``record.py``: the JSONL records and the per-process file;
* ``metrics.py``: the Prometheus metrics and their way to vLLM's ``/metrics``;
* ``checker.py``: the sequence around one serving call, and failure handling.

The hooks that call it are a patch (``vllm_gdn_invariant/patches/shadow.py``);
``python -m vllm_gdn_invariant report`` reads the JSONL files.
"""
