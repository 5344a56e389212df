"""Evaluation of llava-norm checkpoints on the paper's nine benchmarks.

Owns (in ``llava_norm.evaluation.benchmarks``): reading each benchmark's published data
files, building the community prompt for every item, and scoring model outputs with the
rule that lmms-eval / VLMEvalKit / lm-evaluation-harness apply. Running a model over the
items (generation, log-likelihoods) lives elsewhere in this package.
"""
