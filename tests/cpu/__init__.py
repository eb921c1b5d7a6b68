"""CPU tests: no GPU needed (CI runs them)."""
