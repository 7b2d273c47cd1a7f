"""What the tensor-parallel tests run on every rank (through `tp_server.py`) and, with tp None, in
the test process as the single-process reference. Each case loads its models, runs, and returns
plain values and CPU tensors. Retrieval heads arrive as lists (JSON) and become tuples here."""


import torch

from dustin_runtime.attention import TorchAttention
from dustin_runtime.exact import ExactConfig
from dustin_runtime.generate import generate
from dustin_runtime.loader import load_model
from dustin_runtime.sampling import SamplingConfig
from dustin_runtime.sparse.config import SparseConfig
from dustin_runtime.sparse.policies import make_policy
from dustin_runtime.speculative import speculative_generate


def _heads(heads) -> tuple:
    return tuple((int(layer), int(g), tuple(int(h) for h in qh)) for layer, g, qh in heads or ())


@torch.inference_mode()
def logits(tp, target: str, prompts: list[list[int]]) -> dict:
    """Logits of a prompt chunk (causal), then of a 3-token pass over the cache (masked path), then
    one decode step: gathered over the vocabulary, and this rank's columns."""
    model, _ = load_model(target, tp=tp)
    ids = torch.tensor(prompts)
    B, T = ids.shape
    cache = model.allocate_cache(B, T + 8)
    backend = TorchAttention()
    chunk = model(ids[:, :-3], cache, backend, phase="prefill", kv_len=T - 3)
    cache.advance(T - 3)
    verify = model(ids[:, -3:], cache, backend, phase="verify")
    cache.advance(3)
    step = model(ids[:, -1:], cache, backend, phase="decode", local_vocab=True)
    return {"chunk": chunk, "verify": verify, "local": step, "vocab_start": model.vocab_start,
            "kv_heads": cache.k[0].shape[1], "params": sum(p.numel() for p in model.parameters())}


@torch.inference_mode()
def spec(tp, target: str, draft: str, prompts: list[list[int]], policy: str = "full", budget: int | None = None,
         target_heads=None, draft_heads=None, m: int = 0, temperature: float = 0.0, top_p: float = 1.0,
         gamma: int = 3, max_new: int = 10, measure_arr: bool = False, trace: bool = False, seed: int = 0,
         eos: tuple = (), draft_kv: str = "full", refresh_layers=(), exact: int = 0) -> dict:
    """Speculative decoding through one policy (in exact mode with `exact` = K): tokens, accepted
    counts, the sets chosen, ARR, exact mode's agreement."""
    t, _ = load_model(target, tp=tp)
    d, _ = load_model(draft)
    cfg = None
    if budget is not None:
        cfg = SparseConfig(budget=budget, sinks=2, window=4, m=m, target_heads=_heads(target_heads),
                           draft_heads=_heads(draft_heads), draft_kv=draft_kv, refresh_layers=tuple(refresh_layers))
    hooks = make_policy(policy, cfg, target=t, draft=d, measure_arr=measure_arr)
    if trace:
        hooks.trace = []
    res = speculative_generate(t, d, prompts, max_new, gamma=gamma, hooks=hooks, seed=seed, eos_ids=tuple(eos),
                               sampling=SamplingConfig(temperature=temperature, top_p=top_p),
                               exact=ExactConfig(exact))
    sets = [(layer, lens.tolist(), idx.tolist()) for layer, lens, idx in (getattr(hooks, "trace", None) or [])]
    return {"tokens": res.tokens, "accepted": res.stats.accepted, "sets": sets, "arr": res.stats.extra.get("arr"),
            "batch": res.stats.batch, "agreement": res.stats.extra.get("agreement")}


@torch.inference_mode()
def autoregressive(tp, target: str, prompts: list[list[int]], temperature: float = 0.0, top_p: float = 1.0,
                   max_new: int = 8, seed: int = 0, min_new: int = 0, eos: tuple = ()) -> list[list[int]]:
    """Autoregressive decoding: the new tokens."""
    model, _ = load_model(target, tp=tp)
    res = generate(model, prompts, max_new, sampling=SamplingConfig(temperature=temperature, top_p=top_p), seed=seed,
                   min_new_tokens=min_new, eos_ids=tuple(eos))
    return res.tokens


@torch.inference_mode()
def collectives(tp, target: str, draft: str, prompts: list[list[int]], policy: str = "full", **sparse) -> dict:
    """The collectives each phase of a speculative step issues (`dustin_eval.tp_cost`), by kind,
    elements and dtype."""
    from dustin_eval.tp_cost import phase_collectives
    from dustin_runtime.engine import Engine

    t, _ = load_model(target, tp=tp)
    d, _ = load_model(draft)
    cfg = None
    if policy != "full":
        cfg = SparseConfig(budget=sparse["budget"], sinks=2, window=4, m=sparse.get("m", 0),
                           target_heads=_heads(sparse.get("target_heads")),
                           draft_heads=_heads(sparse.get("draft_heads")))
    eng = Engine(t, d)
    speculative_generate(t, d, prompts, 6, gamma=3, hooks=make_policy(policy, cfg, target=t, draft=d), engine=eng)
    return {k: [(kind, n, str(dt)) for kind, n, dt in v] for k, v in phase_collectives(eng, tp).items()}


@torch.inference_mode()
def teacher_forced(tp, target: str, draft: str, sequences: list[list[int]], context: int, policy: str = "full",
                   **sparse) -> list:
    """Teacher-forced NLL per sequence through one policy (and ARR when measured)."""
    from dustin_runtime.sparse.teacher_forced import teacher_forced_nll

    t, _ = load_model(target, tp=tp)
    d, _ = load_model(draft)
    cfg = SparseConfig(budget=sparse["budget"], sinks=2, window=4, m=sparse.get("m", 0),
                       target_heads=_heads(sparse.get("target_heads")),
                       draft_heads=_heads(sparse.get("draft_heads"))) if policy != "full" else None
    hooks = make_policy(policy, cfg, target=t, draft=d, measure_arr=policy != "full")
    res = teacher_forced_nll(t, d, sequences, context, gamma=3, hooks=hooks)
    return [res.nll, res.tokens, res.extra.get("arr")]


def profile(tp, out: str, **cfg) -> str | None:
    """`run_profile` (a ProfileConfig of `cfg`, written to `out`): rank 0's profile JSON, None on the others."""
    import io

    from rich.console import Console

    from dustin_profile.run import ProfileConfig, run_profile
    from dustin_runtime.io.files import share_outputs

    if tp is not None:  # as the CLI joins the run: rank 0 alone writes
        share_outputs(tp.rank, tp.agree)
    cfg["calib"], cfg["budgets"] = tuple(cfg["calib"]), tuple(cfg["budgets"])
    res = run_profile(ProfileConfig(out=out, **cfg), console=Console(file=io.StringIO()), tp=tp)
    return None if res is None else res.profile.to_json()
