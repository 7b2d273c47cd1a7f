"""Progress off a terminal (`render.progress`): one line per finished unit, with the elapsed time
and, with a known total, an estimate of the time left; nothing but those lines."""

import io
import re
import time

from dustin import render


def test_one_line_per_unit_with_elapsed_and_estimate():
    assert not render.console.is_terminal  # pytest captures stdout: the non-terminal path
    out = io.StringIO()
    with render.progress("pg19 context 2048", 3, stream=out) as tick:
        for _ in range(3):
            time.sleep(0.01)
            tick()
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    spent = []
    for i, line in enumerate(lines, 1):
        m = re.fullmatch(rf"pg19 context 2048: {i}/3 done, ([0-9.]+) s elapsed, about ([0-9.]+) s left", line)
        assert m, line
        spent.append(float(m[1]))
    assert spent == sorted(spent)
    assert lines[-1].endswith("about 0.0 s left")


def test_unknown_total_has_no_estimate():
    out = io.StringIO()
    with render.progress("counting books", None, stream=out) as tick:
        tick()
        tick()
    assert [re.sub(r"[0-9.]+ s", "T", x) for x in out.getvalue().splitlines()] == [
        "counting books: 1 done, T elapsed", "counting books: 2 done, T elapsed"]


def test_durations_read_in_minutes_and_hours():
    assert [render._duration(s) for s in (5.25, 245, 7380)] == ["5.2 s", "4 min 05 s", "2 h 03 min"]


def test_profile_reports_each_window_and_search_round_through_the_one_helper(cli, small_models, tmp_path):
    """`dustin profile` off a terminal: a line per recorded window with the estimate of the time
    left, then a line per greedy-search round (the same helper as the eval commands)."""
    books = tmp_path / "books"
    books.mkdir()
    (books / "b.txt").write_text("The river ran past the house every morning. " * 400)
    p = cli("profile", "--target", small_models["target"], "--draft", small_models["draft"], "--calib", books,
            "--context", "64", "--windows", "3", "--budget", "40", "--sinks", "2", "--window", "8",
            "--out", tmp_path / "p.json")
    assert p.returncode == 0, p.stderr
    windows = [x for x in p.stderr.splitlines() if x.startswith("profile windows:")]
    assert len(windows) == 3, p.stderr
    for i, line in enumerate(windows, 1):
        assert re.fullmatch(rf"profile windows: {i}/3 done, [0-9.]+ s elapsed, about [0-9.]+ s left", line), line
    rounds = [x for x in p.stderr.splitlines() if x.startswith("greedy search rounds:")]
    assert rounds and all(re.fullmatch(rf"greedy search rounds: {i} done, [0-9.]+ s elapsed", x)
                          for i, x in enumerate(rounds, 1)), p.stderr
