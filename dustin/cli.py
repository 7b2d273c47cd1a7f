"""The `dustin` command: options parsed, runs planned (`dustin_profile.plan`) before any model loads,
the library called, `dustin.render` prints; heavy imports inside the commands (`--help` answers at
once). Bad input is one red line and exit 2, Ctrl-C one line and 130. Under `torchrun ... --tp N`
every rank runs the command and rank 0 alone prints and writes."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from dustin import render
from dustin.render import console, err_console
from dustin_runtime.errors import MAX_COUNT, MAX_GAMMA, MAX_TOKENS, DustinError

REPO = Path(__file__).resolve().parents[1]
RUNS = Path("runs")  # git-ignored: every default output goes below it
SMOL, SMOL_DRAFT = "smollm2", "models/smollm2-draft"
ABOUT = ("Long-context speculative decoding whose target verifies the draft's tokens against a small selected "
         "part of its KV cache.")

app = typer.Typer(add_completion=False, no_args_is_help=True, help=ABOUT)
profile_app = typer.Typer(no_args_is_help=True, subcommand_metavar="[show PROFILE | vocab --draft D]",
                          help="Offline profiling: `dustin profile --target T --draft D` runs Algorithm 1 (retrieval "
                               "heads and the draft/target split m maximising ARR) on calibration text and writes a "
                               "versioned profile; `dustin profile show PROFILE` prints one.")
eval_app = typer.Typer(no_args_is_help=True, help="Quality evaluations: LongBench, PG-19, passkey, acceptance.")
bench_app = typer.Typer(no_args_is_help=True, help="GPU speed benchmarks.")
for _sub, _name in ((profile_app, "profile"), (eval_app, "eval"), (bench_app, "bench")):
    app.add_typer(_sub, name=_name)


def _version(value: bool) -> None:
    if value:
        from dustin_runtime.io.provenance import git_commit, versions

        commit = git_commit() if (REPO / ".git").exists() else "unknown"
        print(f"dustin {versions().get('dustin') or 'unknown'}" + ("" if commit == "unknown" else f" ({commit})"))
        raise typer.Exit()


@app.callback(help=ABOUT)
def _root(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="Print the version (and the git commit in a checkout).")] = False):
    pass


# Options shared by several commands, defined once (defaults stay with each command).
Target = Annotated[str, typer.Option(help="Target: HF folder, .gguf file, cached hub id, 'smollm2', or random:<preset>.")]
Draft = Annotated[str, typer.Option(help="Draft checkpoint (same tokenizer as the target).")]
ProfileFile = Annotated[Path | None, typer.Option("--profile", help="The pair's profile (heads, sinks, window, m; eval "
                                                  "default: runs/profile/<T>-<D>.json, profiles/<T>-<D>.json or profiles/<D>.json).")]
Policy = Annotated[str, typer.Option("--policy", help="Policies, comma-separated: full, dustin, draft-only, "
                                     "target-only, streamingllm, quest, oracle ('all': every one).")]
Budget = Annotated[str, typer.Option("--budget", help="Verification budgets S, comma-separated.")]
DraftKV = Annotated[str | None, typer.Option("--draft-kv", help="What the draft attends while drafting: full (its "
                                             "cache) or verify-set (the latest verification set, the rows since and "
                                             "its drafts). Default: the profile's, else full.")]
RefreshLayers = Annotated[str, typer.Option("--refresh-layers", help="dustin: target layers (comma-separated) whose "
                                            "queries choose the set again inside the verification pass. Default: "
                                            "the profile's; 'none': no refresh.")]
DraftVocab = Annotated[str | None, typer.Option("--draft-vocab", help="The draft's LM head over the K most frequent "
                                               "tokens (FR-Spec): PATH:K of a `dustin profile vocab` file.")]
DraftLookup = Annotated[str | None, typer.Option("--draft-lookup", help="Drafts copied from each sequence's history "
                                                "where it repeats: MAX or MAX:MIN n-gram lengths (exact; off).")]
Gamma = Annotated[int, typer.Option(min=1, max=MAX_GAMMA, help="Draft tokens per step (gamma + 1 verification queries).")]
NewTokens = Annotated[int, typer.Option(min=1, max=MAX_TOKENS, help="New tokens per sequence.")]
Contexts = Annotated[str, typer.Option("--contexts", help="Prompt lengths in tokens, comma-separated.")]
Dtype = Annotated[str, typer.Option(help="bf16 | fp16 | fp32 (auto: bf16 on CUDA, fp32 on CPU; the device: CUDA "
                                         "when available).")]
Books = Annotated[Path | None, typer.Option("--data", help="Folder of .txt books (default ../shared/corpus/gutenberg/eval).")]
OutDir = Annotated[Path | None, typer.Option(help="Output folder (default runs/<command>, git-ignored): resumable "
                                             "records inside, locked while a run writes.")]
Restart = Annotated[bool, typer.Option("--restart", help="Discard the records an earlier run left in the same output "
                                       "(needed to change its settings; never files git tracks).")]
TP = Annotated[int | None, typer.Option("--tp", min=1, max=MAX_COUNT, help="Tensor-parallel ranks, one process per "
                                        "GPU, started by `torchrun --nproc-per-node N -m dustin.cli ...`.")]


def _out(out_dir: Path | None, command: str) -> Path:
    return out_dir if out_dir is not None else RUNS / command


def _one_process(command: str) -> None:
    """Refuse a command that runs on one GPU when a launcher started several processes."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        raise DustinError(f"dustin {command} runs in one process (no --tp); the launcher started {world}: "
                          "run it without torchrun")


