"""Benchmarks: training-step throughput against Hugging Face BERT, data path, fine-tuning.

Run from the repository root as modules, e.g. ``python -m benchmarks.train_step --help``. Results go to
``benchmarks/results/`` (git-ignored); the figures we measured are in ``BENCHMARKS.md``.
"""
