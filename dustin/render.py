"""What the `dustin` commands print: rich tables and one-line progress records (the commands in
`dustin.cli` compute nothing here, and nothing here computes results)."""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager

from rich.console import Console
from rich.table import Table

console = Console(width=None if sys.stdout is not None and sys.stdout.isatty() else 150)  # readable in logs
err_console = Console(stderr=True)


def _pct(v) -> str:
    return "-" if v is None else f"{v:.2%}"


def rows(title: str, records: list[dict]) -> None:
    """A table of result rows (every key a column)."""
    if not records:
        return
    t = Table(title=title)
    cols = list(dict.fromkeys(k for r in records for k in r))
    for c in cols:
        t.add_column(str(c))
    for r in records:
        t.add_row(*[f"{r[c]:.4g}" if isinstance(r.get(c), float) else str(r.get(c, "")) for c in cols])
    console.print(t)


def decode(out) -> None:
    """`dustin decode`: each sequence's text, then the run's numbers."""
    from rich.panel import Panel

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


def acceptance_record(r: dict) -> None:
    arr = "" if r.get("arr") is None else f", ARR {r['arr']:.3f}"
    if r.get("paired_retention") is not None:
        arr += f", paired retention {r['paired_retention']:.3f}"
    console.print(f"context {r['context']} {r['policy']:>12} S={r['budget']}: tau {r['tau']:.3f}{arr} "
                  f"({r['steps']} steps, {r['decode_s']:.0f} s)", highlight=False)


def longbench_record(r: dict) -> None:
    console.print(f"{r['dataset']} {r['_id'][:8]} {r['policy']}@{r['budget']}: score {r['score']:.3f}",
                  highlight=False)


def attention(res: dict) -> None:
    """One `dustin bench attention` result: every kernel beside the copy bandwidth."""
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
    vs_topk = s["select_vs_topk_speedup"]
    console.print(f"speedup sparse vs best full ({s['best_full_kernel']}): {s['speedup_sparse_vs_best_full']:.1f}x; "
                  f"estimate+select: {_pct(s['estimate_select_fraction'])} of {res['shapes']['model']['layers']} "
                  f"layers of full attention; select vs topk: {vs_topk if vs_topk is None else f'{vs_topk:.1f}x'}")
    if s.get("refresh_fraction") is not None:
        console.print(f"{s['refresh_layers']} refresh layers of {s['refresh_kv_heads']} KV heads: "
                      f"{s['refresh_fraction']:.2%} (cost model {s['refresh_model_fraction']:.2%}); "
                      f"estimate+select with them: {s['estimate_with_refresh_fraction']:.2%}")


def attention_sweep(results: list[dict]) -> None:
    if len(results) < 2:
        return
    t = Table(title="sweep summary")
    for col in ("shape", "context", "batch", "budget", "best full", "full ms", "sparse ms", "speedup", "estimate"):
        t.add_column(col)
    for res in results:
        cfg, s = res["config"], res["summary"]
        t.add_row(cfg["shape"], str(cfg["context"]), str(cfg["batch"]), str(cfg["budget"]), s["best_full_kernel"],
                  f"{s['best_full_ms']:.4f}", f"{s['sparse_ms']:.4f}", f"{s['speedup_sparse_vs_best_full']:.1f}x",
                  _pct(s["estimate_select_fraction"]))
    console.print(t)


def e2e_record(r: dict) -> None:
    console.print(f"{r['policy']:>12}: {r['ms_per_step']:.2f} ms/step, {r['tokens_per_s']:.0f} tok/s "
                  f"(graph phases {r['graph_phase_sum_ms']:.2f} ms"
                  + (f", collectives {r['tp']['collective_ms_per_step']:.2f} ms" if r.get("tp") else "") + ")",
                  highlight=False)


def e2e(res: dict, path, refresh_suffix: str = "-r") -> None:
    """One `dustin bench e2e` result: every policy beside vanilla (ar) and standard speculative (full)."""
    c = res["config"]
    sources = {r["acceptance_source"] for r in res["records"] if r["policy"] != "ar"}
    accepted = f"acceptance {c['acceptance']}" if sources <= {c["acceptance"]} else \
        f"{', '.join(sorted(sources))} acceptance"
    t = Table(title=f"{res['models']['target']} + {res['models']['draft']}, batch {c['batch']}, context {c['context']}, "
                    f"gamma {c['gamma']}, S {res['shapes']['budget']}, {accepted} ({res['environment']['gpu']})")
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
                          f"{name.removesuffix(refresh_suffix)}: {s['vs_no_refresh']:.3f}x tokens/s", highlight=False)
    console.print(f"wrote {path}")


def profile(res, cfg) -> None:
    """`dustin profile`: the profile's tables, then where it went."""
    from dustin_profile.show import render

    for r in render(res.profile, res.path.parent):
        console.print(r)
    console.print(f"wrote {res.path} ({res.recorded} windows recorded, "
                  f"{cfg.windows + cfg.heldout + cfg.retrieval - res.recorded} resumed) in {res.seconds['total']:.1f} s")
    mem = res.profile.calibration["run"].get("memory")
    if mem:
        peak = mem["peak_bytes"]
        console.print(f"memory: plan {mem['plan']['total_bytes'] / 2**30:.1f} GiB"
                      + ("" if peak is None else f", peak {peak / 2**30:.1f} GiB"), highlight=False)
    if not res.profile.has_heads:
        console.print(f"[yellow]no retrieval head raised ARR by {cfg.epsilon:g}: this profile cannot drive "
                      "--policy dustin (more --windows may find some)[/]")


def vocab(path, meta: dict, books: int) -> None:
    cov = ", ".join(f"top {k}: {v:.4f}" for k, v in meta["coverage_of_top_k"].items())
    console.print(f"wrote {path}: {meta['tokens']} tokens of {books} books, {meta['seen_tokens']} of "
                  f"{meta['vocab_size']} ids seen; share of tokens in the {cov}", highlight=False)


@contextmanager
def progress(label: str, total: int | None, stream=None):
    """A progress bar of `total` units (None: unknown); yields the callback that advances it (one call
    a unit). Off a terminal (a log, a pipe), one line per finished unit on `stream` (stderr) instead,
    with the elapsed time and, with a total, an estimate of the time left."""
    if console.is_terminal:
        from rich.progress import Progress

        with Progress(console=console) as bar:
            task = bar.add_task(label, total=total)
            yield lambda *_: bar.advance(task)
        return
    t0, done = time.perf_counter(), 0

    def tick(*_):
        nonlocal done
        done += 1
        spent = time.perf_counter() - t0
        left = "" if not total else f", about {_duration(spent / done * max(total - done, 0))} left"
        print(f"{label}: {done}{'' if not total else f'/{total}'} done, {_duration(spent)} elapsed{left}",
              file=stream or sys.stderr, flush=True)

    yield tick


def _duration(seconds: float) -> str:
    """12.3 s, 4 min 05 s, 2 h 03 min."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    m = int(seconds) // 60
    return f"{m} min {int(seconds) % 60:02d} s" if m < 60 else f"{m // 60} h {m % 60:02d} min"
