"""The recurrent state of the Gated DeltaNet layers: allocation, reset, snapshot / restore.

A linear-attention layer carries two float32 states between calls (the numpy reference keeps
the same two in `GatedDeltaNet.conv_state` / `.ssm_state`):

    conv  [K-1, conv_dim]    the last K-1 inputs of the depthwise conv, oldest first
                             (conv_dim = 2 * n_k * d_k + n_v * d_v: the q|k|v channels)
    ssm   [n_v, d_k, d_v]    the delta-rule memory S of each value head

Layout: all layers' conv windows are one contiguous device array `[n_slots, K-1, conv_dim]`
and all SSM states another `[n_slots, n_v, d_k, d_v]`; `conv[layer]` / `ssm[layer]` are views
of one slot, keyed by *model* layer index (the layers whose `layer_type` is linear attention).
Two arrays rather than one per layer so that a snapshot, a restore or a reset of the whole
state is one kernel per array.

Reset, snapshot and restore are kernels (a fill and a copy), not driver memcpy/memset calls:
launches are what a CUDA graph captures, and under the simulator `bw24nb.graph` records
kernel launches only. So the speculative-decoding rollback (snapshot before the draft is
verified, restore on rejection) can live inside a captured step. A snapshot buffer is
allocated once (`new_snapshot`, outside any capture) and reused.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import cuda

from ..jit import kernel
from ..formats.config import LINEAR_ATTENTION

# Grid-stride copy/fill, COPY_UNROLL independent elements per thread per iteration (the array
# seen as COPY_UNROLL equal segments, thread i taking element i of each): several loads in
# flight per thread is what reaches full bandwidth (shared/DEVICE.md: 4 independent 4-byte loads
# per iteration ~4.4 TB/s vs 2.3-2.9 TB/s for one). 256 threads, at most COPY_BLOCKS_MAX blocks
# (132 SMs x 8) -- the 9B shape's SSM state is 24 layers x 2 MiB.
COPY_THREADS = 256
COPY_UNROLL = 4
COPY_BLOCKS_MAX = 1056


@kernel
def copy_f32(src, dst):
    """dst[i] = src[i] for i < len(dst) (flat float32 arrays)."""
    n = dst.shape[0]
    seg = (n + COPY_UNROLL - 1) // COPY_UNROLL
    start, step = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, seg, step):
        for u in range(COPY_UNROLL):
            j = i + u * seg
            if j < n:
                dst[j] = src[j]


@kernel
def fill_f32(dst, value):
    """dst[i] = value (flat float32 array)."""
    n = dst.shape[0]
    seg = (n + COPY_UNROLL - 1) // COPY_UNROLL
    start, step = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, seg, step):
        for u in range(COPY_UNROLL):
            j = i + u * seg
            if j < n:
                dst[j] = value


def _grid(n: int) -> int:
    per_block = COPY_THREADS * COPY_UNROLL
    return max(1, min(COPY_BLOCKS_MAX, (n + per_block - 1) // per_block))


def _flat(a):
    return a.reshape(a.size)


def _launch_copy(src, dst, stream=0):
    n = dst.size
    if src.size != n:
        raise ValueError(f"state copy: {src.size} elements into {n}")
    if n:
        copy_f32[_grid(n), COPY_THREADS, stream](_flat(src), _flat(dst))


def _launch_fill(dst, value: float, stream=0):
    n = dst.size
    if n:
        fill_f32[_grid(n), COPY_THREADS, stream](_flat(dst), np.float32(value))


# ------------------------------------------------------------------ sizes


def linear_attention_layers(config) -> list[int]:
    """Model layer indices with a Gated DeltaNet mixer (and therefore a recurrent state)."""
    return [i for i in range(config.num_hidden_layers) if config.layer_type(i) == LINEAR_ATTENTION]


def conv_state_shape(config) -> tuple[int, int]:
    """[K-1, conv_dim] of one layer's conv window."""
    conv_dim = (2 * config.linear_num_key_heads * config.linear_key_head_dim
                + config.linear_num_value_heads * config.linear_value_head_dim)
    return (config.linear_conv_kernel_dim - 1, conv_dim)


def ssm_state_shape(config) -> tuple[int, int, int]:
    """[n_v, d_k, d_v] of one layer's delta-rule state."""
    return (config.linear_num_value_heads, config.linear_key_head_dim, config.linear_value_head_dim)


def recurrent_state_bytes(config, snapshots: int = 0) -> int:
    """Device bytes of every linear-attention layer's conv window and SSM state (float32), plus
    `snapshots` full copies (speculative-decoding rollback buffers), for the VRAM budget."""
    per_layer = 4 * (int(np.prod(conv_state_shape(config))) + int(np.prod(ssm_state_shape(config))))
    return per_layer * len(linear_attention_layers(config)) * (1 + snapshots)


# ------------------------------------------------------------------ the state


@dataclass
class RecurrentSnapshot:
    """A device copy of some slots of a RecurrentState (see `RecurrentState.snapshot`)."""
    conv: object          # device float32 [n_slots, K-1, conv_dim]
    ssm: object           # device float32 [n_slots, n_v, d_k, d_v]
    slots: tuple          # which slots hold a copy (all, unless snapshot(layers=...) was used)


@dataclass
class StepStates:
    """Per-token copies of the whole state, [T, n_slots, ...] (RecurrentState.new_step_states)."""
    conv: object          # device float32 [T, n_slots, K-1, conv_dim]
    ssm: object           # device float32 [T, n_slots, n_v, d_k, d_v]
    slots: dict           # model layer -> slot

    def layer(self, layer: int) -> tuple:
        """(conv [T, K-1, conv_dim], ssm [T, n_v, d_k, d_v]) views of one layer, for the
        kernels' `steps` arguments."""
        s = self.slots[layer]
        return self.conv[:, s], self.ssm[:, s]


