"""Eager PyTorch implementations of the kernel checks: one module per Triton module of ``kernels/``, one function
per launcher, with the launcher's name, signature (less its launch knobs), outputs and refusals.

They are the suite's second implementation of every kernel contract: judged by the same families and oracles
as the production kernels (``tests/test_eager.py``), and the example of what ``--impl`` judges. Plain tensor
ops on any device; nothing here is a reference (``reference/`` is the oracle, float64 and loop by loop).
"""
