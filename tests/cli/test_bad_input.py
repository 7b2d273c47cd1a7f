"""The bad-input matrix: every command fed broken files, malformed checkpoints and profiles, and
out-of-range options, through the CLI in a subprocess. Each case must exit 2 with exactly one
non-empty stderr line naming the cause, and no traceback. Truncations of a safetensors file, a
GGUF file and a profile JSON at many offsets must do the same."""

import json
import shutil

import pytest

LATIN1 = "caf\xe9 cr\xe8me, na\xefve".encode("latin-1")  # not UTF-8
DEEP = b"[" * 100_000 + b"]" * 100_000  # valid JSON nested deeper than the parser recurses


def bad_checkpoint(root, name, target, *, config=None, weights=None, tokenizer=True):
    """A copy of the tiny target with its config.json and/or weights replaced."""
    folder = root / name
    folder.mkdir()
    if config is None:
        shutil.copy(target / "config.json", folder / "config.json")
    elif config is not False:
        (folder / "config.json").write_bytes(config if isinstance(config, bytes) else json.dumps(config).encode())
    if weights is None:
        shutil.copy(target / "model.safetensors", folder / "model.safetensors")
    elif weights is not False:
        (folder / "model.safetensors").write_bytes(weights)
    if tokenizer:
        for f in target.glob("*"):
            if "token" in f.name or "chat" in f.name:
                shutil.copy(f, folder / f.name)
    return folder


def damaged(model, name: str, change) -> bytes:
    """`model`'s safetensors bytes with tensor `name` changed in place by `change`."""
    from safetensors.torch import load_file, save

    tensors = load_file(model / "model.safetensors")
    change(tensors[name])
    return save(tensors, metadata={"format": "pt"})


def theta(cfg: dict, v: float) -> dict:
    """`cfg` with rope_theta `v` wherever it is kept (top level, rope_parameters)."""
    rp = cfg.get("rope_parameters")
    return {**cfg, "rope_theta": v, **({"rope_parameters": {**rp, "rope_theta": v}} if rp else {})}


@pytest.fixture(scope="module")
def S(tmp_path_factory, small_models, tiny_gguf, write_profile):
    """The paths the cases name: tiny models (T, D, O, short, alien), a tiny GGUF (G), broken inputs
    under X."""
    x = tmp_path_factory.mktemp("bad")
    t, d = small_models["target"], small_models["draft"]
    cfg = json.loads((t / "config.json").read_text())
    weights = (t / "model.safetensors").read_bytes()
    s = {"T": t, "D": d, "O": small_models["other"], "G": tiny_gguf, "X": x, "short": small_models["short"],
         "alien": small_models["alien"]}
    (x / "empty_dir").mkdir()
    (x / "file.txt").write_text("not a model")
    for name, config in {
        "cfg_list": [1, 2], "cfg_nohidden": {k: v for k, v in cfg.items() if k != "hidden_size"},
        "cfg_badtype": {**cfg, "hidden_size": "abc"}, "cfg_zeroheads": {**cfg, "num_attention_heads": 0},
        "cfg_empty": b"", "cfg_notjson": b"{", "cfg_latin1": LATIN1, "cfg_rope": {**cfg, "rope_scaling": "x"},
        "cfg_gpt2": {"model_type": "gpt2", "n_layer": 2}, "cfg_eos": {**cfg, "eos_token_id": "end"},
        "cfg_float_layers": {**cfg, "num_hidden_layers": 1.5}, "cfg_deep": DEEP,
    }.items():
        bad_checkpoint(x, name, t, config=config, weights=False)
    for name, config in {  # weights present: what makes the forward NaN (token 0 forever) or the wrong head
        "cfg_theta0": theta(cfg, 0), "cfg_theta_neg": theta(cfg, -10000.0),
        "cfg_eps_neg": {**cfg, "rms_norm_eps": -1e-6}, "cfg_eps_nan": {**cfg, "rms_norm_eps": float("nan")},
        "cfg_untied": {**cfg, "tie_word_embeddings": False},  # the tiny target's weights hold no lm_head
    }.items():
        bad_checkpoint(x, name, t, config=config)
    for name, model, change in (("w_nan", t, lambda w: w.fill_(float("nan"))), ("w_huge", t, lambda w: w.mul_(3e38)),
                                ("w_draft_nan", d, lambda w: w.fill_(float("nan")))):
        bad_checkpoint(x, name, model, weights=damaged(model, "model.norm.weight", change))
    bad_checkpoint(x, "st_trunc", t, weights=weights[: len(weights) // 2])
    bad_checkpoint(x, "st_empty", t, weights=b"")
    bad_checkpoint(x, "st_none", t, weights=False)
    bad_checkpoint(x, "st_shape", t, config={**cfg, "intermediate_size": 64})
    bad_checkpoint(x, "st_layers", t, config={**cfg, "num_hidden_layers": 3})
    idx = bad_checkpoint(x, "st_index_bad", t)
    (idx / "model.safetensors.index.json").write_text("{")
    idx = bad_checkpoint(x, "st_index_missing", t, weights=False)
    (idx / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"model.embed_tokens.weight":
                                                                                  "nowhere.safetensors"}}))
    bad_checkpoint(x, "notok", t, tokenizer=False)
    tok = bad_checkpoint(x, "tok_bad", t)
    (tok / "tokenizer.json").write_text("{ not a tokenizer")
    (x / "two_gguf").mkdir()
    for n in ("a.gguf", "b.gguf"):
        shutil.copy(tiny_gguf, x / "two_gguf" / n)
    (x / "empty.gguf").write_bytes(b"")
    (x / "junk.gguf").write_bytes(b"GGUF" + bytes(range(256)) * 4)
    (x / "half.gguf").write_bytes(tiny_gguf.read_bytes()[:5000])
    # prompts
    (x / "latin1.txt").write_bytes(LATIN1)
    (x / "latin1.jsonl").write_bytes(b'{"prompt": "' + LATIN1 + b'"}\n')
    (x / "empty.txt").write_text("")
    (x / "empty.jsonl").write_text("\n\n")
    (x / "bad.jsonl").write_text('{"prompt": "a"}\nnot json\n')
    (x / "list.jsonl").write_text("[1, 2]\n")
    (x / "neg.jsonl").write_text('{"prompt": "a", "max_new_tokens": -3}\n')
    (x / "str.jsonl").write_text('{"prompt": "a", "max_new_tokens": "abc"}\n')
    (x / "noprompt.jsonl").write_text('{"text": "a"}\n')
    # profiles
    good = write_profile(x / "good.json", t, d)
    s["P"] = good
    write_profile(x / "zero.json", t, d, heads=False)
    write_profile(x / "foreign.json", small_models["other"], d)
    g = json.loads(good.read_text())
    for name, doc in {
        "p_sinks_str": {**g, "sinks": "4"}, "p_budget_null": {**g, "budget": None},
        "p_arr_str": {**g, "arr": "x"}, "p_gamma_float": {**g, "gamma": 4.5}, "p_gamma_bool": {**g, "gamma": True},
        "p_heads_int": {**g, "draft_heads": 5}, "p_head_keys": {**g, "target_heads": [{"layer": 1}]},
        "p_head_qh": {**g, "target_heads": [{"layer": 1, "kv_head": 0, "query_heads": [3]}]},
        "p_m_by_budget": {**g, "m_by_budget": [1]}, "p_m_by_budget_key": {**g, "m_by_budget": {"abc": 1}},
        "p_calibration": {**g, "calibration": 5}, "p_online": {**g, "online_cost": []},
        "p_baselines": {**g, "arr_baselines": {"quest": "high"}}, "p_tables": {**g, "tables": {"rounds": 1}},
        "p_target_info": {**g, "target": {**g["target"], "num_layers": "2"}}, "p_schema_bool": {**g, "schema_version": True},
        "p_aggregation": {**g, "aggregation": "mean"}, "p_list": [g], "p_schema": {**g, "schema_version": 99},
        "p_missing": {k: v for k, v in g.items() if k not in ("m", "target_heads")},
        "p_m": {**g, "m": 10_000}, "p_layer": {**g, "target_heads": [{"layer": 99, "kv_head": 0, "query_heads": [0]}]},
        "p_arr_nan": {**g, "arr": float("nan")},
    }.items():
        (x / f"{name}.json").write_text(json.dumps(doc))
    (x / "p_bad_table.json").write_text(json.dumps({**g, "tables": {"rounds": "p.rounds.parquet"}}))
    (x / "p.rounds.parquet").write_bytes(b"PAR1 not really")
    (x / "p_empty.json").write_text("")
    (x / "p_deep.json").write_bytes(DEEP)
    (x / "deep.jsonl").write_bytes(DEEP + b"\n")
    (x / "p_latin1.json").write_bytes(LATIN1)
    (x / "dir.json").mkdir()
    # calibration and evaluation data
    (x / "calib_latin1.jsonl").write_bytes(b'{"text": "' + LATIN1 + b'"}\n')
    (x / "calib_bad.jsonl").write_text("{\n")
    (x / "calib_field.jsonl").write_text('{"body": "x"}\n')
    (x / "calib.parquet").write_bytes(b"PAR1 garbage")
    (x / "short.txt").write_text("too short for any window")
    sample = {"input": "", "context": "news " * 50, "answers": ["a"], "length": 50, "dataset": "multi_news",
              "language": "en", "all_classes": None, "_id": "s0"}
    for name, content in {"lb_latin1": LATIN1, "lb_notjson": b"{\n", "lb_fields": b'{"input": "x"}\n',
                          "lb_ok": json.dumps(sample).encode() + b"\n", "lb_empty": b"", "lb_blank": b"\n \n"}.items():
        (x / name).mkdir()
        (x / name / "multi_news.jsonl").write_bytes(content)
    (x / "books_latin1").mkdir()
    (x / "books_latin1" / "b.txt").write_bytes(LATIN1 * 1000)
    (x / "books").mkdir()
    (x / "books" / "b.txt").write_text("The river ran past the house every morning. " * 400)
    side_files(x, d, g)
    meta_work = x / "resumed.work"
    meta_work.mkdir()
    (meta_work / "meta.json").write_text("")  # what a kill during its (old, non-atomic) write left
    (meta_work / "w000.pt").write_bytes(b"a window")
    list_work = x / "resumed_list.work"
    list_work.mkdir()
    (list_work / "meta.json").write_text("[1, 2]")  # a key that is not an object
    (list_work / "w000.pt").write_bytes(b"a window")
    return {k: str(v) for k, v in s.items()}