class RecurrentState:
    """Conv windows and SSM states of the linear-attention layers, on the device, zeroed.

    `RecurrentState(config)` allocates one slot per linear-attention layer of `config`;
    `layers=[...]` picks the model layers explicitly. `conv[layer]` (float32 [K-1, conv_dim])
    and `ssm[layer]` (float32 [n_v, d_k, d_v]) are the per-layer device views the GDN kernels
    update in place (kernels/gated_deltanet.py). Every method takes a `stream`; none allocates
    except `new_snapshot` (and `snapshot()` without `into`)."""

    def __init__(self, config, layers=None):
        self.layers = list(linear_attention_layers(config) if layers is None else layers)
        self.conv_shape = conv_state_shape(config)
        self.ssm_shape = ssm_state_shape(config)
        n = len(self.layers)
        self.conv_all = cuda.to_device(np.zeros((n, *self.conv_shape), np.float32))
        self.ssm_all = cuda.to_device(np.zeros((n, *self.ssm_shape), np.float32))
        self.layer_slots = {layer: s for s, layer in enumerate(self.layers)}
        self.conv = {layer: self.conv_all[s] for layer, s in self.layer_slots.items()}
        self.ssm = {layer: self.ssm_all[s] for layer, s in self.layer_slots.items()}

    @property
    def n_slots(self) -> int:
        return len(self.layers)

    @property
    def nbytes(self) -> int:
        return 4 * (self.conv_all.size + self.ssm_all.size)

    def slot(self, layer: int) -> int:
        """Slot of model layer `layer` (KeyError for a layer without a recurrent state)."""
        return self.layer_slots[layer]

    def reset(self, stream=0) -> None:
        """Forget the sequence: every conv window and SSM state to zero (the reference's
        `GatedDeltaNet.reset`)."""
        _launch_fill(self.conv_all, 0.0, stream)
        _launch_fill(self.ssm_all, 0.0, stream)

    def new_snapshot(self) -> RecurrentSnapshot:
        """Allocate a snapshot buffer the size of the whole state (do this before capture)."""
        return RecurrentSnapshot(
            conv=cuda.device_array(self.conv_all.shape, np.float32),
            ssm=cuda.device_array(self.ssm_all.shape, np.float32),
            slots=())

    def _slots(self, layers) -> tuple:
        return tuple(range(self.n_slots)) if layers is None else tuple(self.slot(l) for l in layers)

    def snapshot(self, into: RecurrentSnapshot | None = None, layers=None,
                 stream=0) -> RecurrentSnapshot:
        """Device-to-device copy of the state (of `layers` only, if given) into `into` (a
        buffer from `new_snapshot`; allocated here when None). Returns the snapshot."""
        snap = self.new_snapshot() if into is None else into
        slots = self._slots(layers)
        if layers is None:                       # the whole state: one copy per array
            _launch_copy(self.conv_all, snap.conv, stream)
            _launch_copy(self.ssm_all, snap.ssm, stream)
        else:
            for s in slots:
                _launch_copy(self.conv_all[s], snap.conv[s], stream)
                _launch_copy(self.ssm_all[s], snap.ssm[s], stream)
        snap.slots = slots
        return snap

    def restore(self, snap: RecurrentSnapshot, layers=None, stream=0) -> None:
        """Copy the snapshot back (all the slots it holds, or only those of `layers`)."""
        slots = snap.slots if layers is None else self._slots(layers)
        missing = set(slots) - set(snap.slots)
        if missing:
            raise ValueError(f"restore: the snapshot holds no copy of slots {sorted(missing)}")
        if len(slots) == self.n_slots:
            _launch_copy(snap.conv, self.conv_all, stream)
            _launch_copy(snap.ssm, self.ssm_all, stream)
        else:
            for s in slots:
                _launch_copy(snap.conv[s], self.conv_all[s], stream)
                _launch_copy(snap.ssm[s], self.ssm_all[s], stream)

    def new_step_states(self, T: int) -> "StepStates":
        """Buffers for the state after each of T tokens of one launch sequence (a speculative
        verify): the GDN kernels write them (`StepStates.layer`), `restore_step` puts one back.
        T x the whole state (9 x 48 MiB at the Qwen3.5-9B shape); allocate before capture."""
        return StepStates(
            conv=cuda.device_array((T, self.n_slots, *self.conv_shape), np.float32),
            ssm=cuda.device_array((T, self.n_slots, *self.ssm_shape), np.float32),
            slots=self.layer_slots)

    def restore_step(self, steps: "StepStates", t: int, stream=0) -> None:
        """The state as it was after token t of the launches that wrote `steps`: two copies
        (each step's states of every layer are one contiguous block)."""
        _launch_copy(steps.conv[t], self.conv_all, stream)
        _launch_copy(steps.ssm[t], self.ssm_all, stream)

    def read(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """Host copies (conv, ssm) of one layer's state, for tests and debugging."""
        return self.conv[layer].copy_to_host(), self.ssm[layer].copy_to_host()


PTX_SIGNATURES = {
    "copy_f32": ["void(float32[::1], float32[::1])"],
    "fill_f32": ["void(float32[::1], float32)"],
}

__all__ = ["RecurrentSnapshot", "RecurrentState", "StepStates", "conv_state_shape",
           "linear_attention_layers", "recurrent_state_bytes", "ssm_state_shape"]
