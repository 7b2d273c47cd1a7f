"""The `dustin` command: thin typer commands over the library packages.

Commands parse options, plan the policy runs (`dustin_profile.plan`, before any model loads), lock
their output, load the models and call the library. Every bad input, a library `DustinError` or a
usage error of the option parser, becomes one red line on stderr and exit code 2; Ctrl-C one line
and exit 130.

Tensor parallelism: `torchrun --nproc-per-node N -m dustin.cli COMMAND ... --tp N` (decode, bench
e2e, every eval). Every rank runs the command; only rank 0 prints and writes (the others' stdout
goes nowhere and `dustin_runtime.io.files` writes nothing for them); an error is one line on rank 0
and exit code 2 on every rank.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from dustin_runtime.errors import DustinError

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.splitlines()[0])
profile_app = typer.Typer(
    no_args_is_help=True, subcommand_metavar="[show PROFILE | vocab --draft D --out F]",
    help="Offline profiling: `dustin profile --target T --draft D [OPTIONS]` runs Algorithm 1 (retrieval heads "
         "and the draft/target split m maximising ARR) on calibration text and writes a versioned profile; "
         "`dustin profile show PROFILE` prints one.")
eval_app = typer.Typer(no_args_is_help=True, help="Quality evaluations: LongBench, PG-19, passkey, acceptance.")
bench_app = typer.Typer(no_args_is_help=True, help="GPU speed benchmarks.")
app.add_typer(profile_app, name="profile")
app.add_typer(eval_app, name="eval")
app.add_typer(bench_app, name="bench")

console = Console(width=None if sys.stdout.isatty() else 150)  # tables stay readable in logs
err_console = Console(stderr=True)

# Range of token counts (contexts, budgets, new tokens: beyond any model's context) and of other counts
# (windows, trials, batch sizes: beyond any useful run); larger values are refused with one line.
MAX_TOKENS = 1 << 24
MAX_COUNT = 1 << 16

# Options shared by several commands, defined once (defaults stay with each command).
Target = Annotated[str | None, typer.Option(help="Target: HF folder, .gguf file, cached hub id, or 'smollm2'.")]
Draft = Annotated[str | None, typer.Option(help="Draft checkpoint (same tokenizer as the target).")]
ProfileFile = Annotated[Path | None, typer.Option("--profile", help="Profile artifact of the target/draft pair "
                                                                    "(retrieval heads, sinks, window, m).")]
Policies = Annotated[str, typer.Option("--policy", "--policies", help="Policies, comma-separated: full, dustin, "
                                       "draft-only, target-only, streamingllm, quest, oracle ('all': every one).")]
Budgets = Annotated[str, typer.Option("--budget", "--budgets", help="Verification budgets S, comma-separated.")]
Sinks = Annotated[int | None, typer.Option(min=0, max=MAX_TOKENS,
                                           help="Attention sinks always verified (default: the profile's, else 4).")]
Window = Annotated[int | None, typer.Option(min=0, max=MAX_TOKENS,
                                            help="Recent window always verified (default: the profile's, else 64).")]
AllHeads = Annotated[bool, typer.Option("--all-heads", help="dustin without a profile: every KV head scores.")]
DraftKV = Annotated[str | None, typer.Option("--draft-kv", help="What the draft attends while drafting: full (its "
                                             "whole cache) or verify-set (the latest verification set, the rows "
                                             "since and its drafts). Default: the profile's, else full.")]
RefreshLayers = Annotated[str, typer.Option("--refresh-layers", help="dustin: target layers (comma-separated) at "
                                            "which the verification pass chooses the set again from that layer's "
                                            "current queries (every KV head); later layers attend it. Default: "
                                            "the profile's (`dustin profile --max-refresh`); 'none': no refresh.")]
DraftVocab = Annotated[str | None, typer.Option("--draft-vocab", help="The draft's LM head over a vocabulary subset "
                                               "(FR-Spec): PATH:K keeps the K most frequent tokens of a token-counts "
                                               "file (`dustin profile vocab`) and EOS; the rest get probability 0 "
                                               "(verification stays exact).")]
DraftLookup = Annotated[str | None, typer.Option("--draft-lookup", help="Draft tokens copied from each sequence's "
                                                "own history where it repeats (prompt lookup): MAX or MAX:MIN "
                                                "n-gram lengths, longest match first (MIN defaults to 2); the "
                                                "draft model's token where nothing matches. Exact (greedy and "
                                                "sampled). Off by default.")]
MeasureArr = Annotated[bool, typer.Option("--measure-arr/--no-arr", help="Also record ARR (the share of the true "
                                          "verification attention the set keeps; one more pass per step).")]
Gamma = Annotated[int, typer.Option(min=1, max=MAX_COUNT,
                                    help="Draft tokens per step (gamma + 1 verification queries).")]
NewTokens = Annotated[int, typer.Option(min=1, max=MAX_TOKENS, help="New tokens per sequence.")]
Contexts = Annotated[str, typer.Option("--contexts", help="Prompt lengths in tokens, comma-separated.")]
Dtype = Annotated[str, typer.Option(help="bf16 | fp16 | fp32 (auto: bf16 on CUDA, fp32 on CPU).")]
Device = Annotated[str, typer.Option(help="cuda | cpu (auto: cuda when available).")]
Seed = Annotated[int, typer.Option(min=0, max=(1 << 63) - 1, help="Seed (data order, sampling).")]
OutDir = Annotated[Path, typer.Option(help="Output folder: resumable records inside, locked while a run writes.")]
Restart = Annotated[bool, typer.Option("--restart", help="Discard the records an earlier run left in the same "
                                                         "output (needed to change its settings).")]
TP = Annotated[int | None, typer.Option("--tp", min=1, max=MAX_COUNT,
                                        help="Tensor-parallel ranks, one process per GPU, started by `torchrun "
                                             "--nproc-per-node N -m dustin.cli ...` (default: the launcher's).")]

def _ints(text: str, option: str, minimum: int = 1, maximum: int = MAX_TOKENS) -> list[int]:
    """A comma-separated list of integers in [minimum, maximum], or one clear error naming the option."""
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise DustinError(f"{option} {text!r}: expected comma-separated integers") from None
    if not vals:
        raise DustinError(f"{option}: give at least one value")
    bad = [v for v in vals if v < minimum]
    if bad:
        raise DustinError(f"{option}: {bad[0]} is below {minimum}")
    big = [v for v in vals if v > maximum]
    if big:
        raise DustinError(f"{option}: {big[0]} is above {maximum}")
    return vals


def _names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _policies(text: str) -> list[str]:
    from dustin_runtime.sparse.policies import POLICY_CLASSES

    return list(POLICY_CLASSES) if text.strip() == "all" else _names(text)


@bench_app.command("attention")
def bench_attention(
    shape: str = typer.Option("qwen2.5-72b", help="Model attention shape(s), comma-separated."),
    context: str = typer.Option("32768", help="Context length(s), comma-separated."),
    batch: str = typer.Option("16", help="Batch size(s), comma-separated."),
    budget: str = typer.Option("512", help="Verification budget(s) S, comma-separated."),
    gamma: int = typer.Option(4, help="Draft tokens; M = gamma + 1 verification queries."),
    out_dir: str = typer.Option("results/bench", help="Folder for attention-<shape>-<context>-<batch>-<budget>.json."),
    sdpa: bool = typer.Option(True, help="Also time the PyTorch SDPA backends."),
    refresh: int = typer.Option(0, min=0, max=MAX_COUNT, help="Refresh layers of dustin to time with the "
                                "estimate (each scores every KV head of its layer, then selects; 0: none)."),
) -> None:
    """Verification attention kernels vs copy bandwidth and SDPA; one JSON per combination."""
    _one_process("bench attention")
    from rich.table import Table

    from dustin_eval import bench_attention as ba

    configs = [
        ba.BenchConfig(shape=s, context=c, batch=b, budget=k, gamma=gamma, sdpa=sdpa,
                       refresh_layers=refresh)
        for s in ba.parse_list(shape, str) for c in ba.parse_list(context) for b in ba.parse_list(batch)
        for k in ba.parse_list(budget)
    ]
    command = "dustin " + " ".join(sys.argv[1:])
    summaries = []

    def show(res: dict) -> None:
        cfg, s = res["config"], res["summary"]
        t = Table(title=f"{cfg['shape']} context {cfg['context']} batch {cfg['batch']} budget {cfg['budget']} "
                        f"({res['environment']['gpu']}, copy {s['copy_tbps']:.2f} TB/s)")
        for col in ("kernel", "graph ms/layer", "do_bench ms", "MB", "TB/s", "of copy bw"):
            t.add_column(col, justify="left" if col == "kernel" else "right")
        for r in res["records"]:
            if "median_ms" not in r:
                t.add_row(r["kernel"], "-", "-", "-", "-", r.get("error", "")[:40])
                continue
            t.add_row(r["kernel"], f"{r['median_ms']:.4f}", f"{r['do_bench_ms']:.4f}", f"{r['bytes'] / 1e6:.1f}",
                      f"{r.get('tbps', 0):.2f}", f"{r.get('bandwidth_fraction', 0):.0%}")
        console.print(t)
        est, vs_topk = s["estimate_select_fraction"], s["select_vs_topk_speedup"]
        console.print(f"speedup sparse vs best full ({s['best_full_kernel']}): {s['speedup_sparse_vs_best_full']:.1f}x; "
                      f"estimate+select: {est if est is None else f'{est:.2%}'} of {res['shapes']['model']['layers']} "
                      f"layers of full attention; select vs topk: {vs_topk if vs_topk is None else f'{vs_topk:.1f}x'}")
        if s.get("refresh_fraction") is not None:
            console.print(f"{s['refresh_layers']} refresh layers of {s['refresh_kv_heads']} KV heads: "
                          f"{s['refresh_fraction']:.2%} (cost model "
                          f"{s['refresh_model_fraction']:.2%}); estimate+select with them: "
                          f"{s['estimate_with_refresh_fraction']:.2%}")
        summaries.append(res)

    ba.run_sweep(configs, out_dir, command, on_result=show)
    if len(summaries) > 1:
        t = Table(title="sweep summary")
        for col in ("shape", "context", "batch", "budget", "best full", "full ms", "sparse ms", "speedup", "estimate"):
            t.add_column(col)
        for res in summaries:
            cfg, s = res["config"], res["summary"]
            t.add_row(cfg["shape"], str(cfg["context"]), str(cfg["batch"]), str(cfg["budget"]), s["best_full_kernel"],
                      f"{s['best_full_ms']:.4f}", f"{s['sparse_ms']:.4f}", f"{s['speedup_sparse_vs_best_full']:.1f}x",
                      "-" if s["estimate_select_fraction"] is None else f"{s['estimate_select_fraction']:.2%}")
        console.print(t)


@bench_app.command("e2e")
def bench_e2e(
    target: str = typer.Option("qwen2.5-7b", help="Target: a preset shape (random weights, replayed acceptance) "
                                                 "or a checkpoint (real acceptance)."),
    draft: str | None = typer.Option(None, help="Draft: a preset shape or checkpoint (default: the preset's usual draft)."),
    batch: str = typer.Option("16", help="Batch size(s), comma-separated (zipped with --context)."),
    context: str = typer.Option("32768", help="Context length(s), comma-separated."),
    gamma: Gamma = 4,
    budget: int = typer.Option(512, min=1, max=MAX_TOKENS, help="Verification budget S of the sparse policies."),
    policies: str = typer.Option(",".join(("ar", "full", "dustin", "streamingllm", "quest", "dustin-vs")),
                                 help="ar (vanilla decoding), full (standard speculative decoding), dustin, "
                                      "streamingllm, quest; -vs: drafting over the verification set "
                                      "(dustin-vs, streamingllm-vs); -r: dustin with --refresh-layers "
                                      "(dustin-r, dustin-vs-r); comma-separated."),
    refresh_layers: str = typer.Option("", "--refresh-layers",
                                       help="Target layers (comma-separated) at which the -r policies choose "
                                            "the set again inside the verification pass."),
    acceptance: str = typer.Option("geometric:0.8", help="Replayed acceptance: geometric:ALPHA or a JSONL of "
                                                         "`dustin decode --json` records."),
    new_tokens: NewTokens = 64,
    srh: int = typer.Option(4, min=0, max=MAX_COUNT, help="Target retrieval KV heads of dustin (over 2 layers)."),
    draft_srh: int = typer.Option(2, min=0, max=MAX_COUNT,
                                  help="Draft retrieval KV heads of dustin (its lookahead signal)."),
    m: int = typer.Option(112, min=0, max=MAX_TOKENS, help="Rows chosen by the draft's lookahead (0: target "
                                                           "history only)."),
    alphas: str = typer.Option("0.5,0.6,0.7,0.8,0.9", help="Alpha sweep for the plot ('' to skip)."),
    draft_vocab: str | None = typer.Option(None, "--draft-vocab", help="The draft's LM head over a vocabulary "
                                           "subset (FR-Spec), for every policy: K (preset shapes: ids 0..K-1) or "
                                           "PATH:K (the K most frequent tokens of `dustin profile vocab`'s file)."),
    draft_lookup: DraftLookup = None,
    out_dir: Path = typer.Option(Path("results/bench"), help="Folder for e2e-<target>-<context>-<batch>[-tp<N>].json."),
    tp: TP = None,
) -> None:
    """The decoding loop users run (CUDA graphs), end to end per policy, beside vanilla and standard
    speculative decoding in the same process: ms per step, tokens/s, phases, floors, speedups."""
    from dataclasses import replace

    from rich.table import Table

    from dustin_eval import bench_e2e as be

    bs, cs = _ints(batch, "--batch", maximum=MAX_COUNT), _ints(context, "--context")
    try:
        al = tuple(float(x) for x in alphas.split(",") if x.strip())
    except ValueError:
        raise DustinError(f"--alphas {alphas!r}: expected comma-separated numbers") from None
    if len(bs) != len(cs) and 1 not in (len(bs), len(cs)):
        raise DustinError("--batch and --context: give lists of one length (zipped) or one value")
    n = max(len(bs), len(cs))
    pairs = list(zip(bs * n if len(bs) == 1 else bs, cs * n if len(cs) == 1 else cs, strict=True))
    names = tuple(p.strip() for p in policies.split(",") if p.strip())
    command = "dustin " + " ".join(sys.argv[1:])
    cfgs = [be.E2EConfig(target=target, draft=draft, batch=b, context=c, gamma=gamma, budget=budget,
                         policies=names, acceptance=acceptance, new_tokens=new_tokens, srh=srh, draft_srh=draft_srh,
                         m=m, alphas=al, refresh_layers=_layers(refresh_layers) or (), draft_vocab=draft_vocab,
                         draft_lookup=draft_lookup)
            for b, c in pairs]
    for cfg in cfgs:  # every run checked before a GPU is touched
        cfg.check()
    if draft_lookup is not None and tp is not None:
        raise DustinError("--draft-lookup runs in one process (not under --tp)")
    group = _start_tp(tp, "cuda")
    for cfg in cfgs:
        b, c = cfg.batch, cfg.context
        cfg = replace(cfg, tp=1 if group is None else group.world)
        res = be.run_e2e(cfg, command, tp=group, on_record=lambda r: console.print(
            f"{r['policy']:>12}: {r['ms_per_step']:.2f} ms/step, {r['tokens_per_s']:.0f} tok/s "
            f"(graph phases {r['graph_phase_sum_ms']:.2f} ms"
            + (f", collectives {r['tp']['collective_ms_per_step']:.2f} ms" if r.get("tp") else "") + ")",
            highlight=False))
        path = be.write_result(res, out_dir)
        sources = {r["acceptance_source"] for r in res["records"] if r["policy"] != "ar"}
        accepted = f"acceptance {acceptance}" if sources <= {acceptance} else f"{', '.join(sorted(sources))} acceptance"
        t = Table(title=f"{res['models']['target']} + {res['models']['draft']}, batch {b}, context {c}, "
                        f"gamma {gamma}, S {budget}, {accepted} ({res['environment']['gpu']})")
        for col in ("policy", "ms/step", "graph sum", "byte floor", "tok/s", "accepted", "vs ar", "vs full"):
            t.add_column(col, justify="left" if col == "policy" else "right")
        for r in res["records"]:
            s = res["summary"][r["policy"]]
            t.add_row(r["policy"], f"{r['ms_per_step']:.2f}", f"{r['graph_phase_sum_ms']:.2f}",
                      f"{r['byte_floor_ms']:.2f}", f"{r['tokens_per_s']:.0f}", f"{r['mean_accepted']:.2f}",
                      f"{s.get('speedup_vs_ar', float('nan')):.2f}x", f"{s.get('speedup_vs_full', float('nan')):.2f}x")
        console.print(t)
        for name, s in res["summary"].items():
            if "vs_no_refresh" in s:
                console.print(f"{name} (refresh layers {res['sparse']['refresh_layers']}) vs "
                              f"{name.removesuffix(be.REFRESH)}: {s['vs_no_refresh']:.3f}x tokens/s", highlight=False)
        console.print(f"wrote {path}")


@profile_app.callback(invoke_without_command=True)
def profile(
    ctx: typer.Context,
    target: Target = None,
    draft: Draft = None,
    calib: list[str] | None = typer.Option(
        None, help="Calibration text: .txt/.md files, folders, globs, .jsonl or .parquet (repeat the option). "
                   "Default: ../shared/corpus/gutenberg/calib."),
    context: int = typer.Option(8192, min=1, max=MAX_TOKENS, help="Context length L of the verification passes."),
    windows: int = typer.Option(16, min=1, max=MAX_COUNT, help="Calibration windows (one prefill each)."),
    retrieval_windows: int = typer.Option(0, min=0, max=MAX_COUNT,
                                          help="Extra key-value retrieval windows (a fact hidden in calibration "
                                                  "prose, asked for at the end) so retrieval heads can win."),
    retrieval_weight: float = typer.Option(0.5, help="Share of every mean ARR given to the retrieval windows' "
                                                     "question passes."),
    positions: int = typer.Option(8, min=1, max=MAX_COUNT, help="Verification passes per window (in its last quarter)."),
    budget: int = typer.Option(512, min=1, max=MAX_TOKENS, help="Verification budget S (tokens of the selected set)."),
    gamma: Gamma = 4,
    sinks: int = typer.Option(4, min=0, max=MAX_TOKENS, help="Attention-sink tokens always in the set."),
    window: int = typer.Option(64, min=0, max=MAX_TOKENS, help="Recent tokens always in the set."),
    budgets: str = typer.Option("128,256,512,1024", help="Budgets of the ARR-vs-budget table and m_by_budget."),
    max_heads: int = typer.Option(8, min=1, max=MAX_COUNT, help="Head limit of the greedy search (draft + target KV "
                                                                "heads)."),
    heldout_windows: int = typer.Option(0, min=0, max=MAX_COUNT, help="More windows recorded to score the profile "
                                                                      "on (never searched on)."),
    max_refresh: int = typer.Option(0, help="After the head search, choose up to this many refresh layers of the "
                                            "dustin policy greedily by teacher-forced perplexity on the calibration "
                                            "windows (0: none; one set only)."),
    epsilon: float = typer.Option(1e-3, help="Stop when the best ARR gain of a round is below this."),
    m_points: int = typer.Option(9, min=1, max=MAX_COUNT, help="Grid points for m over [0, S - sinks - window]."),
    seed: Seed = 0,
    verify_tokens: str = typer.Option("draft", help="Verification tokens: 'draft' (its greedy drafts) or 'text'."),
    text_field: str = typer.Option("text", help="Text field of JSONL / parquet calibration records."),
    device: Device = "auto",
    dtype: Dtype = "auto",
    out: Path | None = typer.Option(None, help="Profile JSON (default: profiles/<target>-<draft>.json); "
                                               "tables and plots go beside it, resumable work in <out>.work/."),
    restart: Restart = False,
) -> None:
    """Offline profiling: Algorithm 1 (greedy retrieval-head search and draft/target split m maximising
    ARR) on calibration text, written as a versioned profile artifact. `dustin profile show p.json` prints one."""
    if ctx.invoked_subcommand is not None:
        if target or draft:
            raise DustinError(f"--target/--draft go after `dustin profile {ctx.invoked_subcommand}`, not before")
        return
    if target is None or draft is None:
        raise DustinError("dustin profile needs --target and --draft (see `dustin profile --help`)")
    _one_process("profile")
    from dustin_profile.run import ProfileConfig, run_profile
    from dustin_profile.show import render

    bl = tuple(_ints(budgets, "--budgets"))
    if out is None:
        out = Path("profiles") / f"{Path(target).name}-{Path(draft).name}.json"
    cfg = ProfileConfig(target=target, draft=draft, out=str(out), calib=tuple(calib or ()), context=context,
                        windows=windows, retrieval=retrieval_windows, retrieval_weight=retrieval_weight,
                        positions=positions, budget=budget, gamma=gamma, sinks=sinks,
                        window=window, budgets=bl, max_heads=max_heads, epsilon=epsilon, m_points=m_points,
                        heldout=heldout_windows, max_refresh=max_refresh,
                        seed=seed, verify_tokens=verify_tokens, text_field=text_field, device=device, dtype=dtype)
    res = run_profile(cfg, command="dustin " + " ".join(sys.argv[1:]), console=err_console, restart=restart)
    for r in render(res.profile, res.path.parent):
        console.print(r)
    console.print(f"wrote {res.path} ({res.recorded} windows recorded, "
                  f"{cfg.windows + cfg.heldout + cfg.retrieval - res.recorded} resumed) in {res.seconds['total']:.1f} s")
    if not res.profile.has_heads:
        console.print(f"[yellow]no retrieval head raised ARR by --epsilon {epsilon:g}: this profile cannot drive "
                      "--policy dustin (a smaller --epsilon or more --windows may find some)[/]")


@profile_app.command("vocab")
def profile_vocab(
    draft: Annotated[str | None, typer.Option(help="The draft (or any model of the pair's tokenizer).")] = None,
    books_dir: Path | None = typer.Option(None, help="Books to count (default ../shared/corpus/gutenberg/train: "
                                                     "not the calibration or eval split)."),
    max_books: int | None = typer.Option(None, min=1, max=MAX_COUNT, help="Count the first N books only."),
    out: Path = typer.Option(..., help="Token-counts JSON (its table: <out stem>.counts.parquet beside it)."),
) -> None:
    """Count every token of a corpus with the pair's tokenizer: the frequency ranking that
    `--draft-vocab PATH:K` keeps the top K of (FR-Spec)."""
    from rich.progress import Progress

    from dustin_eval.corpus import book_paths, gutenberg_split, read_book
    from dustin_profile.vocab import check_out, count_tokens, write_token_counts
    from dustin_runtime.loader import resolve_checkpoint
    from dustin_runtime.tokenizer import load_tokenizer

    if draft is None:
        raise DustinError("dustin profile vocab needs --draft (whose tokenizer counts)")
    check_out(out)
    folder = books_dir or gutenberg_split("train")
    paths = book_paths(folder)[:max_books]
    tok = load_tokenizer(resolve_checkpoint(draft))
    with Progress(console=err_console, transient=True) as bar:
        task = bar.add_task("counting tokens", total=len(paths))
        counts = count_tokens(tok, (read_book(p) for p in paths), on_text=lambda i: bar.advance(task))
    path = write_token_counts(out, counts, tok, books=str(folder), n_books=len(paths), model_id=draft)
    meta = json.loads(path.read_text())
    cov = ", ".join(f"top {k}: {v:.4f}" for k, v in meta["coverage_of_top_k"].items())
    console.print(f"wrote {path}: {meta['tokens']} tokens of {len(paths)} books, {meta['seen_tokens']} of "
                  f"{meta['vocab_size']} ids seen; share of tokens in the {cov}", highlight=False)


@profile_app.command("show")
def profile_show(
    path: Path = typer.Argument(..., help="A profile JSON."),
    target: Annotated[str | None, typer.Option(help="Also check the profile against this target.")] = None,
    draft: Annotated[str | None, typer.Option(help="Also check the profile against this draft.")] = None,
    markdown: bool = typer.Option(False, "--markdown", help="Print the ARR, heads and rounds tables as markdown."),
) -> None:
    """Print a profile artifact as tables; with --target/--draft, refuse it if made for other models."""
    from dustin_profile.artifact import check_models, load_profile
    from dustin_profile.run import info_of
    from dustin_profile.show import render

    prof = load_profile(path)
    if target or draft:
        check_models(prof, info_of(target) if target else prof.target, info_of(draft) if draft else prof.draft,
                     str(path))
    if markdown:
        from dustin_profile.show import markdown as to_markdown

        print(to_markdown(prof, path.parent), end="")
        return
    for r in render(prof, path.parent):
        console.print(r)
    if target or draft:
        console.print(f"[green]{path} matches the given model(s)[/]")


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


def _load_pair(target: str, draft: str | None, dtype: str, device: str, tp=None, draft_vocab: str | None = None):
    """Pick the device and dtype, load the target (under tensor parallelism this rank's shard)
    and the draft (its head over a vocabulary subset with `draft_vocab`) with a spinner."""
    from dustin_runtime import pipeline

    dev = pipeline.pick_device(device)
    with console.status("loading models", spinner="dots"):
        return pipeline.load_pair(target, draft, dtype=pipeline.pick_dtype(dtype, dev), device=dev, tp=tp,
                                  draft_vocab=draft_vocab)


@app.command()
def decode(
    target: Target,
    draft: Annotated[str | None, typer.Option(help="Draft (same tokenizer); without it, autoregressive.")] = None,
    prompt: str | None = typer.Option(None, help="The prompt text."),
    prompt_file: Path | None = typer.Option(None, help="A UTF-8 text file holding one prompt."),
    batch_file: Path | None = typer.Option(None, help='JSONL, one {"prompt": ..., "max_new_tokens": ...} per line.'),
    max_new_tokens: NewTokens = 128,
    gamma: Gamma = 4,
    temperature: float = typer.Option(0.0, help="0 = greedy."),
    top_p: float = typer.Option(1.0, help="Nucleus sampling mass, in (0, 1]."),
    dtype: Dtype = "auto",
    device: Device = "auto",
    chat: bool = typer.Option(False, help="Wrap each prompt in the tokenizer's chat template."),
    seed: Seed = 0,
    json_out: bool = typer.Option(False, "--json", help="Print one JSON record as the last line."),
    profile: ProfileFile = None,
    policy: str = typer.Option("full", help="Verification: full | dustin | draft-only | target-only | "
                                            "streamingllm | quest | oracle (analysis only)."),
    budget: int | None = typer.Option(None, min=1, max=MAX_TOKENS,
                                      help="Verification budget S in context tokens (default: the "
                                                        "profile's)."),
    sinks: Sinks = None,
    window: Window = None,
    all_heads: AllHeads = False,
    draft_kv: DraftKV = None,
    refresh_layers: RefreshLayers = "",
    draft_vocab: DraftVocab = None,
    draft_lookup: DraftLookup = None,
    measure_arr: bool = typer.Option(False, "--measure-arr", help="Also measure ARR on the side (slower)."),
    cuda_graphs: bool = typer.Option(True, "--cuda-graphs/--no-cuda-graphs",
                                     help="Run the decoding steps as CUDA graphs (CUDA only; side measurements "
                                          "run eagerly)."),
    tp: TP = None,
) -> None:
    """Decode prompts with the target, speculatively when a draft is given."""
    from dustin_profile.plan import plan_sparse
    from dustin_runtime import pipeline
    from dustin_runtime.lookup import LookupConfig
    from dustin_runtime.sampling import SamplingConfig

    sampling = SamplingConfig(temperature=temperature, top_p=top_p)
    lookup = None if draft_lookup is None else LookupConfig.parse(draft_lookup)
    if lookup is not None and draft is None:
        raise DustinError("--draft-lookup drafts beside a draft model: give --draft")
    prompts = pipeline.read_prompts(prompt, prompt_file, batch_file, max_new_tokens)
    plan = plan_sparse(policy, profile, budget, sinks, window, all_heads, draft_kv, _layers(refresh_layers))
    if policy != "full" and draft is None:
        raise DustinError(f"policy {policy} verifies a draft's tokens: give --draft")
    group = _start_tp(tp, device)
    tgt, drf = _load_pair(target, draft, dtype, device, group, draft_vocab)
    hooks = None
    if drf is not None:
        from dustin_runtime.sparse.policies import make_policy

        hooks = make_policy(policy, plan.config(tgt, drf), target=tgt.model, draft=drf.model, measure_arr=measure_arr)
    with console.status("decoding", spinner="dots"):
        out = pipeline.decode(tgt, drf, prompts, gamma=gamma, chat=chat, seed=seed, hooks=hooks, sampling=sampling,
                              cuda_graphs=cuda_graphs, lookup=lookup)
    _print_decode(out)
    if json_out:
        print(json.dumps(out.record()))


@eval_app.command("acceptance")
def eval_acceptance(
    target: Target = "smollm2",
    draft: Draft = "models/smollm2-draft",
    profile: ProfileFile = None,
    all_heads: AllHeads = False,
    draft_kv: DraftKV = None,
    refresh_layers: RefreshLayers = "",
    draft_vocab: DraftVocab = None,
    draft_lookup: DraftLookup = None,
    contexts: Contexts = "4096,8192",
    windows: int = typer.Option(2, min=1, max=MAX_COUNT, help="Windows per context, decoded as one batch."),
    windows_per_book: int = typer.Option(1, min=1, max=MAX_COUNT, help="Consecutive windows taken from each book "
                                         "(books in seeded order); intervals then resample books, not windows."),
    max_new_tokens: NewTokens = 64,
    gamma: Gamma = 4,
    budgets: Budgets = "128,256,512,1024",
    policies: Policies = "all",
    sinks: Sinks = None,
    window: Window = None,
    books_dir: Path | None = typer.Option(None, help="Books folder (default ../shared/corpus/gutenberg/eval)."),
    measure_arr: MeasureArr = True,
    paired: bool = typer.Option(True, "--paired/--no-paired", help="Also run full verification on every "
                                "policy's drafts (paired retention; one more target pass per step)."),
    threads: int | None = typer.Option(None, min=1, max=1024, help="torch intra-op threads (CPU)."),
    dtype: Dtype = "auto",
    device: Device = "auto",
    out_dir: OutDir = Path("results/acceptance"),
    name: str = typer.Option("smollm2-draft", help="Result name: <out-dir>/<name>.{json,md,runs.jsonl}."),
    restart: Restart = False,
    tp: TP = None,
) -> None:
    """Mean accepted length, its retention vs full and ARR for every policy at every budget."""
    import torch

    from dustin_eval import acceptance as acc
    from dustin_profile.plan import plan_sparse, read_profile, run_identity, sparse_configs
    from dustin_runtime.io.files import FolderLock
    from dustin_runtime.io.provenance import provenance
    from dustin_runtime.lookup import LookupConfig

    ints = _ints(budgets, "--budgets")
    chosen = tuple(_policies(policies))
    cfg = acc.AcceptanceConfig(
        contexts=tuple(_ints(contexts, "--contexts")), windows=windows, windows_per_book=windows_per_book,
        max_new_tokens=max_new_tokens, gamma=gamma, budgets=tuple(ints), policies=chosen,
        books_dir=str(books_dir) if books_dir else acc.AcceptanceConfig.books_dir, measure_arr=measure_arr,
        paired=paired, lookup=None if draft_lookup is None else LookupConfig.parse(draft_lookup),
    )
    refresh = _layers(refresh_layers)
    if refresh and "dustin" not in chosen:
        raise DustinError("--refresh-layers applies to policy dustin, which is not among the policies")
    loaded = read_profile(profile) if profile is not None else None
    plans = {b: plan_sparse("dustin" if "dustin" in chosen else "streamingllm", loaded, b, sinks, window, all_heads,
                            draft_kv, refresh)
             for b in ints}
    if threads is not None:
        torch.set_num_threads(threads)
    group = _start_tp(tp, device)
    if group is not None and windows % group.world:
        raise DustinError(f"--windows {windows}: each context's windows decode as one batch, which the draft "
                          f"splits over --tp {group.world}; give a multiple of {group.world}")
    with FolderLock(out_dir):
        tgt, drf = _load_pair(target, draft, dtype, device, group, draft_vocab)
        configs = sparse_configs(plans, tgt, drf)
        runs = out_dir / f"{name}.runs.jsonl"

        def show(r: dict) -> None:
            arr = "" if r["arr"] is None else f", ARR {r['arr']:.3f}"
            if r.get("paired_retention") is not None:
                arr += f", paired retention {r['paired_retention']:.3f}"
            console.print(f"context {r['context']} {r['policy']:>12} S={r['budget']}: tau {r['tau']:.3f}{arr} "
                          f"({r['steps']} steps, {r['decode_s']:.0f} s)", highlight=False)

        ident = {**run_identity(tgt, drf), "all_heads": all_heads, "profile": loaded.content if loaded else None}
        if group is not None:
            ident["tp"] = {"world": group.world}
        records = acc.run_acceptance(tgt, drf, configs, cfg, runs, resume_key_extra=ident, restart=restart,
                                     on_record=show)
        extra = {"torch_threads": torch.get_num_threads(), "runs_file": str(runs),
                 "tp": None if group is None else {"world": group.world}}
        if loaded is not None:
            extra["profile"] = {"path": loaded.path, "sha256": loaded.sha256}
        prov = provenance(models={"target": tgt.model_id, "draft": drf.model_id},
                          shapes={"contexts": list(cfg.contexts), "windows": windows,
                                  "windows_per_book": windows_per_book, "gamma": gamma,
                                  "max_new_tokens": max_new_tokens}, extra=extra)
        j, m = acc.write_acceptance(records, out_dir, name, prov, cfg, configs)
    console.print(f"wrote {j} and {m}")


def _print_decode(out) -> None:
    from rich.panel import Panel
    from rich.table import Table

    for i, text in enumerate(out.texts):
        title = f"sequence {i}: {len(out.prompt_tokens[i])} prompt + {len(out.tokens[i])} new tokens ({out.finish_reasons[i]})"
        console.print(Panel(text, title=title, title_align="left"), highlight=False)
    s = out.stats
    console.print(f"[bold]{s.mode} decoding[/]: target {out.meta['target']}"
                  + (f", draft {out.meta['draft']}, gamma {s.gamma}, policy {s.policy}" if out.meta["draft"] else "")
                  + f" ({out.meta['device']}, {out.meta['dtype']})", highlight=False)
    t = Table()
    t.add_column("metric")
    t.add_column("value", justify="right")
    for phase in ("prefill", "draft", "select", "verify", "decode", "other", "total"):
        if phase in s.seconds:
            t.add_row(f"{phase} s", f"{s.seconds[phase]:.3f}")
    t.add_row("new tokens", str(sum(s.new_tokens)))
    t.add_row("steps", str(s.steps))
    t.add_row("ms per step", f"{s.ms_per_step:.2f}")
    t.add_row("decode tokens/s", f"{s.tokens_per_s:.2f}")
    t.add_row("CUDA graphs", "yes" if s.cuda_graphs else "no")
    if s.mode == "speculative":
        t.add_row("mean accepted / step", f"{s.mean_accepted:.3f}")
        t.add_row("mean tokens / step", f"{s.mean_accepted + 1:.3f}")
        if s.batch > 1:
            t.add_row("accepted per sequence", " ".join(f"{a:.2f}" for a in s.accepted_per_sequence()))
    for k, v in s.extra.items():
        t.add_row(k, f"{v:.4f}" if isinstance(v, float) else str(v))
    console.print(t)


def _layers(text: str) -> tuple[int, ...] | None:
    """--refresh-layers: None when not given (the profile's), () for 'none', else layer numbers >= 0."""
    if not text.strip():
        return None
    if text.strip().lower() == "none":
        return ()
    return tuple(_ints(text, "--refresh-layers", minimum=0))


def _plan(policy: str, budget: str, profile, sinks, window, all_heads, draft_kv=None, refresh=""):
    """Every policy run, checked before any model loads."""
    from dustin_profile.plan import plan_runs

    return plan_runs(_policies(policy), _ints(budget, "--budget"), profile, sinks, window, all_heads, draft_kv,
                     _layers(refresh))


def _bind(plans, tgt, drf, measure_arr: bool, group=None):
    """The hooks factory of the planned runs on the loaded pair, and their resume key (models,
    dtype, device, tensor-parallel world, each run's settings)."""
    from dustin_profile import plan as pl

    configs = pl.sparse_configs(plans, tgt, drf)
    key = {**pl.run_identity(tgt, drf), "measure_arr": measure_arr, "runs": pl.runs_key(plans, configs)}
    if group is not None:
        key["tp"] = {"world": group.world}
    return pl.hooks_factory(configs, tgt, drf, measure_arr), key


@eval_app.command("pg19")
def eval_pg19(
    data: Path | None = typer.Option(None, help="Folder of .txt books (default ../shared/corpus/gutenberg/eval)."),
    target: Target = "smollm2",
    draft: Draft = "models/smollm2-draft",
    profile: ProfileFile = None,
    policy: Policies = "full,dustin,streamingllm,quest",
    budget: Budgets = "256,512,1024",
    context: int = typer.Option(4096, min=1, max=MAX_TOKENS, help="Prompt tokens before the scored part of each window."),
    eval_tokens: int = typer.Option(256, min=1, max=MAX_TOKENS,
                                    help="Tokens scored per window through verification windows."),
    windows: int = typer.Option(2, min=1, max=MAX_COUNT, help="Windows (one per book)."),
    batch_size: int = typer.Option(8, min=1, max=MAX_COUNT,
                                   help="Windows scored together (each its own sequence and set)."),
    gamma: Gamma = 4,
    sinks: Sinks = None,
    window: Window = None,
    all_heads: AllHeads = False,
    draft_kv: DraftKV = None,
    refresh_layers: RefreshLayers = "",
    measure_arr: MeasureArr = True,
    seed: Seed = 0,
    dtype: Dtype = "auto",
    device: Device = "auto",
    out_dir: OutDir = Path("results/pg19"),
    restart: Restart = False,
    tp: TP = None,
) -> None:
    """Perplexity of long books when each teacher-forced verification window attends through the
    policy's set, full-cache perplexity beside it."""
    from rich.progress import Progress

    from dustin_eval.corpus import book_paths, gutenberg_split
    from dustin_eval.pg19_eval import run_pg19
    from dustin_runtime.io.files import FolderLock

    plans = _plan(policy, budget, profile, sinks, window, all_heads, draft_kv, refresh_layers)
    books = data or gutenberg_split("eval")
    book_paths(books)  # refuses a folder without books before the models load
    group = _start_tp(tp, device)
    with FolderLock(out_dir):
        tgt, drf = _load_pair(target, draft, dtype, device, group)
        make, key = _bind(plans, tgt, drf, measure_arr, group)
        with Progress(console=console) as bar:
            task = bar.add_task(f"pg19 context {context}", total=windows * len(plans))
            rows = run_pg19(tgt.model, drf.model, tgt.tokenizer, books_dir=books, context=context,
                            eval_tokens=eval_tokens, gamma=gamma, runs=list(plans), make_hooks=make, windows=windows,
                            out_dir=out_dir, models={"target": tgt.model_id, "draft": drf.model_id}, seed=seed,
                            resume_key=key, restart=restart, on_record=lambda r: bar.advance(task),
                            batch=batch_size)
    _print_rows(f"PG-19-style perplexity, context {context}", rows)
    console.print(f"wrote {out_dir}/pg19-{context}.{{json,csv,md,png}}")


@eval_app.command("passkey")
def eval_passkey(
    target: Target = "smollm2",
    draft: Draft = "models/smollm2-draft",
    profile: ProfileFile = None,
    policy: Policies = "full,dustin,streamingllm",
    budget: Budgets = "256",
    contexts: Contexts = "2048,4096,8192",
    depths: str = typer.Option("0,0.25,0.5,0.75,1", help="Needle depths in [0, 1], comma-separated."),
    trials: int = typer.Option(1, min=1, max=MAX_COUNT, help="Prompts per context and depth."),
    max_new_tokens: NewTokens = 10,
    gamma: Gamma = 4,
    sinks: Sinks = None,
    window: Window = None,
    all_heads: AllHeads = False,
    draft_kv: DraftKV = None,
    refresh_layers: RefreshLayers = "",
    filler: Path | None = typer.Option(None, help="Folder of .txt books for the filler (default: gutenberg eval)."),
    dtype: Dtype = "auto",
    device: Device = "auto",
    out_dir: OutDir = Path("results/passkey"),
    restart: Restart = False,
    tp: TP = None,
) -> None:
    """Passkey retrieval accuracy per policy over contexts x depths, with heatmaps."""
    from rich.progress import Progress

    from dustin_eval.corpus import gutenberg_split, read_filler
    from dustin_eval.passkey_eval import run_passkey
    from dustin_runtime.io.files import FolderLock

    plans = _plan(policy, budget, profile, sinks, window, all_heads, draft_kv, refresh_layers)
    ctx = _ints(contexts, "--contexts")
    try:
        dps = [float(d) for d in depths.split(",") if d.strip()]
    except ValueError:
        raise DustinError(f"--depths {depths!r}: expected comma-separated numbers in [0, 1]") from None
    if not dps or not all(0.0 <= d <= 1.0 for d in dps):
        raise DustinError(f"--depths {depths!r}: expected comma-separated numbers in [0, 1]")
    text = read_filler(filler or gutenberg_split("eval"), max_books=3)
    group = _start_tp(tp, device)
    with FolderLock(out_dir):
        tgt, drf = _load_pair(target, draft, dtype, device, group)
        limit = min(tgt.model.cfg.max_position_embeddings, drf.model.cfg.max_position_embeddings)
        if max(ctx) + max_new_tokens > limit:
            raise DustinError(f"context {max(ctx)} + {max_new_tokens} new tokens exceeds the models' limit of {limit} "
                              f"tokens; use --contexts up to {limit - max_new_tokens}")
        make, key = _bind(plans, tgt, drf, False, group)
        with Progress(console=console) as bar:
            task = bar.add_task("passkey", total=len(plans) * len(ctx) * len(dps) * trials)
            rows = run_passkey(tgt.model, drf.model, tgt.tokenizer, filler_text=text, contexts=ctx, depths=dps,
                               trials=trials, gamma=gamma, runs=list(plans), make_hooks=make, out_dir=out_dir,
                               max_new_tokens=max_new_tokens, models={"target": tgt.model_id, "draft": drf.model_id},
                               resume_key=key, restart=restart, on_record=lambda r: bar.advance(task))
    _print_rows("passkey retrieval accuracy", rows)
    console.print(f"wrote {out_dir}/passkey.{{json,csv,md}} and heatmaps")


@eval_app.command("longbench")
def eval_longbench(
    data: str = typer.Option(..., help="LongBench v1: a folder of <dataset>.jsonl files, a Hugging Face datasets "
                                       "cache folder holding THUDM/LongBench, or that id in the default cache."),
    datasets: str | None = typer.Option(None, help="Datasets, comma-separated (default: those present of the 16 English)."),
    target: Target = "smollm2",
    draft: Draft = "models/smollm2-draft",
    profile: ProfileFile = None,
    policy: Policies = "dustin",
    budget: Budgets = "512",
    gamma: Gamma = 4,
    max_length: int | None = typer.Option(None, min=1, max=MAX_TOKENS, help="Prompt truncation length (default: the target's context)."),
    limit: int | None = typer.Option(None, min=1, max=MAX_COUNT, help="First N samples of each dataset."),
    batch_size: int = typer.Option(1, min=1, max=MAX_COUNT, help="Prompts decoded together."),
    sinks: Sinks = None,
    window: Window = None,
    all_heads: AllHeads = False,
    draft_kv: DraftKV = None,
    refresh_layers: RefreshLayers = "",
    dtype: Dtype = "auto",
    device: Device = "auto",
    out_dir: OutDir = Path("results/longbench"),
    restart: Restart = False,
    tp: TP = None,
) -> None:
    """LongBench (v1, English subsets): reference prompts, truncation and metrics, greedy decoding
    through each verification policy."""
    from dustin_eval.generator import RuntimeGenerator
    from dustin_eval.longbench_config import DATASETS
    from dustin_eval.longbench_data import available_datasets
    from dustin_eval.longbench_runner import RunMeta, run_longbench, summarize_predictions
    from dustin_runtime.io.files import FolderLock
    from dustin_runtime.tokenizer import eos_ids

    plans = _plan(policy, budget, profile, sinks, window, all_heads, draft_kv, refresh_layers)
    present = available_datasets(data)  # refuses a source that is neither a folder nor a dataset id
    if datasets:
        names = _names(datasets)
        unknown = [d for d in names if d not in DATASETS]
        if unknown or not names:
            raise DustinError(f"unknown LongBench dataset(s) {', '.join(unknown) or repr(datasets)}; "
                              f"known: {', '.join(DATASETS)}")
    else:
        names = present
        if not names:
            raise DustinError(f"{data}: none of the 16 English LongBench datasets is there")
    group = _start_tp(tp, device)
    with FolderLock(out_dir):
        tgt, drf = _load_pair(target, draft, dtype, device, group)
        make, key = _bind(plans, tgt, drf, False, group)
        limit_len = max_length or min(tgt.model.cfg.max_position_embeddings, drf.model.cfg.max_position_embeddings)
        common = {k: v for k, v in key.items() if k != "runs"}
        for run in plans:
            gen = RuntimeGenerator(tgt.model, drf.model, gamma=gamma, hooks_factory=lambda run=run: make(run),
                                   batch_size=batch_size)
            meta = RunMeta(policy=run.policy, budget=run.budget, target=tgt.model_id, draft=drf.model_id,
                           extra={"gamma": gamma, "profile": str(profile) if profile else None})
            run_longbench(gen, tgt.tokenizer, meta, data_dir=data, out_dir=out_dir, max_length=limit_len,
                          datasets=names, eos_ids=list(eos_ids(tgt.tokenizer, tgt.model.cfg.eos_token_ids)),
                          batch_size=batch_size, limit=limit, resume_key={**common, "gamma": gamma, "run": key["runs"][run.label]},
                          restart=restart, on_record=lambda r: console.print(
                              f"{r['dataset']} {r['_id'][:8]} {r['policy']}@{r['budget']}: score {r['score']:.3f}",
                              highlight=False))
    _print_rows("LongBench", summarize_predictions(out_dir))
    console.print(f"wrote {out_dir}/summary.{{csv,md,json}}")


def _print_rows(title: str, rows: list[dict]) -> None:
    from rich.table import Table

    if not rows:
        return
    t = Table(title=title)
    cols = list(dict.fromkeys(k for r in rows for k in r))
    for c in cols:
        t.add_column(str(c))
    for r in rows:
        t.add_row(*[f"{r[c]:.4g}" if isinstance(r.get(c), float) else str(r.get(c, "")) for c in cols])
    console.print(t)


def _fail(message: str, code: int) -> None:
    """One line on stderr (newlines in a message folded; rank 0 only under a launcher), then exit
    with `code`."""
    line = " ".join(message.split())
    err_console.print(Text.assemble(("error: ", "bold red"), line), highlight=False, soft_wrap=True)
    if code != 130:  # errors are agreed across ranks (none is inside a collective); an interrupt may be
        _leave()
    sys.exit(code)


def _leave() -> None:
    """Leave the tensor-parallel process group, if this command joined one."""
    from dustin_runtime.tp import finish

    finish()


def _follow_rank0() -> None:
    """Under a launcher, ranks other than 0 print nothing (their errors are rank 0's too)."""
    from dustin_runtime.tp import launch_rank

    if launch_rank() != 0:
        console.quiet = err_console.quiet = True
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (for the life of the process)


def main() -> None:
    """Entry point of the console script. Every bad input, ours (`DustinError`) or a usage error of
    the option parser, is one line on stderr and exit code 2; Ctrl-C is one line and exit 130."""
    _follow_rank0()
    try:
        code = app(standalone_mode=False)  # typer returns 130 for Ctrl-C, and the code of an Exit
    except DustinError as e:
        _fail(str(e), 2)
    except KeyboardInterrupt:
        code = 130
    except (typer.Exit, typer.Abort) as e:  # raised outside the command (typer turns them into codes inside)
        code = getattr(e, "exit_code", 1)
    except Exception as e:
        # click usage errors (typer >= 0.26 raises its vendored click's: matched by shape)
        if not (hasattr(e, "format_message") and hasattr(e, "exit_code")):
            raise
        if type(e).__name__ == "NoArgsIsHelpError":  # `dustin` alone: the help, as click prints it
            e.show()
            sys.exit(2)
        _fail(e.format_message(), 2)
    if code == 130:
        _fail("interrupted", 130)
    _leave()
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
