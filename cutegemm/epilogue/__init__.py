"""Composable epilogue ops applied to the fp32 accumulator, shared by every kernel family and arch."""

from ..config import ACTIVATIONS, EPI_DTYPES, GATED, EpilogueSpec
from .ops import apply_epilogue, epilogue_subtile, store_gated
from .reference import (
    GATE_LAYOUTS,
    activation_ref,
    epilogue_ref,
    gated_ref,
    interleave_gate_up,
    split_gate_up,
)

__all__ = [
    "ACTIVATIONS",
    "EPI_DTYPES",
    "GATED",
    "GATE_LAYOUTS",
    "EpilogueSpec",
    "activation_ref",
    "apply_epilogue",
    "epilogue_ref",
    "epilogue_subtile",
    "gated_ref",
    "interleave_gate_up",
    "split_gate_up",
    "store_gated",
]
