"""The last kernel of a captured decode step (and of an MTP draft step): move the sequence
forward on the device.

One CUDA graph serves every decode step because nothing in it is a host value: the token to
embed and its position live in device memory. After sampling, this kernel makes the sampled
token the next input and advances the position, so replaying the graph again decodes the next
token with no host-to-device copy at all (the host only reads the 4-byte token back).

The MTP draft chain does the same for the draft head (`mtp_chain`): its argmax and normed
output row become the next draft step's input.

numpy references: `advance_reference`, `mtp_chain_reference`.
"""
import numpy as np
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




@kernel
def mtp_chain(token, x_row, ids, h, positions, pos_src, pos_idx, drafts, counter, first):
    """Chain one MTP draft into the next, on the device (the draft-chain graphs of
    engine_spec.GpuMTPHead.draft): the head's argmax `token[0]` is recorded as the next draft
    (drafts[counter], counter + 1; first = 1 starts a round at 0), becomes the next pair's token
    (ids[0]) and its normed output row `x_row` the next pair's hidden row (h[0, :]), at
    position pos_src[pos_idx] + 1. One block; no host value, so one graph serves every round."""
    i = cuda.threadIdx.x
    for j in range(i, h.shape[1], cuda.blockDim.x):
        h[0, j] = x_row[j]
    if i == 0:
        t = token[0]
        ids[0] = t
        positions[0] = pos_src[pos_idx] + 1
        c = 0 if first else counter[0]
        drafts[c] = t
        counter[0] = c + 1


MTP_CHAIN_THREADS = 256


def launch_mtp_chain(token, x_row, ids, h, positions, pos_src, pos_idx: int, drafts, counter,
                     first: bool, stream=0):
    """See `mtp_chain`; token, ids, positions, pos_src, drafts, counter int32 device arrays,
    x_row float32[H], h float32[1, H]. Reference: `mtp_chain_reference`."""
    mtp_chain[1, MTP_CHAIN_THREADS, stream](token, x_row, ids, h, positions, pos_src,
                                           np.int32(pos_idx), drafts, counter, np.int32(first))


def mtp_chain_reference(token, x_row, ids, h, positions, pos_src, pos_idx, drafts, counter, first):
    h[0, :] = x_row
    ids[0] = token[0]
    positions[0] = pos_src[pos_idx] + 1
    c = 0 if first else counter[0]
    drafts[c] = token[0]
    counter[0] = c + 1


PTX_SIGNATURES = {
    "advance": ["void(int32[::1], int32[::1], int32[::1])"],
    "mtp_chain": ["void(int32[::1], float32[::1], int32[::1], float32[:, ::1], int32[::1], "
                  "int32[::1], int32, int32[::1], int32[::1], int32)"],
}