def _start_tp(tp: int | None, device: str):
    """Join the launcher's process group (tensor parallelism) or run alone (None); rank 0 writes."""
    from dustin_runtime import tp as tensor_parallel
    from dustin_runtime.io.files import share_outputs

    group = tensor_parallel.start(tp, device)
    if group is not None:
        share_outputs(group.rank, group.agree)
    return group


def _loaded(target: str, draft: str | None, dtype: str, tp=None, draft_vocab: str | None = None):
    """The target (under tensor parallelism this rank's shard) and the draft, with a spinner."""
    from dustin_runtime import pipeline

    dev = pipeline.pick_device("auto")
    with console.status("loading models", spinner="dots"):
        return pipeline.load_pair(target, draft, dtype=pipeline.pick_dtype(dtype, dev), device=dev, tp=tp,
                                  draft_vocab=draft_vocab)


@contextmanager
def _session(out_dir: Path, target: str, draft: str, tp: int | None, plans=None, measure_arr: bool = False,
             dtype: str = "auto", draft_vocab: str | None = None):
    """A run's output folder locked, the launcher's process group joined (tensor parallelism), the
    pair loaded and, with `plans`, bound: yields (target, draft, hooks factory, resume key, group)."""
    from dustin_profile.plan import bind
    from dustin_runtime.io.files import FolderLock

    group = _start_tp(tp, "auto")
    with FolderLock(out_dir):
        tgt, drf = _loaded(target, draft, dtype, group, draft_vocab)
        make, key = bind(plans, tgt, drf, measure_arr, group) if plans is not None else (None, None)
        yield tgt, drf, make, key, group