def side_files(x, draft, profile: dict) -> None:
    """Damaged side files under x: token counts (x/v/), profiles with budget keys that look numeric
    but are not (pk_*.json), profiles whose parquet tables are damaged (tb_*.json beside tb_*.parquet)."""
    import numpy as np
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dustin_profile.vocab import write_token_counts
    from dustin_runtime.loader import resolve_checkpoint
    from dustin_runtime.tokenizer import load_tokenizer

    tok = load_tokenizer(resolve_checkpoint(str(draft)))
    (x / "v").mkdir()
    counts = np.arange(len(tok), dtype=np.int64)[::-1].copy()
    meta = json.loads(write_token_counts(x / "v" / "v.json", counts, tok, books="test", n_books=1,
                                         model_id="draft").read_text())
    for name, over in {"vocab_str": {"vocab_size": "abc"}, "vocab_huge": {"vocab_size": 10**15},
                       "vocab_float": {"vocab_size": len(tok) + 0.5}, "vocab_bool": {"vocab_size": True},
                       "vocab_list": {"vocab_size": [1]}, "table_null": {"table": None}}.items():
        (x / "v" / f"{name}.json").write_text(json.dumps({**meta, **over}))
    for name, cols in {"t_str": {"token_id": ["a", "b"], "count": [1, 2]}, "t_null": {"token_id": [0, 1], "count": [3, None]},
                       "t_neg": {"token_id": [0, 1], "count": [-5, 2]}}.items():
        pq.write_table(pa.table(cols), x / "v" / f"{name}.parquet")
        (x / "v" / f"{name}.json").write_text(json.dumps({**meta, "table": f"{name}.parquet"}))
    for name, keys in {"pk_superscript": {"\u00b2": 1}, "pk_dashes": {"--64": 1}, "pk_arabic": {"\u0666\u0664": 1},
                       "pk_float": {"64.0": 1}}.items():
        (x / f"{name}.json").write_text(json.dumps({**profile, "m_by_budget": keys}))
    for name, kind, df in (
        ("tb_str", "budgets", pd.DataFrame({"method": ["dustin"], "budget": [64], "arr": ["high"], "m": [20]})),
        ("tb_dup", "budgets", pd.DataFrame({"method": ["dustin"] * 2, "budget": [64, 64], "arr": [0.1, 0.2], "m": [20, 20]})),
        ("tb_no_dustin", "budgets", pd.DataFrame({"method": ["quest"], "budget": [64], "arr": [0.1], "m": [float("nan")]})),
        ("tr_str", "rounds", pd.DataFrame({"round": ["a"], "added": [None], "m": [1], "arr": ["x"], "gain": [0.0]})),
        ("tr_gap", "rounds", pd.DataFrame({"round": [0, 1], "added": [None, "t0"], "m": [1, 2], "arr": [0.1, None],
                                           "gain": [0.0, 0.1]})),
    ):
        df.to_parquet(x / f"{name}.parquet")
        (x / f"{name}.json").write_text(json.dumps({**profile, "tables": {kind: f"{name}.parquet"}}))


