"""`dustin_eval.acceptance` on tiny models: the shared prefill gives the tokens of an ordinary run, a
budget covering the context keeps everything, a re-run resumes from the runs file, and the
tables are written."""

import json
from dataclasses import replace

import pytest
import torch

from dustin_eval.acceptance import AcceptanceConfig, run_acceptance, write_acceptance
from dustin_runtime.exact import DEFAULT_K
from dustin_runtime.io.provenance import provenance
from dustin_runtime.pipeline import load_pair
from dustin_runtime.sparse.config import SparseConfig
from dustin_runtime.sparse.policies import make_policy
from dustin_runtime.speculative import speculative_generate

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_with_tokenizer):
    root = tmp_path_factory.mktemp("acc")
    t = tiny_with_tokenizer(root / "t", "llama3")
    d = tiny_with_tokenizer(root / "d", "llama3", num_hidden_layers=1)
    books = root / "books"
    books.mkdir()
    for i, word in enumerate(("river", "mountain", "harbour")):
        (books / f"b{i}.txt").write_text(" ".join(f"The {word} number {j} was quiet that year." for j in range(60)))
    tgt, drf = load_pair(str(t), str(d), dtype=torch.float32, device="cpu")
    return tgt, drf, books, root


def test_acceptance_runs_resumes_and_writes(setup):
    tgt, drf, books, root = setup
    cfg = AcceptanceConfig(contexts=(90, 130), windows=2, max_new_tokens=7, gamma=3, budgets=(24, 512),
                           policies=("full", "dustin", "streamingllm", "quest"), books_dir=str(books))
    configs = {b: SparseConfig.all_heads(tgt.model.cfg, drf.model.cfg, b, sinks=2, window=6) for b in cfg.budgets}
    runs = root / "out" / "x.runs.jsonl"
    recs = run_acceptance(tgt, drf, configs, cfg, runs)
    assert len(recs) == 2 * (1 + 3 * 2)
    lines = runs.read_text().splitlines()
    assert len(lines) == len(recs)
    for r in recs:
        assert r["sequences"] == 2 and r["new_tokens"] == 14
        if r["policy"] == "full" or r["budget"] == 512:
            assert r["retention"] == 1 and r["prefix"] == 1 and r["arr"] == pytest.approx(1, abs=1e-5)
        else:
            assert 0 < r["arr"] < 1
        lo, hi = r["retention_ci"]  # 95% bootstrap interval over the 2 windows, around the pooled value
        assert lo - 1e-12 <= r["retention"] <= hi + 1e-12
        lo, hi = r["tau_ci"]
        assert 1 <= lo - 1e-12 <= r["tau"] <= hi + 1e-12 <= 4
        if r["policy"] != "full":
            lo, hi = r["arr_ci"]
            assert lo - 1e-12 <= r["arr"] <= hi + 1e-12
            lo, hi = r["paired_retention_ci"]
            assert lo - 1e-12 <= r["paired_retention"] <= hi + 1e-12
        assert sum(r["tokens_per_sequence"]) == r["new_tokens"]  # accepted counts cut at the length limit
        assert max(r["steps_per_sequence"]) == r["steps"]
    # the shared prefill gives what an ordinary run gives
    full90 = next(r for r in recs if r["context"] == 90 and r["policy"] == "full")
    from dustin_eval.pg19 import iter_windows

    prompts = [w.ids for w in iter_windows(tgt.tokenizer, books, 90, max_windows=2, max_windows_per_book=1)]
    alone = speculative_generate(tgt.model, drf.model, prompts, 7, gamma=3,
                                 hooks=make_policy("full", None, target=tgt.model, draft=drf.model))
    assert alone.tokens == full90["tokens"]
    # a re-run reads the finished runs instead of decoding again
    again = run_acceptance(tgt, drf, configs, cfg, runs)
    assert len(runs.read_text().splitlines()) == len(lines)
    assert [r["tau"] for r in again] == [r["tau"] for r in recs]
    j, m = write_acceptance(again, root / "out", "x", provenance(), cfg, configs)
    doc = json.loads(j.read_text())
    assert {r["policy"] for r in doc["rows"]} == {"full", "dustin", "streamingllm", "quest"}
    assert "tokens" not in doc["runs"][0]
    text = m.read_text()
    assert "context 90" in text and "S=24" in text and "| full |" in text


