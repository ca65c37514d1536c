"""Device-side caches: the quantized KV cache of the softmax-attention layers (`kv.py`).

Recurrent (Gated DeltaNet) state and the MoE expert-residency cache live beside it.
"""
from .kv import (K_TYPE_DEFAULT, KV_CACHE_KINDS, KV_TYPES, V_TYPE_DEFAULT, KVCache, attention_layers,
                 kv_cache_bytes, kv_row_bytes, launch_kv_store, launch_kv_store_rope)

__all__ = ["KVCache", "KV_CACHE_KINDS", "KV_TYPES", "K_TYPE_DEFAULT", "V_TYPE_DEFAULT", "attention_layers",
           "kv_cache_bytes", "kv_row_bytes", "launch_kv_store", "launch_kv_store_rope"]