HUGE = "99999999999999999999"
DEC = ["decode", "--target", "{T}", "--prompt", "hi"]
SPEC = ["decode", "--target", "{T}", "--draft", "{D}", "--prompt", "hi"]
PROFILE = ["profile", "--target", "{T}", "--draft", "{D}", "--context", "64", "--windows", "1",
           "--budget", "40", "--sinks", "2", "--window", "8", "--out", "{X}/out/p.json"]
PROF = [*PROFILE, "--calib", "{X}/books"]
ACC = ["eval", "acceptance", "--target", "{T}", "--draft", "{D}", "--data", "{X}/books", "--contexts", "64",
       "--budget", "96", "--policy", "full,streamingllm", "--out", "{X}/acc/x"]
LB = ["eval", "longbench", "--target", "{T}", "--draft", "{D}", "--data", "{X}/lb_notjson", "--policy", "full",
      "--out-dir", "{X}/lb"]
PG = ["eval", "pg19", "--target", "{T}", "--draft", "{D}", "--data", "{X}/books", "--policy", "full",
      "--context", "32", "--eval-tokens", "8", "--windows", "1", "--out-dir", "{X}/pg"]
PK = ["eval", "passkey", "--target", "{T}", "--draft", "{D}", "--policy", "full",
      "--contexts", "100", "--out-dir", "{X}/pk"]
SHOW = ["profile", "show"]

