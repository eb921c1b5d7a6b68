"""GPU tests: skipped without a CUDA GPU (sm_100 ones without an sm_100 GPU)."""
