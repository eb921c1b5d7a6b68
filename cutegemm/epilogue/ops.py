"""Epilogue ops: one implementation, used by the sm90 and the sm100 kernels alike.

The mainloop hands every epilogue subtile to :func:`apply_epilogue` as an fp32 ``TensorSSA``
(registers on sm90, loaded from TMEM on sm100); the result is cast to the output dtype and
stored. Today the spec holds ``alpha`` (a runtime fp32 scalar); bias, activations and quantized
output join it as further fields, so the spec stays the one statement of what a kernel fuses
and part of the compile-cache key.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute


@dataclass(frozen=True)
class EpilogueSpec:
    """What the epilogue does to the fp32 accumulator before the cast.

    alpha: multiply by a runtime fp32 scalar (skipped at compile time when False, so
    ``alpha == 1`` costs nothing).
    """

    alpha: bool = False

    @property
    def name(self) -> str:
        parts = ["alpha"] if self.alpha else []
        return "+".join(parts) if parts else "identity"


def apply_epilogue(spec: EpilogueSpec, acc: cute.TensorSSA, alpha: cutlass.Float32) -> cute.TensorSSA:
    """Apply the ops of ``spec`` to one fp32 accumulator subtile (a TensorSSA).

    A plain Python function traced inside the kernel: ``spec`` is a compile-time value, so
    disabled ops emit no code.
    """
    if spec.alpha:
        acc = acc * alpha
    return acc
