"""LongBench (v1) protocol tables for the 16 English subsets.

The two data files are THUDM/LongBench (v1) `config/dataset2prompt.json` (prompt templates) and
`config/dataset2maxlen.json` (maximum new tokens), restricted to the English subsets; shipped in
dustin_eval/data/ as longbench_dataset2prompt.json and longbench_dataset2maxlen.json.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from types import MappingProxyType

DATASETS: tuple[str, ...] = (
    "narrativeqa",
    "qasper",
    "multifieldqa_en",
    "hotpotqa",
    "2wikimqa",
    "musique",
    "gov_report",
    "qmsum",
    "multi_news",
    "trec",
    "triviaqa",
    "samsum",
    "passage_count",
    "passage_retrieval_en",
    "lcc",
    "repobench-p",
)

# pred.py: "chat models are better off without build prompts on these tasks".
NO_CHAT_DATASETS = frozenset({"trec", "triviaqa", "samsum", "lcc", "repobench-p"})

# pred.py: samsum also stops at a newline and generates at least one token.
NEWLINE_STOP_DATASETS = frozenset({"samsum"})


def _load(name: str) -> dict:
    return json.loads(resources.files("dustin_eval").joinpath("data", name).read_text("utf-8"))


@cache
def prompt_templates() -> MappingProxyType[str, str]:
    """dataset -> template with `{context}` and `{input}` fields."""
    return MappingProxyType(_load("longbench_dataset2prompt.json"))


@cache
def max_new_tokens() -> MappingProxyType[str, int]:
    """dataset -> maximum number of new tokens."""
    return MappingProxyType(_load("longbench_dataset2maxlen.json"))
