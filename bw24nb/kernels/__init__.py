"""GPU kernels (numba-cuda), one module per op family; each module holds its kernels, the
launcher with the grid math, its PTX_SIGNATURES for the compile check, and its numpy reference.

The weight kernels (other op families have their own modules beside these):

    dequant       where every field of every GGUF block type sits; device decoders
    matvec        decode y = W @ x (+ b) (+ r): float path (every type), dp4a path (int types)
    matvec_q4k    Q4_K decode, 16-byte loads straight from the GGUF blocks, dp4a
    matvec_q6k    Q6_K decode on the repacked Q6_K_R layout (16-byte loads, dp4a): the LM head
    matvec_qx0    Q8_0 / Q5_0 / Q4_0 decode, 16-byte loads of the GGUF blocks lined up in registers
    quantize_act  activations -> int8 + f32 scale per 32 values (the dp4a path's input)
    matmul        prefill Y = X @ W^T (+ b) (+ R), shared-memory tiles, every type
    matmul_q8     prefill on int8 tensor cores (mma.m16n8k32.s8), int types, X from quantize_act
    embedding     out = dequantize(table)[ids], every type
"""
import pkgutil

from .embedding import launch_embedding
from .matmul import launch_matmul
from .matvec import launch_matvec, launch_matvec_q8
from .quantize_act import launch_quantize_act

# every module of this package (for the compile check: each declares PTX_SIGNATURES), listed
# without importing them
KERNEL_MODULES = tuple(f"{__name__}.{m.name}" for m in pkgutil.iter_modules(__path__))

__all__ = ["launch_matvec", "launch_matvec_q8", "launch_quantize_act", "launch_matmul",
           "launch_embedding", "KERNEL_MODULES"]
