"""bw24nb: an LLM inference engine written in Python on Numba-CUDA.

Data path (see docs/ARCHITECTURE.md):
    formats/  -> ModelConfig + TensorSource (GGUF file or HF safetensors directory)
    models/   -> per-family layer recipe and weight naming
    reference/-> numpy oracle of every operation and whole models
    kernels/  -> @kernel kernels (run on the GPU, or in numba's CUDA simulator)
    jit.py    -> @kernel: cuda.jit + the on-disk cache of compiled kernels
    engine.py -> device weights, caches, prefill/decode, graph replay
"""

__version__ = "0.1.0"
