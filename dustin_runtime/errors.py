"""The one error type that the CLI turns into a single clear line and a non-zero exit."""


class DustinError(Exception):
    """Bad input or an unsupported request; its message is shown to the user as one line."""
