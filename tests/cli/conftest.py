"""The CLI tests' fixtures live in tests/conftest.py (`cli`: the fork server of cli_server.py)."""