def test_acceptance_refresh_layers_apply_to_dustin_alone(setup):
    tgt, drf, books, root = setup
    cfg = AcceptanceConfig(contexts=(130,), windows=2, max_new_tokens=7, gamma=3, budgets=(24,),
                           policies=("full", "dustin", "target-only"), books_dir=str(books), paired=False)
    configs = {24: replace(SparseConfig.all_heads(tgt.model.cfg, drf.model.cfg, 24, sinks=2, window=6),
                           refresh_layers=(1,))}
    recs = run_acceptance(tgt, drf, configs, cfg, root / "refresh" / "r.runs.jsonl")
    by = {r["policy"]: r for r in recs}
    assert by["dustin"]["refresh_layers"] == [1]
    assert "refresh_layers" not in by["target-only"] and "refresh_layers" not in by["full"]
    assert 0 < by["dustin"]["arr"] < 1  # measured layer by layer (the refresh makes two sets per pass)
    from dustin_eval.pg19 import iter_windows

    prompts = [w.ids for w in iter_windows(tgt.tokenizer, books, 130, max_windows=2, max_windows_per_book=1)]
    for policy, scfg in (("dustin", configs[24]), ("target-only", replace(configs[24], refresh_layers=()))):
        alone = speculative_generate(tgt.model, drf.model, prompts, 7, gamma=3,
                                     hooks=make_policy(policy, scfg, target=tgt.model, draft=drf.model))
        assert alone.tokens == by[policy]["tokens"], policy
    _, m = write_acceptance(recs, root / "refresh", "r", provenance(), cfg, configs)
    assert "at target layers 1 (refresh layers)" in m.read_text()


def test_acceptance_with_sparse_drafting_reports_paired_drafting(setup):
    tgt, drf, books, root = setup
    cfg = AcceptanceConfig(contexts=(130,), windows=2, max_new_tokens=7, gamma=3, budgets=(24, 512),
                           policies=("full", "dustin", "quest"), books_dir=str(books), measure_arr=False)
    configs = {b: replace(SparseConfig.all_heads(tgt.model.cfg, drf.model.cfg, b, sinks=2, window=6),
                          draft_kv="verify-set") for b in cfg.budgets}
    recs = run_acceptance(tgt, drf, configs, cfg, root / "vs" / "v.runs.jsonl")
    by = {(r["policy"], r["budget"]): r for r in recs}
    assert by[("dustin", 512)]["draft_retention"] == 1  # the set covers the context: the same drafts
    r = by[("dustin", 24)]
    lo, hi = r["draft_retention_ci"]
    assert 0 < lo - 1e-12 <= r["draft_retention"] <= hi + 1e-12
    assert by[("quest", 24)]["draft_retention"] is None and by[("full", None)]["draft_retention"] is None
    _, m = write_acceptance(recs, root / "vs", "v", provenance(), cfg, configs)
    assert "paired drafting retention" in m.read_text()


def test_acceptance_with_context_lookup(setup):
    from dustin_runtime.errors import DustinError
    from dustin_runtime.lookup import LookupConfig

    tgt, drf, books, root = setup
    cfg = AcceptanceConfig(contexts=(90,), windows=2, max_new_tokens=9, gamma=3, budgets=(512,),
                           policies=("full", "dustin"), books_dir=str(books), measure_arr=False, paired=False,
                           lookup=LookupConfig(4, 1))
    configs = {512: SparseConfig.all_heads(tgt.model.cfg, drf.model.cfg, 512, sinks=2, window=6)}
    runs = root / "lk" / "l.runs.jsonl"
    recs = run_acceptance(tgt, drf, configs, cfg, runs)
    for r in recs:  # the books repeat themselves: the first draft of a step is always a copy
        assert r["lookup_share"] >= 0.25 and r["extra"]["draft_lookup"] == "4:1"
    assert recs[0]["tokens"] == recs[1]["tokens"]  # S covers the context: dustin decodes as full
    with pytest.raises(DustinError):  # another lookup is another run: not resumed into this one
        run_acceptance(tgt, drf, configs, replace(cfg, lookup=None), runs)
    _, m = write_acceptance(recs, root / "lk", "l", provenance(), cfg, configs)
    assert "--draft-lookup 4:1" in m.read_text()


