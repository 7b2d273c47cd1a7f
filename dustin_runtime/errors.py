"""The one error type that the CLI turns into a single clear line and a non-zero exit, and the
ranges of user-given counts beyond which input is refused with one."""

# Token counts (contexts, budgets, new tokens: beyond any model's context) and other counts
# (windows, trials, batch sizes: beyond any useful run).
MAX_TOKENS = 1 << 24
MAX_COUNT = 1 << 16
MAX_GAMMA = 256  # draft tokens per step: beyond it a step drafts for minutes and accepts a few


class DustinError(Exception):
    """Bad input or an unsupported request; its message is shown to the user as one line."""


class RankError(DustinError):
    """A failure only this rank sees (the rendezvous: the other ranks may not exist), so every rank
    prints it, not rank 0 alone."""
