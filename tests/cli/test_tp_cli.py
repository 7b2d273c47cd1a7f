"""`dustin` under a launcher (RANK, WORLD_SIZE, ... as torchrun sets them; ranks forked by the
`tp_run` fixture, gloo on CPU): the same output as one process, printed by rank 0 only, and every
bad input one line on rank 0 with exit code 2 on every rank."""

import json
import shutil

import pytest

from tests.conftest import stderr_lines


@pytest.fixture(scope="module")
def pair(small_models, write_profile, tmp_path_factory):
    root = tmp_path_factory.mktemp("tp-cli")
    prompts = root / "prompts.jsonl"
    prompts.write_text('{"prompt": "Once upon a time there was"}\n{"prompt": "The river ran", "max_new_tokens": 5}\n'
                       '{"prompt": "In the morning the"}\n')
    profile = write_profile(root / "p.json", small_models["target"], small_models["draft"], budget=16, window=4, m=4)
    return {"target": small_models["target"], "draft": small_models["draft"], "prompts": prompts,
            "profile": profile, "root": root}


def _decode(pair, *extra):
    return ["decode", "--target", pair["target"], "--draft", pair["draft"], "--prompts", pair["prompts"],
            "--max-new-tokens", "8", "--gamma", "3", "--json", *extra]


def _record(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("policy", ["full", "dustin"])
def test_decode_under_the_launcher_equals_one_process(pair, cli, tp_run, policy):
    args = _decode(pair, "--policy", policy, *(["--profile", pair["profile"]] if policy == "dustin" else []))
    one = cli(*args)
    assert one.returncode == 0, one.stderr
    ranks = tp_run.cli(2, *args, "--tp", "2")
    assert [rc for rc, _, _ in ranks] == [0, 0], ranks[0][2] + ranks[1][2]
    rec = _record(ranks[0][1])
    assert rec["tokens"] == _record(one.stdout)["tokens"] and rec["tp"] == 2
    assert ranks[1][1] == ""  # rank 1 prints nothing


def _one_line_on_rank0(ranks, *needles):
    assert [rc for rc, _, _ in ranks] == [2] * len(ranks), ranks
    lines = stderr_lines(ranks[0][2])
    assert len(lines) == 1 and "Traceback" not in ranks[0][2], ranks[0][2]
    for n in needles:
        assert n in lines[0], lines[0]
    assert all(out == "" and err == "" for _, out, err in ranks[1:]), ranks[1:]


def test_tp_not_dividing_the_kv_heads(pair, tp_run):
    _one_line_on_rank0(tp_run.cli(3, *_decode(pair), "--tp", "3"), "--tp 3 does not divide the 2 KV heads")


def test_tp_other_than_the_launchers_world(pair, tp_run):
    _one_line_on_rank0(tp_run.cli(2, *_decode(pair), "--tp", "4"), "--tp 4", "started 2 processes")


def test_tp_larger_than_the_visible_gpus(pair, tp_run):
    import torch

    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine shows 2 GPUs")
    _one_line_on_rank0(tp_run.cli(2, "bench", "e2e", "--tp", "2"),  # bench e2e runs on CUDA
                       "--tp 2 puts 2 processes on this machine", "GPU")


def test_a_ranks_shard_missing(pair, tp_run):
    """The config asks for 1028 vocabulary rows, the checkpoint holds 1024: rank 1's rows 514:1028 of the
    embedding are not in the file; rank 0 reports rank 1's error and both exit 2."""
    short = pair["root"] / "short-vocab"
    if not short.exists():
        shutil.copytree(pair["target"], short)
        cfg = json.loads((short / "config.json").read_text())
        (short / "config.json").write_text(json.dumps({**cfg, "vocab_size": 1028}))
    args = _decode(pair)
    args[args.index("--target") + 1] = short
    _one_line_on_rank0(tp_run.cli(2, *args, "--tp", "2"), "rank 1 of 2", "rows 514:1028", "missing")


def test_tp_without_the_launcher(pair, cli, assert_one_line_error):
    assert_one_line_error(cli(*_decode(pair), "--tp", "2"), "torchrun --nproc-per-node 2", code=2)


def test_one_process_commands_under_the_launcher(tp_run):
    _one_line_on_rank0(tp_run.cli(2, "bench", "attention", "--shape", "qwen2.5-7b", "--context", "64"),
                       "dustin bench attention runs in one process")


def test_eval_under_the_launcher_writes_once_and_resumes(pair, tp_run, gutenberg_eval_dir, tmp_path):
    """Rank 0 writes the records (one line per run, not one per rank); a second run resumes them on
    every rank alike; a changed setting is refused on rank 0 with one line."""
    out = tmp_path / "acc"
    args = ["eval", "acceptance", "--target", pair["target"], "--draft", pair["draft"], "--contexts", "96",
            "--windows", "2", "--max-new-tokens", "4", "--budget", "80", "--policy", "streamingllm", "--no-arr",
            "--no-paired", "--data", gutenberg_eval_dir, "--out", out / "tp", "--tp", "2"]
    for _ in range(2):
        ranks = tp_run.cli(2, *args)
        assert [rc for rc, _, _ in ranks] == [0, 0], ranks[0][2] + ranks[1][2]
        assert len((out / "tp.runs.jsonl").read_text().splitlines()) == 2  # full, streamingllm
    assert sorted(p.name for p in out.iterdir()) == [".dustin.lock", "tp.json", "tp.key.json", "tp.md", "tp.runs.jsonl"]
    args[args.index("--max-new-tokens") + 1] = "5"
    _one_line_on_rank0(tp_run.cli(2, *args), "other settings")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launcher(**over) -> dict:
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_free_port()), "DUSTIN_RENDEZVOUS_TIMEOUT": "2"}
    return {**env, **over}


@pytest.mark.parametrize("over, needle", [
    ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not an integer >= 1"),
    ({"WORLD_SIZE": "0"}, "WORLD_SIZE='0'"),
    ({"RANK": "x"}, "RANK='x' is not an integer >= 0"),
    ({"RANK": "-1"}, "RANK='-1'"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 is not below WORLD_SIZE=2"),
    ({"LOCAL_RANK": "a"}, "LOCAL_RANK='a'"),
    ({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "1", "WORLD_SIZE": "2"}, "LOCAL_RANK=1 / LOCAL_WORLD_SIZE=1"),
    ({"MASTER_PORT": "http"}, "MASTER_PORT='http'"),
    ({"MASTER_PORT": "70000"}, "MASTER_PORT=70000 is not a port"),
    ({"MASTER_ADDR": " "}, "MASTER_ADDR is empty"),
    ({"WORLD_SIZE": "2", "DUSTIN_RENDEZVOUS_TIMEOUT": "soon"}, "DUSTIN_RENDEZVOUS_TIMEOUT='soon'"),
    ({"WORLD_SIZE": "2"}, "rank 1 of WORLD_SIZE=2 did not join within 2 s"),  # one process for a world of 2
    ({"WORLD_SIZE": "3", "RANK": "1"}, "rank 1 cannot reach rank 0 at 127.0.0.1:"),  # rank 0 never started
])
def test_launcher_variables_checked_before_and_during_the_rendezvous(pair, cli, assert_one_line_error, over, needle):
    import time

    t0 = time.monotonic()
    p = cli(*_decode(pair), env=_launcher(**over), timeout=60)
    assert_one_line_error(p, needle, code=2)
    assert time.monotonic() - t0 < 30  # seconds, not the 30-minute default wait
