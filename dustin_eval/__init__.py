"""Evaluation harnesses: LongBench (v1), PG-19-style perplexity windows, passkey retrieval, results.

The runtime plugs in through `dustin_eval.generator.RuntimeGenerator`; nothing here loads a model.
"""