CASES = {
    # checkpoints
    "no-checkpoint": (["decode", "--target", "{X}/nope", "--prompt", "hi"], ["no such checkpoint", "a Hugging Face folder with config.json"]),
    "checkpoint-is-txt": (["decode", "--target", "{X}/file.txt", "--prompt", "hi"], ["must be a .gguf"]),
    "checkpoint-empty-dir": (["decode", "--target", "{X}/empty_dir", "--prompt", "hi"], ["no config.json", "give a Hugging Face checkpoint folder"]),
    "hub-id-not-cached": (["decode", "--target", "nobody/nothing-here", "--prompt", "hi"], ["local Hugging Face cache"]),
    "config-list": (["decode", "--target", "{X}/cfg_list", "--prompt", "hi"], ["config.json", "expected a JSON object"]),
    "config-no-hidden-size": (["decode", "--target", "{X}/cfg_nohidden", "--prompt", "hi"], ["missing 'hidden_size'"]),
    "config-hidden-size-str": (["decode", "--target", "{X}/cfg_badtype", "--prompt", "hi"],
                               ["hidden_size must be a positive integer"]),
    "config-zero-heads": (["decode", "--target", "{X}/cfg_zeroheads", "--prompt", "hi"],
                          ["num_attention_heads must be a positive integer"]),
    "config-rope-theta-0": (["decode", "--target", "{X}/cfg_theta0", "--prompt", "hi"], ["rope_theta must be a finite number > 0"]),
    "config-rope-theta-neg": (["decode", "--target", "{X}/cfg_theta_neg", "--prompt", "hi"], ["rope_theta", "-10000"]),
    "config-eps-neg": (["decode", "--target", "{X}/cfg_eps_neg", "--prompt", "hi"], ["rms_norm_eps must be a finite"]),
    "config-eps-nan": (["decode", "--target", "{X}/cfg_eps_nan", "--prompt", "hi"], ["rms_norm_eps", "nan"]),
    "config-untied-no-head": (["decode", "--target", "{X}/cfg_untied", "--prompt", "hi"],
                              ["tie_word_embeddings is false", "no lm_head.weight"]),
    "weights-nan": (["decode", "--target", "{X}/w_nan", "--prompt", "hi"], ["the model", "w_nan",
                                                                              "logits are not finite (NaN/Inf) on the first step"]),
    "weights-overflow": (["decode", "--target", "{X}/w_huge", "--prompt", "hi"], ["logits are not finite",
                                                                                  "overflow float32"]),
    "weights-nan-speculative": (["decode", "--target", "{X}/w_nan", "--draft", "{D}", "--prompt", "hi"],
                                ["the target", "w_nan", "not finite"]),
    "weights-nan-draft": (["decode", "--target", "{T}", "--draft", "{X}/w_draft_nan", "--prompt", "hi"],
                          ["the draft", "w_draft_nan", "not finite"]),
    "config-layers-float": (["decode", "--target", "{X}/cfg_float_layers", "--prompt", "hi"], ["num_hidden_layers"]),
    "config-empty": (["decode", "--target", "{X}/cfg_empty", "--prompt", "hi"], ["config.json: unreadable"]),
    "config-not-json": (["decode", "--target", "{X}/cfg_notjson", "--prompt", "hi"], ["config.json: unreadable"]),
    "config-not-utf8": (["decode", "--target", "{X}/cfg_latin1", "--prompt", "hi"], ["config.json: unreadable"]),
    "config-rope-str": (["decode", "--target", "{X}/cfg_rope", "--prompt", "hi"], ["rope_scaling must be an object"]),
    "config-eos-str": (["decode", "--target", "{X}/cfg_eos", "--prompt", "hi"], ["eos_token_id must be a token id"]),
    "config-deep-nesting": (["decode", "--target", "{X}/cfg_deep", "--prompt", "hi"], ["config.json: unreadable"]),
    "batch-file-deep-nesting": (["decode", "--target", "{T}", "--prompts", "{X}/deep.jsonl"], ["deep.jsonl:1"]),
    "config-gpt2": (["decode", "--target", "{X}/cfg_gpt2", "--prompt", "hi"], ["unsupported architecture 'gpt2'"]),
    "safetensors-truncated": (["decode", "--target", "{X}/st_trunc", "--prompt", "hi"],
                              ["not a readable safetensors file"]),
    "safetensors-empty": (["decode", "--target", "{X}/st_empty", "--prompt", "hi"], ["not a readable safetensors"]),
    "safetensors-none": (["decode", "--target", "{X}/st_none", "--prompt", "hi"], ["no .safetensors weights"]),
    "safetensors-shape": (["decode", "--target", "{X}/st_shape", "--prompt", "hi"], ["shape"]),
    "safetensors-missing-layer": (["decode", "--target", "{X}/st_layers", "--prompt", "hi"], ["missing tensor"]),
    "index-not-json": (["decode", "--target", "{X}/st_index_bad", "--prompt", "hi"], ["unreadable index"]),
    "index-missing-shard": (["decode", "--target", "{X}/st_index_missing", "--prompt", "hi"],
                            ["nowhere.safetensors"]),
    "no-tokenizer-files": (["decode", "--target", "{X}/notok", "--prompt", "hi"], ["no tokenizer files"]),
    "tokenizer-corrupt": (["decode", "--target", "{X}/tok_bad", "--prompt", "hi"], ["cannot load its tokenizer"]),
    "draft-without-tokenizer": ([*DEC, "--draft", "{X}/notok"], ["no tokenizer files"]),
    "two-ggufs": (["decode", "--target", "{X}/two_gguf", "--prompt", "hi"], ["not exactly one .gguf"]),
    "gguf-empty": (["decode", "--target", "{X}/empty.gguf", "--prompt", "hi"], ["cannot read this GGUF file"]),
    "gguf-junk": (["decode", "--target", "{X}/junk.gguf", "--prompt", "hi"], ["cannot read this GGUF file"]),
    "gguf-cut-in-header": (["decode", "--target", "{X}/half.gguf", "--prompt", "hi"], ["cannot read this GGUF file"]),
    "different-vocabularies": ([*DEC, "--draft", "{alien}"], ["different vocabularies"]),
    # decode options
    "gamma-0": ([*SPEC, "--gamma", "0"], ["--gamma"]),
    "gamma-negative": ([*SPEC, "--gamma", "-1"], ["--gamma"]),
    "gamma-above-max": ([*SPEC, "--gamma", "257"], ["--gamma", "less than or equal to 256"]),
    "gamma-past-positions": (["decode", "--target", "{short}", "--draft", "{D}", "--prompt", "word " * 20,
                              "--max-new-tokens", "2", "--gamma", "60"], ["--gamma 60 drafts past the models' 64 positions"]),
    "acceptance-context-past-positions": (["eval", "acceptance", "--target", "{short}", "--draft", "{D}", "--data",
                                           "{X}/books", "--contexts", "60", "--max-new-tokens", "8", "--budget", "68",
                                           "--policy", "full", "--out", "{X}/acc2/x"],
                                          ["--contexts 60 + --max-new-tokens 8 exceed the models' 64", "is 56"]),
    "max-new-tokens-0": ([*DEC, "--max-new-tokens", "0"], ["--max-new-tokens"]),
    "temperature-negative": ([*DEC, "--temperature", "-1"], ["temperature must be"]),
    "temperature-nan": ([*DEC, "--temperature", "nan"], ["temperature must be"]),
    "temperature-inf": ([*DEC, "--temperature", "inf"], ["temperature must be"]),
    "temperature-text": ([*DEC, "--temperature", "abc"], ["--temperature"]),
    "top-p-0": ([*DEC, "--top-p", "0"], ["top-p must be in (0, 1]"]),
    "top-p-negative": ([*DEC, "--top-p", "-0.5"], ["top-p must be in (0, 1]"]),
    "top-p-above-1": ([*DEC, "--top-p", "1.5"], ["top-p must be in (0, 1]"]),
    "top-p-nan": ([*DEC, "--top-p", "nan"], ["top-p must be in (0, 1]"]),
    "dtype-unknown": ([*PG, "--dtype", "fp8"], ["unknown dtype 'fp8'"]),
    "policy-unknown": ([*SPEC, "--policy", "h2o"], ["unknown policy 'h2o'"]),
    "draft-kv-unknown": ([*SPEC, "--policy", "streamingllm", "--draft-kv", "half"], ["--draft-kv 'half'"]),
    "draft-kv-full-policy": ([*SPEC, "--draft-kv", "verify-set"], ["policy full has no one verification set"]),
    "draft-kv-quest": ([*SPEC, "--policy", "quest", "--budget", "128", "--draft-kv", "verify-set"],
                       ["policy quest has no one verification set"]),
    "policy-dustin-no-heads": ([*SPEC, "--policy", "dustin"], ["needs retrieval heads", "--profile", "dustin profile --target T --draft D"]),
    "refresh-layers-not-dustin": ([*SPEC, "--policy", "streamingllm", "--refresh-layers", "1"],
                                  ["policy streamingllm has no set to choose again"]),
    "refresh-layers-past-target": ([*SPEC, "--policy", "dustin", "--profile", "{P}", "--refresh-layers", "0,99"],
                                   ["refresh layer 99 is past the target's"]),
    "refresh-layers-descending": ([*SPEC, "--policy", "dustin", "--profile", "{P}", "--refresh-layers", "1,0"],
                                  ["ascending order"]),
    "refresh-layers-negative": ([*SPEC, "--policy", "dustin", "--profile", "{P}", "--refresh-layers", "-1"],
                                ["--refresh-layers: -1 is below 0"]),
    "pg19-refresh-layers-no-dustin": ([*PG, "--refresh-layers", "1"], ["applies to policy dustin"]),
    "policy-without-draft": ([*DEC, "--policy", "streamingllm", "--budget", "128"], ["give --draft"]),
    "budget-0": ([*SPEC, "--policy", "streamingllm", "--budget", "0"], ["--budget"]),
    "budget-below-sinks-window": ([*SPEC, "--policy", "streamingllm", "--budget", "8", "--profile", "{P}"],
                                  ["budget 8 is smaller than sinks + window"]),
    "profile-missing": ([*SPEC, "--policy", "dustin", "--profile", "{X}/none.json"], ["no such profile file", "dustin profile --target T --draft D"]),
    "profile-zero-heads": ([*SPEC, "--policy", "dustin", "--profile", "{X}/zero.json"],
                           ["zero.json holds no retrieval heads"]),
    "profile-other-target": ([*SPEC, "--policy", "dustin", "--profile", "{X}/foreign.json"],
                             ["foreign.json was made for target", "dustin profile --target T --draft D"]),
    "profile-sinks-str-in-decode": ([*SPEC, "--policy", "dustin", "--profile", "{X}/p_sinks_str.json"],
                                    ["field sinks must be an integer"]),
    "prompt-file-not-utf8": (["decode", "--target", "{T}", "--prompts", "{X}/latin1.txt"], ["not UTF-8"]),
    "batch-file-not-utf8": (["decode", "--target", "{T}", "--prompts", "{X}/latin1.jsonl"], ["not UTF-8"]),
    "prompt-file-is-dir": (["decode", "--target", "{T}", "--prompts", "{X}/empty_dir"], ["no such file"]),
    "prompt-file-missing": (["decode", "--target", "{T}", "--prompts", "{X}/none.txt"], ["no such file"]),
    "prompt-file-empty": (["decode", "--target", "{T}", "--prompts", "{X}/empty.txt"], ["empty prompt"]),
    "prompt-blank": (["decode", "--target", "{T}", "--prompt", "  "], ["empty prompt: give --prompt some text"]),
    "batch-file-empty": (["decode", "--target", "{T}", "--prompts", "{X}/empty.jsonl"], ["no prompts"]),
    "batch-file-bad-line": (["decode", "--target", "{T}", "--prompts", "{X}/bad.jsonl"], ["bad.jsonl:2"]),
    "batch-file-list": (["decode", "--target", "{T}", "--prompts", "{X}/list.jsonl"], ["list.jsonl:1"]),
    "batch-file-no-prompt": (["decode", "--target", "{T}", "--prompts", "{X}/noprompt.jsonl"], ["\"prompt\" string"]),
    "batch-file-negative-tokens": (["decode", "--target", "{T}", "--prompts", "{X}/neg.jsonl"],
                                   ["max_new_tokens must be a positive integer"]),
    "batch-file-text-tokens": (["decode", "--target", "{T}", "--prompts", "{X}/str.jsonl"],
                               ["max_new_tokens must be a positive integer"]),
    "two-prompts": ([*DEC, "--prompts", "{X}/latin1.txt"], ["give --prompt or --prompts, not both"]),
    "prompt-over-context": (["decode", "--target", "{short}", "--prompt", "word " * 200, "--max-new-tokens", "4"],
                            ["exceeds the model's context of 64 tokens", "shorten it to 60 tokens"]),
    "missing-target": (["decode", "--prompt", "hi"], ["Missing option '--target'"]),
    "unknown-option": ([*DEC, "--bogus"], ["No such option: --bogus"]),
    "unknown-command": (["nosuch"], ["No such command 'nosuch'"]),
    # profile
    "profile-no-models": (["profile", "--target", "{T}"], ["needs --target and --draft"]),
    "profile-context-0": ([*PROF, "--context", "0"], ["--context"]),
    "profile-windows-0": ([*PROF, "--windows", "0"], ["--windows"]),
    "profile-max-heads-0": ([*PROF, "--max-heads", "0"], ["--max-heads"]),
    "profile-m-points-0": ([*PROF, "--m-points", "0"], ["--m-points"]),
    "profile-heldout-windows-negative": ([*PROF, "--heldout-windows", "-1"], ["--heldout-windows"]),
    "profile-retrieval-weight": ([*PROF, "--retrieval-weight", "1.5"], ["--retrieval-weight"]),
    "profile-retrieval-windows-negative": ([*PROF, "--retrieval-windows", "-1"], ["--retrieval-windows"]),
    "profile-verify-tokens": ([*PROF, "--verify-tokens", "foo"], ["--verify-tokens"]),
    "profile-out-not-json": ([*PROF, "--out", "{X}/p.txt"], ["the profile is a .json file"]),
    "profile-out-is-dir": ([*PROF, "--out", "{X}/dir.json"], ["the profile is a .json file"]),
    "profile-out-under-file": ([*PROF, "--out", "{X}/file.txt/p.json"], ["cannot create the output folder"]),
    "profile-budget-below-sinks-window": ([*PROF, "--budget", "9"], ["must be >= --sinks + --window"]),
    "profile-calib-missing": ([*PROFILE, "--calib", "{X}/nope"], ["no such calibration file", "default ../shared/corpus/gutenberg/calib"]),
    "profile-calib-empty-dir": ([*PROFILE, "--calib", "{X}/empty_dir"], ["no .txt, .md, .jsonl or .parquet"]),
    "profile-calib-not-utf8": ([*PROFILE, "--calib", "{X}/calib_latin1.jsonl"], ["not UTF-8"]),
    "profile-calib-bad-jsonl": ([*PROFILE, "--calib", "{X}/calib_bad.jsonl"], ["not a JSON line"]),
    "profile-calib-no-field": ([*PROFILE, "--calib", "{X}/calib_field.jsonl"], ["--text-field"]),
    "profile-calib-bad-parquet": ([*PROFILE, "--calib", "{X}/calib.parquet"], ["cannot read column"]),
    "profile-calib-too-short": ([*PROFILE, "--calib", "{X}/short.txt"], ["no calibration document has"]),
    "profile-context-over-model": ([*PROF, "--context", "100000"], ["exceeds"]),
    "profile-dtype": ([*PROF, "--dtype", "fp8"], ["unknown dtype"]),
    "profile-empty-meta-with-windows": ([*PROF, "--out", "{X}/resumed.json"], ["records without a resume key",
                                                                               "--restart"]),
    "profile-resume-key-not-object": ([*PROF, "--out", "{X}/resumed_list.json"], ["records without a resume key",
                                                                                 "--restart"]),
    # profile show
    "show-missing": ([*SHOW, "{X}/none.json"], ["no such profile file", "dustin profile --target T --draft D"]),
    "show-dir": ([*SHOW, "{X}/dir.json"], ["no such profile file"]),
    "show-empty": ([*SHOW, "{X}/p_empty.json"], ["not a readable JSON profile"]),
    "show-not-utf8": ([*SHOW, "{X}/p_latin1.json"], ["not a readable JSON profile"]),
    "show-deep-nesting": ([*SHOW, "{X}/p_deep.json"], ["not a readable JSON profile"]),
    "show-list": ([*SHOW, "{X}/p_list.json"], ["not a JSON object"]),
    "show-schema-99": ([*SHOW, "{X}/p_schema.json"], ["schema_version 99 is not supported", "dustin profile --target T --draft D"]),
    "show-schema-bool": ([*SHOW, "{X}/p_schema_bool.json"], ["schema_version True is not supported"]),
    "show-missing-fields": ([*SHOW, "{X}/p_missing.json"], ["missing field(s) m, target_heads"]),
    "show-sinks-str": ([*SHOW, "{X}/p_sinks_str.json"], ["field sinks must be an integer"]),
    "show-budget-null": ([*SHOW, "{X}/p_budget_null.json"], ["field budget must be an integer"]),
    "show-arr-str": ([*SHOW, "{X}/p_arr_str.json"], ["field arr must be a number"]),
    "show-arr-nan": ([*SHOW, "{X}/p_arr_nan.json"], ["field arr must be a number"]),
    "show-gamma-float": ([*SHOW, "{X}/p_gamma_float.json"], ["field gamma must be an integer"]),
    "show-gamma-bool": ([*SHOW, "{X}/p_gamma_bool.json"], ["field gamma must be an integer"]),
    "show-heads-int": ([*SHOW, "{X}/p_heads_int.json"], ["draft_heads must be a list"]),
    "show-head-keys": ([*SHOW, "{X}/p_head_keys.json"], ["each head must be"]),
    "show-head-query-heads": ([*SHOW, "{X}/p_head_qh.json"], ["do not all use KV head 0"]),
    "show-head-layer": ([*SHOW, "{X}/p_layer.json"], ["outside the model"]),
    "show-m": ([*SHOW, "{X}/p_m.json"], ["is outside [0, budget - sinks - window]"]),
    "show-m-by-budget-list": ([*SHOW, "{X}/p_m_by_budget.json"], ["m_by_budget must map budgets"]),
    "show-m-by-budget-key": ([*SHOW, "{X}/p_m_by_budget_key.json"], ["m_by_budget must map budgets"]),
    "show-calibration-int": ([*SHOW, "{X}/p_calibration.json"], ["field calibration must be an object"]),
    "show-online-cost-list": ([*SHOW, "{X}/p_online.json"], ["field online_cost must be an object"]),
    "show-baselines-str": ([*SHOW, "{X}/p_baselines.json"], ["field arr_baselines must be an object of numbers"]),
    "show-tables-int": ([*SHOW, "{X}/p_tables.json"], ["field tables must be an object of strings"]),
    "show-target-info-str": ([*SHOW, "{X}/p_target_info.json"], ["target: field num_layers must be an integer"]),
    "show-aggregation": ([*SHOW, "{X}/p_aggregation.json"], ["aggregation must be 'sum' or 'max'"]),
    "show-corrupt-table": ([*SHOW, "{X}/p_bad_table.json"], ["not a readable parquet table"]),
    "show-other-target": ([*SHOW, "{P}", "--target", "{O}"], ["was made for target"]),
    "show-target-missing": ([*SHOW, "{P}", "--target", "{X}/nope"], ["no such checkpoint"]),
    # eval acceptance
    "acceptance-budgets-text": ([*ACC, "--budget", "abc"], ["--budget 'abc'"]),
    "acceptance-contexts-text": ([*ACC, "--contexts", "abc"], ["--contexts 'abc'"]),
    "acceptance-contexts-0": ([*ACC, "--contexts", "0"], ["--contexts: 0 is below 1"]),
    "acceptance-windows-0": ([*ACC, "--windows", "0"], ["--windows"]),
    "acceptance-windows-per-book-0": ([*ACC, "--windows-per-book", "0"], ["--windows-per-book"]),
    "acceptance-max-new-tokens-0": ([*ACC, "--max-new-tokens", "0"], ["--max-new-tokens"]),
    "acceptance-policy-unknown": ([*ACC, "--policy", "h2o"], ["unknown polic"]),
    "acceptance-budget-below-sinks-window": ([*ACC, "--budget", "5"], ["smaller than sinks + window"]),
    "acceptance-refresh-layers-no-dustin": ([*ACC, "--policy", "full,streamingllm", "--refresh-layers", "1"],
                                            ["applies to policy dustin"]),
    "acceptance-refresh-layers-descending": ([*ACC, "--policy", "full,dustin", "--profile", "{P}", "--refresh-layers", "1,0"],
                                             ["ascending order"]),
    "acceptance-refresh-layers-past-target": ([*ACC, "--policy", "full,dustin", "--profile", "{P}",
                                               "--refresh-layers", "0,99"],
                                              ["refresh layer 99 is past the target's"]),
    "acceptance-zero-head-profile": ([*ACC, "--policy", "dustin", "--profile", "{X}/zero.json"],
                                     ["holds no retrieval heads"]),
    "acceptance-books-missing": ([*ACC, "--data", "{X}/nope"], ["no .txt books"]),
    # eval longbench
    "longbench-limit-0": ([*LB, "--limit", "0"], ["--limit"]),
    "longbench-limit-negative": ([*LB, "--limit", "-1"], ["--limit"]),
    "longbench-budget-text": ([*LB, "--budget", "abc"], ["--budget 'abc'"]),
    "longbench-policy-unknown": ([*LB, "--policy", "h2o"], ["unknown policy 'h2o'"]),
    "longbench-data-missing": ([*LB, "--data", "{X}/nope"], ["no such folder"]),
    "longbench-data-empty": ([*LB, "--data", "{X}/empty_dir"], ["none of the 16 English LongBench datasets", "multi_news.jsonl"]),
    "longbench-dataset-unknown": ([*LB, "--datasets", "nosuch"], ["unknown LongBench dataset(s) nosuch"]),
    "longbench-dataset-blank": ([*LB, "--datasets", ","], ["unknown LongBench dataset"]),
    "longbench-dataset-absent": ([*LB, "--datasets", "hotpotqa"], ["hotpotqa.jsonl not found",
                                                                    "this folder holds multi_news"]),
    "longbench-data-not-json": (LB, ["multi_news.jsonl:1: not a JSON line"]),
    "longbench-data-not-utf8": ([*LB, "--data", "{X}/lb_latin1"], ["not UTF-8"]),
    "longbench-data-fields": ([*LB, "--data", "{X}/lb_fields"], ["missing field(s)"]),
    "longbench-models-too-short": ([*LB, "--data", "{X}/lb_ok"], ["leaves no room for multi_news's prompt beside its "
                                                                  "512 new tokens", "more than 513 positions"]),
    "longbench-out-is-file": ([*LB, "--out-dir", "{X}/file.txt"], ["cannot be the output folder"]),
    # eval pg19 / passkey
    "pg19-context-0": ([*PG, "--context", "0"], ["--context"]),
    "pg19-eval-tokens-0": ([*PG, "--eval-tokens", "0"], ["--eval-tokens"]),
    "pg19-windows-0": ([*PG, "--windows", "0"], ["--windows"]),
    "pg19-budget-text": ([*PG, "--budget", "1,x"], ["--budget '1,x'"]),
    "pg19-books-missing": ([*PG, "--data", "{X}/nope"], ["no .txt books", "give --data a folder", "../shared/corpus/gutenberg"]),
    "pg19-books-not-utf8": ([*PG, "--data", "{X}/books_latin1"], ["not UTF-8"]),
    "pg19-context-over-model": ([*PG, "--context", "100000"], ["exceed the model's", "use --context <= "]),
    "passkey-context-too-short": ([*PK, "--contexts", "8"], ["shorter than the instruction", "use --contexts >= "]),
    "passkey-contexts-text": ([*PK, "--contexts", "abc"], ["--contexts 'abc'"]),
    "passkey-context-over-model": ([*PK, "--contexts", "100000"], ["exceeds the models' limit"]),
    # numbers too large for any run (an overflow, or a loop that never ends, before the range checks)
    "seed-huge": ([*DEC, "--temperature", "1", "--seed", HUGE], ["--seed"]),
    "gamma-huge": ([*SPEC, "--gamma", HUGE], ["--gamma"]),
    "budget-huge": ([*SPEC, "--policy", "streamingllm", "--budget", HUGE], ["--budget"]),
    "profile-windows-huge": ([*PROF, "--windows", HUGE], ["--windows"]),
    "acceptance-budget-huge": ([*ACC, "--budget", f"40,{HUGE}"], ["--budget: 99999999999999999999 is above"]),
    # bench (CPU)
    "bench-attention-without-gpu": (["bench", "attention"], ["needs a CUDA GPU"]),
    "bench-e2e-without-gpu": (["bench", "e2e", "--policy", "full,dustin,dustin-r", "--refresh-layers", "9,18"],
                              ["needs a CUDA GPU", "`make demo` checks correctness"]),
    "bench-e2e-refresh-past-target": (["bench", "e2e", "--target", "qwen2.5-7b", "--policy", "dustin,dustin-r",
                                       "--refresh-layers", "9,28"], ["refresh layer 28 is past the target's 28 layers"]),
    "bench-e2e-refresh-descending": (["bench", "e2e", "--policy", "dustin-r", "--refresh-layers", "18,9"],
                                     ["ascending order"]),
    "bench-e2e-refresh-negative": (["bench", "e2e", "--policy", "dustin-r", "--refresh-layers", "-1"],
                                   ["--refresh-layers: -1 is below 0"]),
    "bench-e2e-refresh-missing": (["bench", "e2e", "--policy", "dustin,dustin-r"], ["give --refresh-layers"]),
    "bench-e2e-refresh-no-r-policy": (["bench", "e2e", "--refresh-layers", "9"], ["applies to the -r policies"]),
    "bench-e2e-refresh-streamingllm": (["bench", "e2e", "--policy", "streamingllm-r", "--refresh-layers", "9"],
                                       ["unknown policies streamingllm-r"]),
    "bench-e2e-draft-vocab-zero": (["bench", "e2e", "--draft-vocab", "0"], ["K must be >= 1"]),
    "bench-e2e-budget-zero": (["bench", "e2e", "--budget", "0"], ["--budget"]),
    "bench-e2e-exact-k-huge": (["bench", "e2e", "--policy", "dustin-vs-x9", "--acceptance", "geometric:0.8:agree=0.9"],
                               ["K = 1 ... 6"]),
    "bench-e2e-draft-vocab-k-with-checkpoints": (["bench", "e2e", "--target", "{T}", "--draft", "{D}",
                                                  "--draft-vocab", "64"], ["give PATH:K"]),
    "decode-draft-vocab-no-draft": (["decode", "--target", "{T}", "--prompt", "a", "--draft-vocab", "x.json:8"],
                                    ["give --draft too"]),
    "decode-draft-vocab-garbage": (["decode", "--target", "{T}", "--draft", "{D}", "--prompt", "a",
                                    "--draft-vocab", "x.json:lots"], ["expected PATH:K"]),
    "decode-draft-vocab-missing-file": (["decode", "--target", "{T}", "--draft", "{D}", "--prompt", "a",
                                         "--draft-vocab", "{X}/none.json:8"], ["no such token-counts file"]),
    "decode-draft-vocab-not-counts": (["decode", "--target", "{T}", "--draft", "{D}", "--prompt", "a",
                                       "--draft-vocab", "{X}/file.txt:8"], ["not a token-counts JSON"]),
    # side files: token counts, profile keys, profile tables (one line, never a traceback or a huge allocation)
    **{f"draft-vocab-{n}": (["decode", "--target", "{T}", "--draft", "{D}", "--prompt", "a", "--draft-vocab",
                             f"{{X}}/v/{n}.json:8"], needles) for n, needles in {
        "vocab_str": ["vocab_size must be a positive integer", '"abc"'],
        "vocab_huge": ["vocab_size 1000000000000000 is more than the draft's 1024 rows"],
        "vocab_float": ["vocab_size must be a positive integer"], "vocab_bool": ["vocab_size must be a positive integer"],
        "vocab_list": ["vocab_size must be a positive integer"], "table_null": ["field table must name"],
        "t_str": ["integer columns without nulls"], "t_null": ["integer columns without nulls"],
        "t_neg": ["negative token counts"]}.items()},
    **{f"show-{n}": ([*SHOW, f"{{X}}/{n}.json"], ["m_by_budget must map budgets to integers"])
       for n in ("pk_superscript", "pk_dashes", "pk_arabic", "pk_float")},
    "decode-profile-key-superscript": ([*SPEC, "--policy", "dustin", "--profile", "{X}/pk_superscript.json"],
                                       ["m_by_budget must map budgets to integers"]),
    **{f"show-table-{n}{'-markdown' if md else ''}": ([*SHOW, *(["--markdown"] if md else []), f"{{X}}/{n}.json"],
                                                      [f"{n}.parquet: not a profile", why])
       for n, why in {"tb_str": "column 'arr' holds", "tb_dup": "a method appears twice", "tb_no_dustin": "dustin's row",
                      "tr_str": "column 'round' holds", "tr_gap": "column 'arr' has empty cells"}.items()
       for md in (False, True)},
    "longbench-data-empty-file": ([*LB, "--data", "{X}/lb_empty"], ["multi_news holds no samples"]),
    "longbench-data-blank-lines": ([*LB, "--data", "{X}/lb_blank"], ["multi_news holds no samples"]),
    # empty values: refused before any command reads them ('' as a path is the working folder)
    **{f"empty-{a.strip('-')}-{i}": ([*args, a, ""], [f"{a} is empty", f"leave {a} out"]) for i, (args, a) in enumerate([
        (DEC[:3], "--target"), (DEC, "--draft"), (DEC[:3], "--prompts"), (SPEC, "--profile"), (SPEC, "--policy"),
        (SPEC, "--draft-vocab"), (PROF, "--out"), (PROF, "--calib"), (["profile", "vocab", "--draft", "{D}"], "--out"),
        (ACC, "--out"), (ACC, "--contexts"), (LB, "--datasets"), (LB, "--out-dir"), (PG, "--out-dir"), (PG, "--data"),
        (PK, "--out-dir"), (["profile", "show", "{P}"], "--target"), (["bench", "e2e"], "--policy"),
        (["bench", "attention"], "--shape")])},
    "empty-value-with-equals": ([*PG, "--out-dir="], ["--out-dir is empty"]),
    "empty-blank-value": ([*PG, "--out-dir", "  "], ["--out-dir is empty"]),
    "empty-argument": ([*SHOW, ""], ["argument 3 is empty"]),
    "bench-e2e-draft-lookup-zero": (["bench", "e2e", "--draft-lookup", "0"], ["1 <= min <= max"]),
    "bench-e2e-draft-lookup-tp": (["bench", "e2e", "--draft-lookup", "4", "--tp", "2"], ["one process"]),
    "decode-draft-lookup-no-draft": (["decode", "--target", "{T}", "--prompt", "a", "--draft-lookup", "4"],
                                     ["give --draft"]),
    "decode-draft-lookup-garbage": (["decode", "--target", "{T}", "--draft", "{D}", "--prompt", "a",
                                     "--draft-lookup", "4:x"], ["MAX:MIN"]),
    "acceptance-draft-lookup-min-above-max": (["eval", "acceptance", "--target", "{T}", "--draft", "{D}",
                                               "--draft-lookup", "2:3"], ["1 <= min <= max"]),
    "profile-vocab-no-draft": (["profile", "vocab", "--out", "{X}/v.json"], ["needs --draft"]),
    "profile-vocab-no-books": (["profile", "vocab", "--draft", "{D}", "--data", "{X}/empty_dir",
                                "--out", "{X}/v.json"], ["no .txt books"]),
    "profile-vocab-not-json": (["profile", "vocab", "--draft", "{D}", "--data", "{X}",
                                "--out", "{X}/v.txt"], ["is a .json file"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_and_exit_2(cli, S, case, assert_one_line_error):
    args, needles = CASES[case]
    p = cli(*[a.format(**S) for a in args])
    assert_one_line_error(p, *needles, code=2)


def offsets(n: int, inside: tuple[int, ...], count: int = 16) -> list[int]:
    """Deterministic cut points of an n-byte file: the edges (0, 1, n - 1), points inside the
    header (`inside`), and the rest spread evenly."""
    spread = [round(i * (n - 1) / (count - 1)) for i in range(count)]
    return sorted({0, 1, n - 1, *inside, *spread} - {n})


def test_truncated_safetensors_never_traceback(cli, S, tmp_path, assert_one_line_error):
    t = S["T"]
    data = open(f"{t}/model.safetensors", "rb").read()
    header = 8 + int.from_bytes(data[:8], "little")
    cuts = offsets(len(data), (4, 7, 8, 9, header // 2, header - 1, header, header + 1))
    folder = tmp_path / "cut"
    folder.mkdir()
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(f"{t}/{f}", folder / f)
    for n in cuts:
        (folder / "model.safetensors").write_bytes(data[:n])
        p = cli("decode", "--target", folder, "--prompt", "hi", "--max-new-tokens", "1")
        assert_one_line_error(p, "model.safetensors", code=2)


def test_truncated_gguf_never_traceback(cli, S, tmp_path, assert_one_line_error):
    data = open(S["G"], "rb").read()
    from gguf import GGUFReader

    first_tensor = min(t.data_offset for t in GGUFReader(S["G"]).tensors)
    cuts = offsets(len(data), (3, 4, 8, 16, 24, 40, 100, 1000, first_tensor - 1, first_tensor, first_tensor + 1))
    for n in cuts:
        path = tmp_path / f"cut{n}.gguf"
        path.write_bytes(data[:n])
        p = cli("decode", "--target", path, "--prompt", "hi", "--max-new-tokens", "1", env={"DUSTIN_CACHE": str(tmp_path)})
        assert_one_line_error(p, str(path), code=2)


def test_truncated_profile_never_traceback(cli, S, tmp_path, assert_one_line_error):
    data = open(S["P"], "rb").read()
    for n in offsets(len(data), (1, 2, 10, 50, 100)):
        path = tmp_path / f"cut{n}.json"
        path.write_bytes(data[:n])
        p = cli("profile", "show", path)
        assert_one_line_error(p, str(path), code=2)
    p = cli("profile", "show", S["P"])
    assert p.returncode == 0 and "retrieval heads" in p.stdout, p.stderr


def test_damaged_gguf_caches_are_rebuilt(cli, S, tmp_path):
    """The GGUF conversion and tokenizer caches truncated, overwritten, emptied or turned into
    folders (and a cache root that is a file): each run rebuilds or skips them and decodes the same
    tokens as the first."""
    args = ["decode", "--target", S["G"], "--prompt", "hi there", "--max-new-tokens", "4", "--json"]

    def tokens(cache):
        p = cli(*args, env={"DUSTIN_CACHE": str(cache)})
        assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
        return json.loads(p.stdout.splitlines()[-1])["tokens"]

    cache = tmp_path / "cache"
    want = tokens(cache)
    files = sorted(p for p in cache.rglob("*") if p.is_file())
    assert {p.parent.name for p in files} == {"gguf", "tokenizers"}, files
    damage = {"truncated": lambda f: f.write_bytes(f.read_bytes()[: f.stat().st_size // 2]),
              "garbage": lambda f: f.write_bytes(b'{"format": 1, "files": {"tokenizer.json": "zz"}}'
                                                 if f.suffix == ".json" else bytes(64)),
              "empty": lambda f: f.write_bytes(b""),
              "folder": lambda f: (f.unlink(), f.mkdir())}
    for name, spoil in damage.items():
        for f in files:
            if f.is_dir():
                f.rmdir()
                f.write_bytes(b"x")
            spoil(f)
        assert tokens(cache) == want, name
    (tmp_path / "file").write_text("not a folder")
    assert tokens(tmp_path / "file") == want