@app.command()
def decode(
    target: Target,
    draft: Annotated[str | None, typer.Option(help="Draft (same tokenizer); without it, autoregressive.")] = None,
    prompt: str | None = typer.Option(None, help="The prompt text (default: a short built-in one)."),
    prompts: Path | None = typer.Option(None, help='A prompt file: .jsonl, one {"prompt": ..., "max_new_tokens": ...} '
                                                   "per line (a batch); any other file, one prompt."),
    max_new_tokens: NewTokens = 128,
    gamma: Gamma = 4,
    temperature: float = typer.Option(0.0, help="0 = greedy."),
    top_p: float = typer.Option(1.0, help="Nucleus sampling mass, in (0, 1]."),
    chat: bool = typer.Option(False, help="Wrap each prompt in the tokenizer's chat template."),
    seed: int = typer.Option(0, min=0, max=(1 << 63) - 1, help="Seed of the sampling."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON record as the last line."),
    profile: ProfileFile = None,
    policy: str | None = typer.Option(None, help="Verification policy (default: dustin with --profile, else full)."),
    budget: int | None = typer.Option(None, min=1, max=MAX_TOKENS,
                                      help="Budget S (default: the profile's, else 512; with --exact at least 1024)."),
    draft_kv: DraftKV = None,
    refresh_layers: RefreshLayers = "",
    draft_vocab: DraftVocab = None,
    draft_lookup: DraftLookup = None,
    tp: TP = None,
    exact: int = typer.Option(0, min=0, help="Exact mode: a full-attention pass confirms the sparse-verified tokens "
                                             "every K steps; the output is the target's greedy one (0: off)."),
) -> None:
    """Decode prompts with the target, speculatively when a draft is given."""
    import json

    from dustin_profile.plan import plan_decode
    from dustin_runtime import pipeline
    from dustin_runtime.sampling import SamplingConfig
    from dustin_runtime.sparse.policies import make_policy

    sampling = SamplingConfig(temperature=temperature, top_p=top_p)
    texts = pipeline.read_prompts(prompt, prompts, max_new_tokens)
    policy, plan, lookup, exact_mode = plan_decode(policy, profile, budget, draft, draft_kv, refresh_layers,
                                                   draft_lookup, exact)
    group = _start_tp(tp, "auto")
    tgt, drf = _loaded(target, draft, "auto", group, draft_vocab)
    hooks = None if drf is None else make_policy(policy, plan.config(tgt, drf), target=tgt.model, draft=drf.model)
    with console.status("decoding", spinner="dots"):
        out = pipeline.decode(tgt, drf, texts, gamma=gamma, chat=chat, seed=seed, hooks=hooks, sampling=sampling,
                              lookup=lookup, exact=exact_mode)
    render.decode(out)
    if json_out:
        print(json.dumps(out.record()))


@profile_app.callback(invoke_without_command=True)
def profile(
    ctx: typer.Context,
    target: Annotated[str | None, typer.Option(help="Target: HF folder, .gguf file, cached hub id, 'smollm2', or random:<preset>.")] = None,
    draft: Annotated[str | None, typer.Option(help="Draft checkpoint (same tokenizer as the target).")] = None,
    calib: list[str] | None = typer.Option(
        None, help="Calibration text: .txt/.md files, folders, globs, .jsonl or .parquet (repeat the option). "
                   "Default: ../shared/corpus/gutenberg/calib."),
    context: int = typer.Option(8192, min=1, max=MAX_TOKENS, help="Context length L of the verification passes."),
    windows: int = typer.Option(16, min=1, max=MAX_COUNT, help="Calibration windows (one prefill each)."),
    retrieval_windows: int = typer.Option(0, min=0, max=MAX_COUNT, help="Extra key-value retrieval episodes (a fact "
                                          "in prose, asked for at the end) so retrieval heads can win."),
    heldout_windows: int = typer.Option(0, min=0, max=MAX_COUNT, help="Windows to score the profile on (not searched)."),
    budget: int = typer.Option(512, min=1, max=MAX_TOKENS, help="Verification budget S (tokens of the selected set)."),
    sinks: int = typer.Option(4, min=0, max=MAX_TOKENS, help="Attention-sink tokens always in the set."),
    window: int = typer.Option(64, min=0, max=MAX_TOKENS, help="Recent tokens always in the set."),
    max_heads: int = typer.Option(8, min=1, max=MAX_COUNT, help="Head limit of the search (draft + target KV heads)."),
    max_refresh: int = typer.Option(0, help="After the head search, choose up to this many refresh layers of dustin "
                                            "greedily by teacher-forced perplexity on the calibration windows."),
    dtype: Dtype = "auto",
    out: Path | None = typer.Option(None, help="Profile JSON (default: runs/profile/<target>-<draft>.json); tables "
                                               "and plots go beside it, resumable work in <out>.work/."),
    restart: Restart = False,
    tp: TP = None,
) -> None:
    """Offline profiling: Algorithm 1 (greedy retrieval-head search and draft/target split m maximising
    ARR) on calibration text, written as a versioned profile artifact. `dustin profile show p.json` prints one."""
    if ctx.invoked_subcommand is not None:
        if target or draft:
            raise DustinError(f"--target/--draft go after `dustin profile {ctx.invoked_subcommand}`, not before")
        return
    if target is None or draft is None:
        raise DustinError("dustin profile needs --target and --draft (see `dustin profile --help`)")
    from dustin_profile.run import ProfileConfig, run_profile

    group = _start_tp(tp, "auto")  # the target sharded by KV heads, the draft replicated; rank 0 writes

    out = out or RUNS / "profile" / f"{Path(target).name}-{Path(draft).name}.json"
    cfg = ProfileConfig(target=target, draft=draft, out=str(out), calib=tuple(calib or ()), context=context,
                        windows=windows, retrieval=retrieval_windows, budget=budget, sinks=sinks, window=window,
                        max_heads=max_heads, heldout=heldout_windows, max_refresh=max_refresh, dtype=dtype)
    res = run_profile(cfg, command=" ".join(["dustin", *sys.argv[1:]]), console=err_console, restart=restart,
                      tp=group, progress=render.progress)
    if res is not None:  # rank 0
        render.profile(res, cfg)


@profile_app.command("vocab")
def profile_vocab(
    draft: Annotated[str | None, typer.Option(help="The draft (or any model of the pair's tokenizer).")] = None,
    books: Annotated[Path | None, typer.Option("--data", help="Books to count (default ../shared/corpus/gutenberg/"
                                                              "train: not the calibration or eval split).")] = None,
    out: Path | None = typer.Option(None, help="Token-counts JSON (default runs/profile/<draft>-vocab.json; its "
                                               "table beside it)."),
) -> None:
    """Count every token of a corpus with the pair's tokenizer: the frequency ranking that
    `--draft-vocab PATH:K` keeps the top K of (FR-Spec)."""
    from dustin_profile.vocab import count_corpus

    if draft is None:
        raise DustinError("dustin profile vocab needs --draft (whose tokenizer counts)")
    with render.progress("counting books", None) as tick:
        render.vocab(*count_corpus(draft, books, out or RUNS / "profile" / f"{Path(draft).name}-vocab.json", tick))


@profile_app.command("show")
def profile_show(
    path: Path = typer.Argument(..., help="A profile JSON."),
    target: Annotated[str | None, typer.Option(help="Also check the profile against this target.")] = None,
    draft: Annotated[str | None, typer.Option(help="Also check the profile against this draft.")] = None,
    markdown: bool = typer.Option(False, "--markdown", help="Print the ARR, heads and rounds tables as markdown."),
) -> None:
    """Print a profile artifact as tables; with --target/--draft, refuse it if made for other models."""
    from dustin_profile.show import show

    show(path, target, draft, markdown, console)


@eval_app.command("acceptance")
def eval_acceptance(
    target: Target = SMOL,
    draft: Draft = SMOL_DRAFT,
    profile: ProfileFile = None,
    policy: Policy = "all",
    budget: Budget = "128,256,512,1024",
    draft_kv: DraftKV = None,
    refresh_layers: RefreshLayers = "",
    draft_vocab: DraftVocab = None,
    draft_lookup: DraftLookup = None,
    contexts: Contexts = "4096,8192",
    windows: int = typer.Option(2, min=1, max=MAX_COUNT, help="Windows per context, decoded as one batch."),
    windows_per_book: int = typer.Option(1, min=1, max=MAX_COUNT, help="Consecutive windows taken from each book "
                                         "(books in seeded order); intervals then resample books, not windows."),
    max_new_tokens: NewTokens = 64,
    books: Books = None,
    measure_arr: bool = typer.Option(True, "--measure-arr/--no-arr", help="Also record ARR (the share of the true "
                                     "verification attention the set keeps; one more pass per step)."),
    paired: bool = typer.Option(True, "--paired/--no-paired", help="Also run full verification on every "
                                "policy's drafts (paired retention; one more target pass per step)."),
    dtype: Dtype = "auto",
    out: Path = typer.Option(RUNS / "acceptance" / "smollm2-draft",
                             help="Output stem: <out>.json, <out>.md and the resumable <out>.runs.jsonl."),
    restart: Restart = False,
    tp: TP = None,
) -> None:
    """Mean accepted length, its retention vs full and ARR for every policy at every budget (policy ar:
    vanilla greedy decoding too, and every run's output compared with it)."""
    from dustin_eval import acceptance as acc
    from dustin_profile.plan import pair_profile, parse_ints, parse_layers, parse_policies
    from dustin_runtime.lookup import LookupConfig

    chosen = tuple(parse_policies(policy))
    vanilla, chosen = acc.VANILLA in chosen, tuple(p for p in chosen if p != acc.VANILLA)
    cfg = acc.AcceptanceConfig(
        contexts=tuple(parse_ints(contexts, "--contexts")), windows=windows, windows_per_book=windows_per_book,
        max_new_tokens=max_new_tokens, budgets=tuple(parse_ints(budget, "--budget")), policies=chosen,
        books_dir=str(books) if books else acc.AcceptanceConfig.books_dir, measure_arr=measure_arr,
        paired=paired, lookup=None if draft_lookup is None else LookupConfig.parse(draft_lookup), vanilla=vanilla)
    plans = acc.plan_budgets(chosen, cfg.budgets, pair_profile(profile, target, draft, chosen), draft_kv,
                             parse_layers(refresh_layers))
    with _session(out.parent, target, draft, tp, dtype=dtype, draft_vocab=draft_vocab) as (tgt, drf, _, _, group):
        j, m = acc.evaluate(tgt, drf, plans, cfg, out, tp=group, restart=restart, on_record=render.acceptance_record)
    console.print(f"wrote {j} and {m}")


@eval_app.command("pg19")
def eval_pg19(
    books: Books = None,
    target: Target = SMOL,
    draft: Draft = SMOL_DRAFT,
    profile: ProfileFile = None,
    policy: Policy = "full,dustin,streamingllm,quest",
    budget: Budget = "256,512,1024",
    refresh_layers: RefreshLayers = "",
    context: int = typer.Option(4096, min=1, max=MAX_TOKENS, help="Prompt tokens before the scored part of each window."),
    eval_tokens: int = typer.Option(256, min=1, max=MAX_TOKENS,
                                    help="Tokens scored per window through verification windows."),
    windows: int = typer.Option(2, min=1, max=MAX_COUNT, help="Windows (one per book), up to 16 scored together."),
    dtype: Dtype = "auto",
    out_dir: OutDir = None,
    restart: Restart = False,
    tp: TP = None,
) -> None:
    """Perplexity of long books when each teacher-forced verification window attends through the
    policy's set, full-cache perplexity beside it."""
    from dustin_eval import pg19_eval
    from dustin_eval.corpus import book_paths, gutenberg_split
    from dustin_profile.plan import plan_options

    plans = plan_options(policy, budget, profile, target, draft, None, refresh_layers)
    books = books or gutenberg_split("eval")
    book_paths(books)  # refuses a folder without books before the models load
    out_dir = _out(out_dir, "pg19")
    with _session(out_dir, target, draft, tp, plans, True, dtype) as (tgt, drf, make, key, _), \
            render.progress(f"pg19 context {context}", windows * len(plans)) as tick:
        rows = pg19_eval.evaluate(tgt, drf, plans, make, key, books=books, context=context, eval_tokens=eval_tokens,
                                  windows=windows, out_dir=out_dir, restart=restart, on_record=tick)
    render.rows(f"PG-19-style perplexity, context {context}", rows)
    console.print(f"wrote {out_dir}/pg19-{context}.{{json,csv,md,png}}")


@eval_app.command("passkey")
def eval_passkey(
    target: Target = SMOL,
    draft: Draft = SMOL_DRAFT,
    profile: ProfileFile = None,
    policy: Policy = "full,dustin,streamingllm",
    budget: Budget = "256",
    contexts: Contexts = "2048,4096,8192",
    out_dir: OutDir = None,
    restart: Restart = False,
    tp: TP = None,
) -> None:
    """Passkey retrieval accuracy per policy over contexts x needle depths (0, 0.25, ..., 1), with
    heatmaps; the filler is the Gutenberg eval split."""
    from dustin_eval import passkey_eval
    from dustin_profile.plan import parse_ints, plan_options

    plans = plan_options(policy, budget, profile, target, draft)
    ctx, out_dir = parse_ints(contexts, "--contexts"), _out(out_dir, "passkey")
    with _session(out_dir, target, draft, tp, plans) as (tgt, drf, make, key, _), \
            render.progress("passkey", len(plans) * len(ctx) * len(passkey_eval.DEPTHS)) as tick:
        rows = passkey_eval.evaluate(tgt, drf, plans, make, key, contexts=ctx, out_dir=out_dir, restart=restart,
                                     on_record=tick)
    render.rows("passkey retrieval accuracy", rows)
    console.print(f"wrote {out_dir}/passkey.{{json,csv,md}} and heatmaps")


@eval_app.command("longbench")
def eval_longbench(
    data: str | None = typer.Option(None, help="LongBench v1: a folder of <dataset>.jsonl files (default "
                                               "../shared/longbench), a Hugging Face datasets cache folder holding "
                                               "THUDM/LongBench, or that id in the default cache."),
    datasets: str | None = typer.Option(None, help="Datasets, comma-separated (default: those present of the 16 English)."),
    target: Target = SMOL,
    draft: Draft = SMOL_DRAFT,
    profile: ProfileFile = None,
    policy: Policy = "dustin",
    budget: Budget = "512",
    limit: int | None = typer.Option(None, min=1, max=MAX_COUNT, help="First N samples of each dataset."),
    out_dir: OutDir = None,
    restart: Restart = False,
    tp: TP = None,
) -> None:
    """LongBench (v1, English subsets): reference prompts, truncation and metrics, greedy decoding
    through each verification policy."""
    from dustin_eval import longbench_runner as lb
    from dustin_profile.plan import plan_options

    plans = plan_options(policy, budget, profile, target, draft)
    data, names = lb.sources(data, datasets)
    out_dir = _out(out_dir, "longbench")
    with _session(out_dir, target, draft, tp, plans) as (tgt, drf, make, key, _):
        rows = lb.evaluate(tgt, drf, plans, make, key, data=data, datasets=names, out_dir=out_dir, limit=limit,
                           restart=restart, on_record=render.longbench_record)
    render.rows("LongBench", rows)
    console.print(f"wrote {out_dir}/summary.{{csv,md,json}}")


@bench_app.command("attention")
def bench_attention(
    shape: str = typer.Option("qwen2.5-72b", help="Model attention shape(s), comma-separated."),
    context: str = typer.Option("32768", help="Context length(s), comma-separated."),
    batch: str = typer.Option("16", help="Batch size(s), comma-separated."),
    budget: Budget = "512",
    refresh: int = typer.Option(0, min=0, max=MAX_COUNT, help="Refresh layers of dustin to time with the "
                                "estimate (each scores every KV head of its layer, then selects; 0: none)."),
    out_dir: OutDir = None,
) -> None:
    """Verification attention kernels vs copy bandwidth and SDPA (gamma 4); one JSON per combination."""
    _one_process("bench attention")
    from dustin_eval import bench_attention as ba
    from dustin_profile.plan import parse_ints

    configs = [ba.BenchConfig(shape=s, context=c, batch=b, budget=k, refresh_layers=refresh)
               for s in ba.parse_list(shape, str) for c in ba.parse_list(context) for b in ba.parse_list(batch)
               for k in parse_ints(budget, "--budget")]
    render.attention_sweep(ba.run_sweep(configs, _out(out_dir, "bench"), " ".join(["dustin", *sys.argv[1:]]), on_result=render.attention))


@bench_app.command("e2e")
def bench_e2e(
    target: str = typer.Option("qwen2.5-7b", help="Target: a preset shape (random weights, replayed acceptance) "
                                                 "or a checkpoint (real acceptance)."),
    draft: str | None = typer.Option(None, help="Draft: a preset shape or checkpoint (default: the preset's usual draft)."),
    batch: str = typer.Option("16", help="Batch size(s), comma-separated (zipped with --context)."),
    context: str = typer.Option("32768", help="Context length(s), comma-separated."),
    gamma: Gamma = 4,
    policy: str | None = typer.Option(None, "--policy", help="ar (vanilla decoding), full (standard speculative "
                                      "decoding), dustin, streamingllm, quest; -vs: drafting over the verification "
                                      "set; -r: dustin with --refresh-layers; -x (last): exact mode, K = 2 (-xK: K); "
                                      "comma-separated (default: ar, full, "
                                      "dustin, streamingllm, quest, dustin-vs, streamingllm-vs). Sinks 4, "
                                      "window 64 (the product's); random weights have no profile: dustin scores 4 "
                                      "target and 2 draft KV heads over 2 layers, m = 112."),
    budget: int | None = typer.Option(None, min=1, max=MAX_TOKENS, help="Verification budget S of the sparse "
                                      "policies [default: 512; the -x policies exact mode's 1024, as decode]."),
    refresh_layers: RefreshLayers = "",
    acceptance: str = typer.Option("geometric:0.8", help="Replayed acceptance: geometric:ALPHA or a JSONL of "
                                                         "`dustin decode --json` records; the -x policies add "
                                                         ":agree=P (per-token agreement of sparse and full)."),
    new_tokens: NewTokens = 64,
    alphas: str = typer.Option("0.5,0.6,0.7,0.8,0.9", help="Alpha sweep for the plot ('' to skip)."),
    draft_vocab: str | None = typer.Option(None, "--draft-vocab", help="The draft's LM head over a vocabulary subset "
                                           "(FR-Spec), every policy: K (preset shapes: ids 0..K-1) or PATH:K."),
    draft_lookup: DraftLookup = None,
    out_dir: OutDir = None,
    tp: TP = None,
) -> None:
    """The decoding loop users run (CUDA graphs), end to end per policy, beside vanilla and standard
    speculative decoding in the same process: ms per step, tokens/s, phases, floors, speedups."""
    from dustin_eval import bench_e2e as be

    cfgs = be.configs(batch, context, alphas, policy, refresh_layers, tp, target=target, draft=draft, gamma=gamma,
                      budget=budget, acceptance=acceptance, new_tokens=new_tokens, draft_vocab=draft_vocab, draft_lookup=draft_lookup)
    be.run_all(cfgs, " ".join(["dustin", *sys.argv[1:]]), _out(out_dir, "bench"), _start_tp(tp, "cuda"), render.e2e_record, render.e2e)


def main() -> None:
    """Entry point of the console script: every ending is one line and an exit status (`dustin.process`)."""
    from dustin.process import run

    run(app)


if __name__ == "__main__":
    main()
