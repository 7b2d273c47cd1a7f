"""Speculative decoding's stats count only the drafts that were emitted: on every sequence the
steps' (accepted + 1) add up to its new tokens, also on the last step, where --max-new-tokens cuts
the accepted drafts (they were counted before)."""

from dustin_runtime.loader import load_model
from dustin_runtime.speculative import speculative_generate


def test_accepted_counts_only_emitted_drafts(tmp_path, make_tiny_hf):
    make_tiny_hf("llama3", tmp_path / "m", vocab_size=64)
    model = load_model(str(tmp_path / "m"))[0]
    # the draft is the target: greedy drafts are all accepted, 5 tokens per step; 7 = 5 + 2 cut ones
    res = speculative_generate(model, model, [[1, 2, 3], [4, 5]], [7, 12], gamma=4)
    s = res.stats
    assert s.new_tokens == [7, 12]
    for b in range(2):
        per_step = [row[b] + 1 for row in s.accepted if row[b] >= 0]
        assert sum(per_step) == s.new_tokens[b], per_step
