"""The `dustin` command: thin typer commands over the library packages.

This is the only module that wires `dustin_runtime`, `dustin_profile`, `dustin_eval` and
`dustin_kernels` together. Library errors (`DustinError`) become one red line and exit code 2.
"""

from __future__ import annotations

import json
import os
import sys

# OpenMP threads that spin between parallel regions slow small CPU matmuls ~20x when the cores are
# shared; sleeping threads cost microseconds. Must be set before torch loads its OpenMP runtime.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
from pathlib import Path

import typer
from rich.console import Console
from rich.text import Text

from dustin_runtime.errors import DustinError

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.splitlines()[0])
profile_app = typer.Typer(
    no_args_is_help=True, subcommand_metavar="[show PROFILE]",
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


@bench_app.command("attention")
def bench_attention(
    shape: str = typer.Option("qwen2.5-72b", help="Model attention shape(s), comma-separated."),
    context: str = typer.Option("32768", help="Context length(s), comma-separated."),
    batch: str = typer.Option("16", help="Batch size(s), comma-separated."),
    budget: str = typer.Option("512", help="Verification budget(s) S, comma-separated."),
    gamma: int = typer.Option(4, help="Draft tokens; M = gamma + 1 verification queries."),
    out_dir: str = typer.Option("results/bench", help="Folder for attention-<shape>-<context>-<batch>-<budget>.json."),
    sdpa: bool = typer.Option(True, help="Also time the PyTorch SDPA backends."),
    variants: bool = typer.Option(False, help="Also time a grid of kernel configurations."),
) -> None:
    """Verification attention kernels vs copy bandwidth and SDPA; one JSON per combination."""
    from rich.table import Table

    from dustin_eval import bench_attention as ba

    configs = [
        ba.BenchConfig(shape=s, context=c, batch=b, budget=k, gamma=gamma, sdpa=sdpa, variants=variants)
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


@bench_app.command("decode")
def bench_decode(
    config: str = typer.Option("qwen2.5-7b", help="Target model shape (see dustin_runtime/presets.py)."),
    draft: str | None = typer.Option(None, help="Draft model shape (default: the usual draft)."),
    random_weights: bool = typer.Option(True, "--random-weights", help="Random weights at the real shape."),
    batch: int = typer.Option(16, help="Sequences per step."),
    context: int = typer.Option(32768, help="Tokens already in the cache."),
    gamma: int = typer.Option(4, help="Draft tokens per verification step."),
    hf_baseline: bool = typer.Option(False, help="Also time Hugging Face transformers in the same process."),
    budget: int = typer.Option(512, help="S of the dustin sparse verification step."),
    srh: int = typer.Option(4, help="Retrieval KV heads of the dustin step (over 2 layers)."),
    out_dir: Path = typer.Option(Path("results/bench"), help="Folder for decode-<config>-<context>-<batch>.json."),
) -> None:
    """One step of each decoding phase on the GPU (decode, full and dustin verification, draft,
    prefill chunk), next to its byte (or FLOP) floor."""
    from rich.table import Table

    from dustin_eval import bench_decode as bd

    if not random_weights:
        raise DustinError("bench decode times random weights at real shapes; pass --random-weights")
    cfg = bd.DecodeBenchConfig(config=config, draft=draft, batch=batch, context=context, gamma=gamma,
                               hf_baseline=hf_baseline, budget=budget, srh=srh)
    res = bd.run_decode_bench(cfg, "dustin " + " ".join(sys.argv[1:]))
    path = bd.write_result(res, out_dir, cfg)
    env = res["environment"]
    t = Table(title=f"{config} + {res['config']['draft']}, batch {batch}, context {context} ({env['gpu']}, "
                    f"copy {res['copy_tbps']:.2f} TB/s, bf16 matmul {res['matmul_tflops']:.0f} TFLOP/s)")
    for col in ("phase", "graph ms", "eager ms", "floor ms", "of floor"):
        t.add_column(col, justify="left" if col == "phase" else "right")
    for r in res["records"]:
        t.add_row(r["phase"], f"{r['median_ms']:.3f}", f"{r.get('eager_ms', float('nan')):.3f}",
                  f"{r['floor_ms']:.3f}", f"{r['fraction_of_floor']:.0%}")
    console.print(t)
    sv = next((r for r in res["records"] if "speedup_vs_full_verify" in r), None)
    if sv is not None:
        console.print(f"dustin verify step vs full verify step: {sv['speedup_vs_full_verify']:.2f}x")
    console.print(f"wrote {path}")


@bench_app.command("e2e")
def bench_e2e(
    target: str = typer.Option("qwen2.5-7b", help="Target: a preset shape (random weights, replayed acceptance) "
                                                 "or a checkpoint (real acceptance)."),
    draft: str | None = typer.Option(None, help="Draft: a preset shape or checkpoint (default: the preset's usual draft)."),
    batch: str = typer.Option("16", help="Batch size(s), comma-separated (zipped with --context)."),
    context: str = typer.Option("32768", help="Context length(s), comma-separated."),
    gamma: int = typer.Option(4, help="Draft tokens per step."),
    budget: int = typer.Option(512, help="Verification budget S of the sparse policies."),
    policies: str = typer.Option(",".join(("ar", "full", "dustin", "streamingllm", "quest", "dustin-vs")),
                                 help="ar (vanilla decoding), full (standard speculative decoding), dustin, "
                                      "streamingllm, quest; -vs: drafting over the verification set "
                                      "(dustin-vs, streamingllm-vs); comma-separated."),
    acceptance: str = typer.Option("geometric:0.8", help="Replayed acceptance: geometric:ALPHA or a JSONL of "
                                                         "`dustin decode --json` records."),
    new_tokens: int = typer.Option(64, help="New tokens per sequence."),
    srh: int = typer.Option(4, help="Target retrieval KV heads of dustin (over 2 layers)."),
    draft_srh: int = typer.Option(2, help="Draft retrieval KV heads of dustin (its lookahead signal)."),
    m: int = typer.Option(112, help="Rows chosen by the draft's lookahead (0: target history only)."),
    alphas: str = typer.Option("0.5,0.6,0.7,0.8,0.9", help="Alpha sweep for the plot ('' to skip)."),
    out_dir: Path = typer.Option(Path("results/bench"), help="Folder for e2e-<target>-<context>-<batch>.json."),
) -> None:
    """The decoding loop users run (CUDA graphs), end to end per policy, beside vanilla and standard
    speculative decoding in the same process: ms per step, tokens/s, phases, floors, speedups."""
    from rich.table import Table

    from dustin_eval import bench_e2e as be

    try:
        bs = [int(x) for x in batch.split(",") if x.strip()]
        cs = [int(x) for x in context.split(",") if x.strip()]
        al = tuple(float(x) for x in alphas.split(",") if x.strip())
    except ValueError:
        raise DustinError("--batch and --context take integers, --alphas numbers, comma-separated") from None
    if len(bs) != len(cs) and 1 not in (len(bs), len(cs)):
        raise DustinError("--batch and --context: give lists of one length (zipped) or one value")
    n = max(len(bs), len(cs))
    pairs = list(zip(bs * n if len(bs) == 1 else bs, cs * n if len(cs) == 1 else cs, strict=True))
    names = tuple(p.strip() for p in policies.split(",") if p.strip())
    command = "dustin " + " ".join(sys.argv[1:])
    for b, c in pairs:
        cfg = be.E2EConfig(target=target, draft=draft, batch=b, context=c, gamma=gamma, budget=budget,
                           policies=names, acceptance=acceptance, new_tokens=new_tokens, srh=srh,
                           draft_srh=draft_srh, m=m, alphas=al)
        res = be.run_e2e(cfg, command, on_record=lambda r: console.print(
            f"{r['policy']:>12}: {r['ms_per_step']:.2f} ms/step, {r['tokens_per_s']:.0f} tok/s "
            f"(graph phases {r['graph_phase_sum_ms']:.2f} ms)", highlight=False))
        path = be.write_result(res, out_dir)
        t = Table(title=f"{res['models']['target']} + {res['models']['draft']}, batch {b}, context {c}, "
                        f"gamma {gamma}, S {budget}, acceptance {acceptance} ({res['environment']['gpu']})")
        for col in ("policy", "ms/step", "graph sum", "byte floor", "tok/s", "accepted", "vs ar", "vs full"):
            t.add_column(col, justify="left" if col == "policy" else "right")
        for r in res["records"]:
            s = res["summary"][r["policy"]]
            t.add_row(r["policy"], f"{r['ms_per_step']:.2f}", f"{r['graph_phase_sum_ms']:.2f}",
                      f"{r['byte_floor_ms']:.2f}", f"{r['tokens_per_s']:.0f}", f"{r['mean_accepted']:.2f}",
                      f"{s.get('speedup_vs_ar', float('nan')):.2f}x", f"{s.get('speedup_vs_full', float('nan')):.2f}x")
        console.print(t)
        console.print(f"wrote {path}")


@profile_app.callback(invoke_without_command=True)
def profile(
    ctx: typer.Context,
    target: str | None = typer.Option(None, help="Target: HF folder, .gguf file, cached hub id, or 'smollm2'."),
    draft: str | None = typer.Option(None, help="Draft (same tokenizer as the target)."),
    calib: list[str] | None = typer.Option(
        None, help="Calibration text: .txt/.md files, folders, globs, .jsonl or .parquet (repeat the option). "
                   "Default: ../shared/corpus/gutenberg/calib."),
    context: int = typer.Option(8192, help="Context length L of the verification passes."),
    windows: int = typer.Option(16, help="Calibration windows (one prefill each)."),
    retrieval_windows: int = typer.Option(0, help="Extra key-value retrieval windows (a fact hidden in calibration "
                                                  "prose, asked for at the end) so retrieval heads can win."),
    retrieval_weight: float = typer.Option(0.5, help="Share of every mean ARR given to the retrieval windows' "
                                                     "question passes."),
    positions: int = typer.Option(8, help="Verification passes per window (in its last quarter)."),
    budget: int = typer.Option(512, help="Verification budget S (tokens of the selected set)."),
    gamma: int = typer.Option(4, help="Draft tokens per step; gamma + 1 verification queries."),
    sinks: int = typer.Option(4, help="Attention-sink tokens always in the set."),
    window: int = typer.Option(64, help="Recent tokens always in the set."),
    budgets: str = typer.Option("128,256,512,1024", help="Budgets of the ARR-vs-budget table and m_by_budget."),
    max_heads: int = typer.Option(8, help="Head limit of the greedy search (draft + target KV heads)."),
    epsilon: float = typer.Option(1e-3, help="Stop when the best ARR gain of a round is below this."),
    m_points: int = typer.Option(9, help="Grid points for m over [0, S - sinks - window]."),
    seed: int = typer.Option(0, help="Seed of the calibration windows."),
    verify_tokens: str = typer.Option("draft", help="Verification tokens: 'draft' (its greedy drafts) or 'text'."),
    text_field: str = typer.Option("text", help="Text field of JSONL / parquet calibration records."),
    device: str = typer.Option("auto", help="cuda | cpu (auto: cuda when available)."),
    dtype: str = typer.Option("auto", help="bf16 | fp16 | fp32 (auto: bf16 on CUDA, fp32 on CPU)."),
    out: Path | None = typer.Option(None, help="Profile JSON (default: profiles/<target>-<draft>.json); "
                                               "tables and plots go beside it, resumable work in <out>.work/."),
    restart: bool = typer.Option(False, help="Discard windows recorded by an earlier run into the same --out."),
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
    from dustin_profile.show import render

    try:
        bl = tuple(int(b) for b in budgets.split(",") if b.strip())
    except ValueError:
        raise DustinError(f"--budgets {budgets!r}: expected comma-separated integers") from None
    if out is None:
        out = Path("profiles") / f"{Path(target).name}-{Path(draft).name}.json"
    cfg = ProfileConfig(target=target, draft=draft, out=str(out), calib=tuple(calib or ()), context=context,
                        windows=windows, retrieval=retrieval_windows, retrieval_weight=retrieval_weight,
                        positions=positions, budget=budget, gamma=gamma, sinks=sinks,
                        window=window, budgets=bl, max_heads=max_heads, epsilon=epsilon, m_points=m_points,
                        seed=seed, verify_tokens=verify_tokens, text_field=text_field, device=device, dtype=dtype)
    res = run_profile(cfg, command="dustin " + " ".join(sys.argv[1:]), console=err_console, restart=restart)
    for r in render(res.profile, res.path.parent):
        console.print(r)
    console.print(f"wrote {res.path} ({res.recorded} windows recorded, "
                  f"{cfg.windows + cfg.retrieval - res.recorded} resumed) in {res.seconds['total']:.1f} s")


@profile_app.command("show")
def profile_show(
    path: Path = typer.Argument(..., help="A profile JSON."),
    target: str | None = typer.Option(None, help="Also check the profile against this target."),
    draft: str | None = typer.Option(None, help="Also check the profile against this draft."),
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


def _load_pair(target: str, draft: str | None, dtype: str, device: str):
    """Pick the device and dtype, load the target (and draft) with a spinner."""
    from dustin_runtime import pipeline

    dev = pipeline.pick_device(device)
    with console.status("loading models", spinner="dots"):
        return pipeline.load_pair(target, draft, dtype=pipeline.pick_dtype(dtype, dev), device=dev)


@app.command()
def decode(
    target: str = typer.Option(..., help="Target: HF folder, .gguf file, cached hub id, or 'smollm2'."),
    draft: str | None = typer.Option(None, help="Draft (same tokenizer); without it, autoregressive."),
    prompt: str | None = typer.Option(None, help="The prompt text."),
    prompt_file: Path | None = typer.Option(None, help="A text file holding one prompt."),
    batch_file: Path | None = typer.Option(None, help='JSONL, one {"prompt": ..., "max_new_tokens": ...} per line.'),
    max_new_tokens: int = typer.Option(128, help="New tokens per sequence (a batch file may override)."),
    gamma: int = typer.Option(4, help="Draft tokens per speculative step."),
    temperature: float = typer.Option(0.0, help="0 = greedy."),
    top_p: float = typer.Option(1.0, help="Nucleus sampling mass."),
    dtype: str = typer.Option("auto", help="bf16 | fp16 | fp32 (auto: bf16 on CUDA, fp32 on CPU)."),
    device: str = typer.Option("auto", help="cuda | cpu (auto: cuda when available)."),
    chat: bool = typer.Option(False, help="Wrap each prompt in the tokenizer's chat template."),
    seed: int = typer.Option(0, help="Sampling seed."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON record as the last line."),
    profile: Path | None = typer.Option(None, help="Profile artifact (retrieval heads, sinks, window, m)."),
    policy: str = typer.Option("full", help="Verification: full | dustin | draft-only | target-only | "
                                            "streamingllm | quest | oracle (analysis only)."),
    budget: int | None = typer.Option(None, help="Verification budget S in context tokens (default: the profile's)."),
    sinks: int | None = typer.Option(None, help="Attention sinks always verified (default: the profile's, else 4)."),
    window: int | None = typer.Option(None, help="Recent window always verified (default: the profile's, else 64)."),
    all_heads: bool = typer.Option(False, "--all-heads", help="dustin without a profile: every KV head scores."),
    measure_arr: bool = typer.Option(False, "--measure-arr", help="Also measure ARR on the side (slower)."),
    cuda_graphs: bool = typer.Option(True, "--cuda-graphs/--no-cuda-graphs",
                                     help="Run the decoding steps as CUDA graphs (CUDA only; side measurements "
                                          "run eagerly)."),
) -> None:
    """Decode prompts with the target, speculatively when a draft is given."""
    from dustin_runtime import pipeline
    from dustin_runtime.sampling import SamplingConfig

    prompts = pipeline.read_prompts(prompt, prompt_file, batch_file, max_new_tokens)
    spec = _SparseSpec.parse(policy, profile, budget, sinks, window, all_heads)
    if policy != "full" and draft is None:
        raise DustinError(f"policy {policy} verifies a draft's tokens: give --draft")
    tgt, drf = _load_pair(target, draft, dtype, device)
    hooks = None
    if drf is not None:
        from dustin_runtime.policies import make_policy

        hooks = make_policy(policy, spec.config(tgt, drf), target=tgt.model, draft=drf.model, measure_arr=measure_arr)
    with console.status("decoding", spinner="dots"):
        out = pipeline.decode(tgt, drf, prompts, gamma=gamma, chat=chat, seed=seed, hooks=hooks,
                              sampling=SamplingConfig(temperature=temperature, top_p=top_p),
                              cuda_graphs=cuda_graphs)
    _print_decode(out)
    if json_out:
        print(json.dumps(out.record()))


@eval_app.command("acceptance")
def eval_acceptance(
    target: str = typer.Option("smollm2", help="Target checkpoint."),
    draft: str = typer.Option("models/smollm2-draft", help="Draft checkpoint (same tokenizer)."),
    profile: Path | None = typer.Option(None, help="Profile artifact for the target/draft pair (dustin's heads, m)."),
    all_heads: bool = typer.Option(False, "--all-heads", help="No profile: every KV head scores for dustin."),
    contexts: str = typer.Option("4096,8192", help="Prompt lengths, comma-separated (capped to fit the models)."),
    windows: int = typer.Option(2, help="Windows (one per book) per context, decoded as one batch."),
    max_new_tokens: int = typer.Option(64, help="Greedy new tokens per window."),
    gamma: int = typer.Option(4, help="Draft tokens per step."),
    budgets: str = typer.Option("128,256,512,1024", help="Budgets S, comma-separated."),
    policies: str = typer.Option("all", help="Policies, comma-separated, or 'all'."),
    sinks: int | None = typer.Option(None, help="Sinks (default: the profile's, else 4)."),
    window: int | None = typer.Option(None, help="Recent window (default: the profile's, else 64)."),
    books_dir: Path | None = typer.Option(None, help="Books folder (default ../shared/corpus/gutenberg/eval)."),
    measure_arr: bool = typer.Option(True, "--measure-arr/--no-arr", help="Measure ARR on the side."),
    paired: bool = typer.Option(True, "--paired/--no-paired", help="Also run full verification on every "
                                "policy's drafts (paired retention; one more target pass per step)."),
    threads: int | None = typer.Option(None, help="torch intra-op threads (CPU)."),
    dtype: str = typer.Option("auto", help="bf16 | fp16 | fp32 (auto: bf16 on CUDA, fp32 on CPU)."),
    device: str = typer.Option("auto", help="cuda | cpu."),
    out_dir: Path = typer.Option(Path("results/acceptance"), help="Output folder."),
    name: str = typer.Option("smollm2-draft", help="Result name: <out-dir>/<name>.{json,md,runs.jsonl}."),
) -> None:
    """Mean accepted length, its retention vs full and ARR for every policy at every budget."""
    import hashlib

    import torch

    from dustin_eval import acceptance as acc
    from dustin_eval.results import provenance
    from dustin_runtime.sparse import POLICIES

    if threads is not None:
        torch.set_num_threads(threads)
    ints = [int(x) for x in budgets.split(",") if x.strip()]
    chosen = POLICIES if policies == "all" else tuple(x.strip() for x in policies.split(",") if x.strip())
    cfg = acc.AcceptanceConfig(
        contexts=tuple(int(x) for x in contexts.split(",") if x.strip()), windows=windows,
        max_new_tokens=max_new_tokens, gamma=gamma, budgets=tuple(ints), policies=chosen,
        books_dir=str(books_dir) if books_dir else acc.AcceptanceConfig.books_dir, measure_arr=measure_arr,
        paired=paired,
    )
    specs = {b: _SparseSpec.parse("dustin" if "dustin" in chosen else "streamingllm", profile, b, sinks, window,
                                  all_heads) for b in ints}
    tgt, drf = _load_pair(target, draft, dtype, device)
    configs = {b: spec.config(tgt, drf) for b, spec in specs.items()}
    runs = out_dir / f"{name}.runs.jsonl"

    def show(r: dict) -> None:
        arr = "" if r["arr"] is None else f", ARR {r['arr']:.3f}"
        if r.get("paired_retention") is not None:
            arr += f", paired retention {r['paired_retention']:.3f}"
        console.print(f"context {r['context']} {r['policy']:>12} S={r['budget']}: tau {r['tau']:.3f}{arr} "
                      f"({r['steps']} steps, {r['decode_s']:.0f} s)", highlight=False)

    records = acc.run_acceptance(tgt, drf, configs, cfg, runs, on_record=show)
    extra = {"torch_threads": torch.get_num_threads(), "runs_file": str(runs)}
    if profile is not None:
        extra["profile"] = {"path": str(profile), "sha256": hashlib.sha256(profile.read_bytes()).hexdigest()}
    prov = provenance(models={"target": tgt.model_id, "draft": drf.model_id},
                      shapes={"contexts": list(cfg.contexts), "windows": windows, "gamma": gamma,
                              "max_new_tokens": max_new_tokens}, extra=extra)
    j, m = acc.write_acceptance(records, out_dir, name, prov, cfg, configs)
    console.print(f"wrote {j} and {m}")


class _SparseSpec:
    """--policy / --profile / --budget / --sinks / --window / --all-heads, checked before any model
    loads; `config` turns them (and the profile, checked against the loaded pair) into a SparseConfig."""

    def __init__(self, policy, prof, path, budget, sinks, window, all_heads):
        self.policy, self.prof, self.path = policy, prof, path
        self.budget, self.sinks, self.window, self.all_heads = budget, sinks, window, all_heads

    @classmethod
    def parse(cls, policy, path, budget, sinks, window, all_heads) -> _SparseSpec:
        from dustin_runtime.sparse import (
            DEFAULT_SINKS,
            DEFAULT_WINDOW,
            HEAD_POLICIES,
            POLICIES,
            SparseConfig,
        )

        if policy not in POLICIES:
            raise DustinError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
        prof = None
        if path is not None:
            from dustin_profile.artifact import load_profile

            prof = load_profile(path)
        if policy in HEAD_POLICIES and prof is None and not all_heads:
            raise DustinError(f"policy {policy} needs retrieval heads: give --profile (or --all-heads for every head)")
        sinks = sinks if sinks is not None else prof.sinks if prof else DEFAULT_SINKS
        window = window if window is not None else prof.window if prof else DEFAULT_WINDOW
        budget = budget if budget is not None else prof.budget if prof else 512
        if policy != "full":
            SparseConfig(budget=budget, sinks=sinks, window=window)  # refuses budget < sinks + window
        return cls(policy, prof, path, budget, sinks, window, all_heads)

    def config(self, tgt, drf):
        """The SparseConfig for the loaded target/draft pair (None for `full`)."""
        from dustin_runtime.sparse import SparseConfig

        if self.policy == "full":
            return None
        if self.prof is not None:
            from dustin_profile.artifact import check_models, model_info
            from dustin_runtime.tokenizer import vocab_hash

            check_models(self.prof, model_info(tgt.model_id, tgt.model.cfg, vocab_hash(tgt.tokenizer)),
                         model_info(drf.model_id, drf.model.cfg, vocab_hash(drf.tokenizer)), str(self.path))
            cfg = sparse_config_from_profile(self.prof, self.budget, self.sinks, self.window, str(self.path))
        elif self.all_heads:
            cfg = SparseConfig.all_heads(tgt.model.cfg, drf.model.cfg, self.budget, sinks=self.sinks, window=self.window)
        else:
            cfg = SparseConfig(budget=self.budget, sinks=self.sinks, window=self.window)
        cfg.check_models(tgt.model.cfg, drf.model.cfg)
        return cfg


def sparse_config_from_profile(prof, budget: int | None = None, sinks: int | None = None,
                               window: int | None = None, source: str = ""):
    """A dustin_profile `Profile` as the runtime's `SparseConfig` at `budget` (default the profile's):
    its heads and aggregation, its sinks/window unless overridden, m = the profile's m at that
    budget (calibrated or scaled, `Profile.m_for_budget`), clipped to the free rows."""
    from dustin_runtime.sparse import SparseConfig

    budget = prof.budget if budget is None else budget
    sinks = prof.sinks if sinks is None else sinks
    window = prof.window if window is None else window
    free = budget - sinks - window
    m = max(0, min(free, prof.m_for_budget(budget))) if free >= 0 else 0

    def heads(hs):
        return tuple((h.layer, h.kv_head, tuple(h.query_heads)) for h in hs)

    return SparseConfig(budget=budget, sinks=sinks, window=window, m=m, draft_heads=heads(prof.draft_heads),
                        target_heads=heads(prof.target_heads), aggregation=prof.aggregation, source=source)


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


def _policy_runs(policies: str, budgets: str, profile, sinks, window, all_heads):
    """(runs, specs): every policy at every budget (full once, without a budget), checked before
    any model loads."""
    from dustin_eval.pg19_eval import PolicyRun

    names = [p.strip() for p in policies.split(",") if p.strip()]
    try:
        sizes = [int(b) for b in budgets.split(",") if b.strip()]
    except ValueError:
        raise DustinError(f"--budgets {budgets!r}: expected comma-separated integers") from None
    runs = [PolicyRun(p, None) if p == "full" else PolicyRun(p, b) for p in names for b in ([0] if p == "full" else sizes)]
    runs = list(dict.fromkeys(runs))
    specs = {r: _SparseSpec.parse(r.policy, profile, r.budget, sinks, window, all_heads) for r in runs}
    return runs, specs


def _hooks_factory(specs, tgt, drf, measure_arr: bool):
    from dustin_runtime.policies import make_policy

    configs = {r: spec.config(tgt, drf) for r, spec in specs.items()}

    def make(run):
        return make_policy(run.policy, configs[run], target=tgt.model, draft=drf.model, measure_arr=measure_arr)

    return make


@eval_app.command("pg19")
def eval_pg19(
    data: Path | None = typer.Option(None, help="Folder of .txt books (default ../shared/corpus/gutenberg/eval)."),
    target: str = typer.Option("smollm2", help="Target checkpoint."),
    draft: str = typer.Option("models/smollm2-draft", help="Draft checkpoint (same tokenizer)."),
    profile: Path | None = typer.Option(None, help="Profile artifact (dustin, draft-only, target-only)."),
    policy: str = typer.Option("full,dustin,streamingllm,quest", help="Policies, comma-separated."),
    budget: str = typer.Option("256,512,1024", help="Budgets S, comma-separated."),
    context: int = typer.Option(4096, help="Prompt tokens before the scored part of each window."),
    eval_tokens: int = typer.Option(256, help="Tokens scored per window through verification windows."),
    windows: int = typer.Option(2, help="Windows (one per book)."),
    gamma: int = typer.Option(4, help="Verification window = gamma + 1 tokens."),
    sinks: int | None = typer.Option(None, help="Sinks (default: the profile's, else 4)."),
    window: int | None = typer.Option(None, help="Recent window (default: the profile's, else 64)."),
    all_heads: bool = typer.Option(False, "--all-heads", help="No profile: every KV head scores."),
    measure_arr: bool = typer.Option(True, "--measure-arr/--no-arr", help="Also record ARR per window."),
    seed: int = typer.Option(0, help="Book order seed."),
    dtype: str = typer.Option("auto", help="bf16 | fp16 | fp32."),
    device: str = typer.Option("auto", help="cuda | cpu."),
    out_dir: Path = typer.Option(Path("results/pg19"), help="Output folder (resumable records inside)."),
) -> None:
    """Perplexity of long books when each teacher-forced verification window attends through the
    policy's set, full-cache perplexity beside it."""
    from rich.progress import Progress

    from dustin_eval.corpus import gutenberg_split
    from dustin_eval.pg19_eval import run_pg19

    runs, specs = _policy_runs(policy, budget, profile, sinks, window, all_heads)
    tgt, drf = _load_pair(target, draft, dtype, device)
    make = _hooks_factory(specs, tgt, drf, measure_arr)
    with Progress(console=console) as bar:
        task = bar.add_task(f"pg19 context {context}", total=windows * len(runs))
        rows = run_pg19(tgt.model, drf.model, tgt.tokenizer, books_dir=data or gutenberg_split("eval"),
                        context=context, eval_tokens=eval_tokens, gamma=gamma, runs=runs, make_hooks=make,
                        windows=windows, out_dir=out_dir, models={"target": tgt.model_id, "draft": drf.model_id},
                        seed=seed, on_record=lambda r: bar.advance(task))
    _print_rows(f"PG-19-style perplexity, context {context}", rows)
    console.print(f"wrote {out_dir}/pg19-{context}.{{json,csv,md,png}}")


@eval_app.command("passkey")
def eval_passkey(
    target: str = typer.Option("smollm2", help="Target checkpoint."),
    draft: str = typer.Option("models/smollm2-draft", help="Draft checkpoint (same tokenizer)."),
    profile: Path | None = typer.Option(None, help="Profile artifact (dustin, draft-only, target-only)."),
    policy: str = typer.Option("full,dustin,streamingllm", help="Policies, comma-separated."),
    budget: str = typer.Option("256", help="Budgets S, comma-separated."),
    contexts: str = typer.Option("2048,4096,8192", help="Prompt lengths in tokens."),
    depths: str = typer.Option("0,0.25,0.5,0.75,1", help="Needle depths in [0, 1]."),
    trials: int = typer.Option(1, help="Prompts per context and depth."),
    max_new_tokens: int = typer.Option(10, help="Greedy new tokens per prompt (the key has 5 digits)."),
    gamma: int = typer.Option(4, help="Draft tokens per step."),
    sinks: int | None = typer.Option(None, help="Sinks (default: the profile's, else 4)."),
    window: int | None = typer.Option(None, help="Recent window (default: the profile's, else 64)."),
    all_heads: bool = typer.Option(False, "--all-heads", help="No profile: every KV head scores."),
    filler: Path | None = typer.Option(None, help="Folder of .txt books for the filler (default: gutenberg eval)."),
    dtype: str = typer.Option("auto", help="bf16 | fp16 | fp32."),
    device: str = typer.Option("auto", help="cuda | cpu."),
    out_dir: Path = typer.Option(Path("results/passkey"), help="Output folder (resumable records inside)."),
) -> None:
    """Passkey retrieval accuracy per policy over contexts x depths, with heatmaps."""
    from rich.progress import Progress

    from dustin_eval.corpus import gutenberg_split, read_filler
    from dustin_eval.passkey_eval import run_passkey

    runs, specs = _policy_runs(policy, budget, profile, sinks, window, all_heads)
    try:
        ctx = [int(c) for c in contexts.split(",") if c.strip()]
        dps = [float(d) for d in depths.split(",") if d.strip()]
    except ValueError:
        raise DustinError("--contexts takes integers and --depths numbers, comma-separated") from None
    tgt, drf = _load_pair(target, draft, dtype, device)
    limit = min(tgt.model.cfg.max_position_embeddings, drf.model.cfg.max_position_embeddings)
    if max(ctx) + max_new_tokens > limit:
        raise DustinError(f"context {max(ctx)} + {max_new_tokens} new tokens exceeds the models' limit of {limit} "
                          f"tokens; use --contexts up to {limit - max_new_tokens}")
    make = _hooks_factory(specs, tgt, drf, measure_arr=False)
    text = read_filler(filler or gutenberg_split("eval"), max_books=3)
    with Progress(console=console) as bar:
        task = bar.add_task("passkey", total=len(runs) * len(ctx) * len(dps) * trials)
        rows = run_passkey(tgt.model, drf.model, tgt.tokenizer, filler_text=text, contexts=ctx, depths=dps,
                           trials=trials, gamma=gamma, runs=runs, make_hooks=make, out_dir=out_dir,
                           max_new_tokens=max_new_tokens,
                           models={"target": tgt.model_id, "draft": drf.model_id},
                           on_record=lambda r: bar.advance(task))
    _print_rows("passkey retrieval accuracy", rows)
    console.print(f"wrote {out_dir}/passkey.{{json,csv,md}} and heatmaps")


@eval_app.command("longbench")
def eval_longbench(
    data: Path = typer.Option(..., help="Folder of LongBench v1 <dataset>.jsonl files."),
    datasets: str | None = typer.Option(None, help="Datasets, comma-separated (default: those present of the 16 English)."),
    target: str = typer.Option("smollm2", help="Target checkpoint."),
    draft: str = typer.Option("models/smollm2-draft", help="Draft checkpoint (same tokenizer)."),
    profile: Path | None = typer.Option(None, help="Profile artifact (dustin, draft-only, target-only)."),
    policy: str = typer.Option("dustin", help="Policies, comma-separated (full = lossless speculative decoding)."),
    budget: str = typer.Option("512", help="Budgets S, comma-separated."),
    gamma: int = typer.Option(4, help="Draft tokens per step."),
    max_length: int | None = typer.Option(None, help="Prompt truncation length (default: the target's context)."),
    limit: int | None = typer.Option(None, help="First N samples of each dataset."),
    batch_size: int = typer.Option(1, help="Prompts decoded together."),
    sinks: int | None = typer.Option(None, help="Sinks (default: the profile's, else 4)."),
    window: int | None = typer.Option(None, help="Recent window (default: the profile's, else 64)."),
    all_heads: bool = typer.Option(False, "--all-heads", help="No profile: every KV head scores."),
    dtype: str = typer.Option("auto", help="bf16 | fp16 | fp32."),
    device: str = typer.Option("auto", help="cuda | cpu."),
    out_dir: Path = typer.Option(Path("results/longbench"), help="Output folder (resumable predictions inside)."),
) -> None:
    """LongBench (v1, English subsets): reference prompts, truncation and metrics, greedy decoding
    through each verification policy."""
    from dustin_eval.longbench_config import DATASETS
    from dustin_eval.longbench_runner import RunMeta, run_longbench
    from dustin_eval.runtime_generator import RuntimeGenerator
    from dustin_runtime.tokenizer import eos_ids

    runs, specs = _policy_runs(policy, budget, profile, sinks, window, all_heads)
    if not data.is_dir():
        raise DustinError(f"{data}: no such folder")
    if datasets:
        names = [d.strip() for d in datasets.split(",") if d.strip()]
        unknown = [d for d in names if d not in DATASETS]
        if unknown:
            raise DustinError(f"unknown LongBench dataset(s) {', '.join(unknown)}; known: {', '.join(DATASETS)}")
    else:
        names = [d for d in DATASETS if (data / f"{d}.jsonl").is_file()]
        if not names:
            raise DustinError(f"{data}: none of the 16 English LongBench files (<dataset>.jsonl) is there")
    tgt, drf = _load_pair(target, draft, dtype, device)
    make = _hooks_factory(specs, tgt, drf, measure_arr=False)
    limit_len = max_length or min(tgt.model.cfg.max_position_embeddings, drf.model.cfg.max_position_embeddings)
    for run in runs:
        gen = RuntimeGenerator(tgt.model, drf.model, gamma=gamma, hooks_factory=lambda run=run: make(run),
                               batch_size=batch_size)
        meta = RunMeta(policy=run.policy, budget=run.budget, target=tgt.model_id, draft=drf.model_id,
                       extra={"gamma": gamma, "profile": str(profile) if profile else None})
        run_longbench(gen, tgt.tokenizer, meta, data_dir=data, out_dir=out_dir, max_length=limit_len,
                             datasets=names, eos_ids=list(eos_ids(tgt.tokenizer, tgt.model.cfg.eos_token_ids)),
                             limit=limit, on_record=lambda r: console.print(
                                 f"{r['dataset']} {r['_id'][:8]} {r['policy']}@{r['budget']}: score {r['score']:.3f}",
                                 highlight=False))
    from dustin_eval.longbench_runner import summarize_predictions

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


def main() -> None:
    """Entry point of the console script: runs the app, turning `DustinError` into one line."""
    try:
        app(standalone_mode=False)
    except DustinError as e:
        err_console.print(Text.assemble(("error: ", "bold red"), str(e)), highlight=False, soft_wrap=True)
        sys.exit(2)
    except KeyboardInterrupt:
        err_console.print("[bold red]interrupted[/]")
        sys.exit(130)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except Exception as e:  # click usage errors arrive here with standalone_mode=False
        import click

        # typer >= 0.26 raises its vendored click's exceptions: match those by shape too
        if isinstance(e, click.exceptions.ClickException) or (hasattr(e, "show") and hasattr(e, "exit_code")):
            e.show()
            sys.exit(e.exit_code)
        if isinstance(e, click.exceptions.Abort) or type(e).__name__ == "Abort":
            sys.exit(1)
        raise


if __name__ == "__main__":
    main()
