"""Triton kernels and their pure-torch references (installed as `dustin_kernels`)."""
