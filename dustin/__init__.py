"""Dustin: long-context speculative decoding with sparse verification."""

__version__ = "0.1.0"
