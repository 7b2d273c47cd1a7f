"""The `dustin` command: thin typer commands over the library packages.

This is the only module that wires `dustin_runtime`, `dustin_profile`, `dustin_eval` and
`dustin_kernels` together. Library errors (`DustinError`) become one red line and exit code 2.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.text import Text

from dustin_runtime.errors import DustinError

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.splitlines()[0])
profile_app = typer.Typer(no_args_is_help=True, help="Offline profiling (Algorithm 1) and profile artifacts.")
eval_app = typer.Typer(no_args_is_help=True, help="Quality evaluations: LongBench, PG-19, passkey, acceptance.")
bench_app = typer.Typer(no_args_is_help=True, help="GPU speed benchmarks.")
app.add_typer(profile_app, name="profile")
app.add_typer(eval_app, name="eval")
app.add_typer(bench_app, name="bench")

console = Console()
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
    out_dir: Path = typer.Option(Path("results/bench"), help="Folder for decode-<config>-<context>-<batch>.json."),
) -> None:
    """One step of each decoding phase on the GPU, next to its byte (or FLOP) floor."""
    from rich.table import Table

    from dustin_eval import bench_decode as bd

    if not random_weights:
        raise DustinError("bench decode times random weights at real shapes; pass --random-weights")
    cfg = bd.DecodeBenchConfig(config=config, draft=draft, batch=batch, context=context, gamma=gamma,
                               hf_baseline=hf_baseline)
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
    console.print(f"wrote {path}")


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
) -> None:
    """Decode prompts with the target, speculatively when a draft is given."""
    from dustin_runtime import pipeline
    from dustin_runtime.sampling import SamplingConfig

    prompts = pipeline.read_prompts(prompt, prompt_file, batch_file, max_new_tokens)
    dev = pipeline.pick_device(device)
    dt = pipeline.pick_dtype(dtype, dev)
    with console.status("loading models", spinner="dots"):
        tgt, drf = pipeline.load_pair(target, draft, dtype=dt, device=dev)
    with console.status("decoding", spinner="dots"):
        out = pipeline.decode(tgt, drf, prompts, gamma=gamma, chat=chat, seed=seed,
                              sampling=SamplingConfig(temperature=temperature, top_p=top_p))
    _print_decode(out)
    if json_out:
        print(json.dumps(out.record()))


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
    t.add_row("decode tokens/s", f"{s.tokens_per_s:.2f}")
    if s.mode == "speculative":
        t.add_row("mean accepted / step", f"{s.mean_accepted:.3f}")
        t.add_row("mean tokens / step", f"{s.mean_accepted + 1:.3f}")
        if s.batch > 1:
            t.add_row("accepted per sequence", " ".join(f"{a:.2f}" for a in s.accepted_per_sequence()))
    for k, v in s.extra.items():
        t.add_row(k, f"{v:.4f}" if isinstance(v, float) else str(v))
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

        if isinstance(e, click.exceptions.ClickException):
            e.show()
            sys.exit(e.exit_code)
        if isinstance(e, click.exceptions.Abort):
            sys.exit(1)
        raise


if __name__ == "__main__":
    main()