def test_windows_per_book_takes_consecutive_windows_and_resamples_books(setup, tmp_path):
    tgt, drf, books, _ = setup
    cfg = AcceptanceConfig(contexts=(90,), windows=4, windows_per_book=2, max_new_tokens=5, gamma=3, budgets=(24,),
                           policies=("full", "dustin"), books_dir=str(books))
    configs = {24: SparseConfig.all_heads(tgt.model.cfg, drf.model.cfg, 24, sinks=2, window=6)}
    recs = run_acceptance(tgt, drf, configs, cfg, tmp_path / "w.runs.jsonl")
    names = recs[0]["books"]
    assert len(names) == 4 and len(set(names)) == 2 and names[0] == names[1] and names[2] == names[3]
    from dustin_eval.pg19 import iter_windows

    want = [w.ids for w in iter_windows(tgt.tokenizer, books, 90, max_windows=4, max_windows_per_book=2)]
    assert [w.index for w in iter_windows(tgt.tokenizer, books, 90, max_windows=4, max_windows_per_book=2)] == [0, 1, 0, 1]
    alone = speculative_generate(tgt.model, drf.model, want, 5, gamma=3,
                                 hooks=make_policy("full", None, target=tgt.model, draft=drf.model))
    assert alone.tokens == recs[0]["tokens"]
    key = json.loads((tmp_path / "w.key.json").read_text())
    assert key["windows_per_book"] == 2
    with pytest.raises(Exception, match="windows_per_book|settings|differ"):  # a resume with other settings is refused
        run_acceptance(tgt, drf, configs, replace(cfg, windows_per_book=1), tmp_path / "w.runs.jsonl")


def test_acceptance_of_exact_policies_records_the_agreement(setup):
    """-x policies beside the plain ones: the output is full verification's (prefix 1) and the record
    holds the per-token agreement of the sparse and full greedy choice, per kind, with intervals."""
    tgt, drf, books, root = setup
    cfg = AcceptanceConfig(contexts=(130,), windows=3, max_new_tokens=12, gamma=3, budgets=(12, 512),
                           policies=("full", "streamingllm", "streamingllm-x", "dustin-x"), books_dir=str(books),
                           measure_arr=False, paired=False)
    configs = {b: SparseConfig.all_heads(tgt.model.cfg, drf.model.cfg, b, sinks=2, window=4) for b in cfg.budgets}
    recs = run_acceptance(tgt, drf, configs, cfg, root / "x" / "x.runs.jsonl")
    by = {(r["policy"], r["budget"]): r for r in recs}
    for (policy, _), r in by.items():
        if policy.endswith("-x"):
            assert r["prefix"] == 1 and r["extra"]["exact_k"] == DEFAULT_K
            for kind in ("", "_draft", "_correction"):
                if f"agreement{kind}_ci" in r:
                    lo, hi = r[f"agreement{kind}_ci"]
                    assert 0 <= lo <= r[f"agreement{kind}"] + 1e-12 and r[f"agreement{kind}"] <= hi + 1e-12 and hi <= 1
        else:
            assert r.get("agreement") is None
    assert by[("streamingllm-x", 512)]["agreement"] == 1  # the set covers the context
    assert by[("streamingllm", 12)]["prefix"] < 1 and by[("streamingllm-x", 12)]["agreement"] < 1
    _, m = write_acceptance(recs, root / "x", "x", provenance(), cfg, configs)
    assert "per-token agreement" in m.read_text()


def test_acceptance_with_vanilla_compares_every_output_with_vanilla_decoding(setup):
    """vanilla: the ar record is plain greedy decoding (equal to `generate` from scratch, not from the shared
    prefill), and every record's prefix_vanilla is its share against it: 1 for full and exact mode, below 1
    for a lossy policy on a set far smaller than the context."""
    from dustin_eval.pg19 import iter_windows
    from dustin_runtime.generate import generate

    tgt, drf, books, root = setup
    cfg = AcceptanceConfig(contexts=(130,), windows=3, max_new_tokens=12, gamma=3, budgets=(12,),
                           policies=("full", "streamingllm", "streamingllm-x"), books_dir=str(books),
                           measure_arr=False, paired=False, vanilla=True)
    configs = {12: SparseConfig.all_heads(tgt.model.cfg, drf.model.cfg, 12, sinks=2, window=4)}
    runs = root / "v" / "v.runs.jsonl"
    recs = run_acceptance(tgt, drf, configs, cfg, runs)
    by = {r["policy"]: r for r in recs}
    prompts = [w.ids for w in iter_windows(tgt.tokenizer, str(books), 130, seed=0, max_windows=3)]
    assert by["ar"]["tokens"] == generate(tgt.model, prompts, 12).tokens and by["ar"]["budget"] is None
    assert by["full"]["prefix_vanilla"] == 1 and by["streamingllm-x"]["prefix_vanilla"] == 1
    assert by["streamingllm"]["prefix_vanilla"] < 1
    again = run_acceptance(tgt, drf, configs, cfg, runs)  # resumed: the ar record too, nothing decoded again
    assert len(runs.read_text().splitlines()) == len(recs) == 4
    assert [r["tokens"] for r in again] == [r["tokens"] for r in recs]
    _, m = write_acceptance(recs, root / "v", "v", provenance(), cfg, configs)
    assert "prefix_vanilla" in m.read_text()
