"""LongBench (v1) metrics for the 16 English subsets, with the reference's exact semantics.

As THUDM/LongBench `metrics.py` and `eval.py`: ROUGE-L from the `rouge` package (1.0.1) and code
similarity from `fuzzywuzzy`'s `fuzz.ratio`, the packages LongBench's requirements install (without
python-Levenshtein, so `fuzz.ratio` is difflib's ratio; with it fuzzywuzzy would switch to a
different C implementation). Scores are in [0, 1]; a dataset score is their mean x 100, rounded to
2 decimals.
"""

from __future__ import annotations

import re
import string
import warnings
from collections import Counter
from collections.abc import Callable, Sequence

from rouge import Rouge

with warnings.catch_warnings():  # "Using slow pure-python SequenceMatcher": the backend LongBench runs
    warnings.simplefilter("ignore", UserWarning)
    from fuzzywuzzy import fuzz

_PUNCT = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_NUMBER = re.compile(r"\d+")


def normalize_answer(s: str) -> str:
    """Lower-case, drop ASCII punctuation, the articles a/an/the and extra whitespace."""
    s = "".join(ch for ch in s.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", s).split())


def token_f1(prediction: Sequence[str], ground_truth: Sequence[str]) -> float:
    """F1 of two bags of tokens (multiset overlap)."""
    same = sum((Counter(prediction) & Counter(ground_truth)).values())
    if same == 0:
        return 0.0
    precision = same / len(prediction)
    recall = same / len(ground_truth)
    return 2 * precision * recall / (precision + recall)


def qa_f1_score(prediction: str, ground_truth: str, **_) -> float:
    """Bag-of-tokens F1 after `normalize_answer`."""
    return token_f1(normalize_answer(prediction).split(), normalize_answer(ground_truth).split())


def rouge_score(prediction: str, ground_truth: str, **_) -> float:
    """ROUGE-L F: `Rouge().get_scores([prediction], [ground_truth], avg=True)["rouge-l"]["f"]`, 0.0
    where the package raises (an empty text after its sentence split; recursion on very long
    sentences), as LongBench's bare `except` returns."""
    try:
        scores = Rouge().get_scores([prediction], [ground_truth], avg=True)
    except Exception:  # noqa: BLE001 - LongBench scores any failure of the package as 0
        return 0.0
    return scores["rouge-l"]["f"]


def classification_score(prediction: str, ground_truth: str, *, all_classes, **_) -> float:
    """1/k when the truth is among the k class names found in the prediction, else 0.

    Class names that are proper substrings of the truth are dropped from the matches, with the
    reference's remove-while-iterating behaviour (the element after a removed one is not checked).
    """
    matches = [c for c in all_classes if c in prediction]
    i = 0
    while i < len(matches):
        term = matches[i]
        if term in ground_truth and term != ground_truth:
            matches.remove(term)
        i += 1
    return 1.0 / len(matches) if ground_truth in matches else 0.0


def _share_equal(prediction: str, target: str) -> float:
    numbers = _NUMBER.findall(prediction)
    if not numbers:
        return 0.0
    return sum(x == target for x in numbers) / len(numbers)


def retrieval_score(prediction: str, ground_truth: str, **_) -> float:
    """Share of the numbers in the prediction equal to N of the truth's "Paragraph N"."""
    return _share_equal(prediction, re.findall(r"Paragraph (\d+)", ground_truth)[0])


def count_score(prediction: str, ground_truth: str, **_) -> float:
    """Share of the numbers in the prediction equal to the truth."""
    return _share_equal(prediction, str(ground_truth))


def code_sim_score(prediction: str, ground_truth: str, **_) -> float:
    """fuzz.ratio / 100 of the first prediction line without ` or # or //, against the truth."""
    line = ""
    for candidate in prediction.lstrip("\n").split("\n"):
        if "`" not in candidate and "#" not in candidate and "//" not in candidate:
            line = candidate
            break
    return fuzz.ratio(line, ground_truth) / 100


Metric = Callable[..., float]

DATASET2METRIC: dict[str, Metric] = {
    "narrativeqa": qa_f1_score,
    "qasper": qa_f1_score,
    "multifieldqa_en": qa_f1_score,
    "hotpotqa": qa_f1_score,
    "2wikimqa": qa_f1_score,
    "musique": qa_f1_score,
    "gov_report": rouge_score,
    "qmsum": rouge_score,
    "multi_news": rouge_score,
    "trec": classification_score,
    "triviaqa": qa_f1_score,
    "samsum": rouge_score,
    "passage_count": count_score,
    "passage_retrieval_en": retrieval_score,
    "lcc": code_sim_score,
    "repobench-p": code_sim_score,
}

FIRST_LINE_DATASETS = frozenset({"trec", "triviaqa", "samsum"})


def first_line(prediction: str) -> str:
    """The LongBench cut for few-shot tasks: `pred.lstrip('\\n').split('\\n')[0]`."""
    return prediction.lstrip("\n").split("\n")[0]


def score_sample(dataset: str, prediction: str, answers: Sequence[str], all_classes=None) -> float:
    """Best score of the prediction over the ground truths (first-line cut where it applies)."""
    metric = DATASET2METRIC[dataset]
    if dataset in FIRST_LINE_DATASETS:
        prediction = first_line(prediction)
    score = 0.0
    for truth in answers:
        score = max(score, metric(prediction, truth, all_classes=all_classes))
    return score


def dataset_score(scores: Sequence[float]) -> float:
    """Mean x 100, rounded to 2 decimals (LongBench eval.py)."""
    if not scores:
        raise ValueError("no scores")
    return round(100 * sum(scores) / len(scores), 2)
