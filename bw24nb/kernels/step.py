"""The last kernel of a captured decode step: move the sequence forward on the device.

One CUDA graph serves every decode step because nothing in it is a host value: the token to
embed and its position live in device memory. After sampling, this kernel makes the sampled
token the next input and advances the position, so replaying the graph again decodes the next
token with no host-to-device copy at all (the host only reads the 4-byte token back).

numpy reference: `advance_reference`.
"""
from numba import cuda

from ..jit import kernel


@kernel
def advance(token_in, token_out, position):
    if cuda.threadIdx.x == 0 and cuda.blockIdx.x == 0:
        token_in[0] = token_out[0]
        position[0] = position[0] + 1


def launch_advance(token_in, token_out, position, stream=0):
    """token_in[0] = token_out[0]; position[0] += 1 (int32[1] device arrays)."""
    advance[1, 32, stream](token_in, token_out, position)


def advance_reference(token_in, token_out, position):
    token_in[0] = token_out[0]
    position[0] += 1


PTX_SIGNATURES = {"advance": ["void(int32[::1], int32[::1], int32[::1])"]}
