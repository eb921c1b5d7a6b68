"""Compile, cache and launch: fake-tensor signatures, the in-memory and on-disk kernel cache."""
