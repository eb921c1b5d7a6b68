"""Framework backends built on cutegemm's public API. Each lives in its own module and imports its
framework there, so ``import cutegemm`` (and this package) never imports a framework:

- :mod:`cutegemm.integrations.transformers`: the ``"cutegemm"`` experts implementation for
  Hugging Face transformers (>= 5), registered when the module is imported; it also runs
  transformers' fine-grained FP8 experts and NVFP4 / MXFP4 / MXFP8 experts made by its
  ``quantize_experts`` (inference).
"""
