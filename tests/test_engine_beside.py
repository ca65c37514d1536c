"""Which verify matvecs run beside others (decision 0039): Engine._mv passes `beside` to the int8
matvec launchers for the projections that `_side_by_side` puts on graph branches, so that
matvec.warp_rows keeps their T rule, and not for the launches that have the GPU to
themselves (attn_output, gdn_out, the MLP, the LM head), which may take pairs for short
outputs. The choice changes no bit (tests/test_kernels_matvec.py); this checks the wiring."""
from bw24nb.engine import Engine
from bw24nb.formats import open_model
from bw24nb.quant import QType

# the projections of one input that run side by side in a verify (T > 1: the T = 1 stacks
# [qkv | z] and [q | k | v] are not used there)
BESIDE = {"attn_qkv.weight", "attn_gate.weight", "ssm_beta.weight", "ssm_alpha.weight",
          "attn_q.weight", "attn_k.weight", "attn_v.weight", "ba"}
ALONE = {"attn_output.weight", "ssm_out.weight", "ffn_down.weight", "gu", "output.weight"}


def _names(eng) -> dict:
    """id of a launch's first argument (a weight buffer, or a Q6_K_R body) -> its name."""
    names = {}
    for name, dw in eng.w.tensors.items():
        short = name.split(".", 2)[-1] if name.startswith("blk.") else name
        for buf in (dw.buf, None if dw.q6k_r is None else dw.q6k_r[0]):
            if buf is not None:
                names[id(buf)] = short
    for (_, what), st in eng.stacks.items():
        for buf in (st.buf, None if st.q6k_r is None else st.q6k_r[0]):
            if buf is not None:
                names[id(buf)] = what
    return names


def test_verify_projections_side_by_side_launch_beside_the_rest_alone(int8_heads_hybrid,
                                                                      monkeypatch):
    from bw24nb.engine_spec import EngineSpecTarget
    from bw24nb.kernels import matvec, matvec_q6k
    eng = Engine(open_model(int8_heads_hybrid), n_ctx=24, k_type=QType.F16, v_type=QType.F16,
                 log=lambda m: None)
    assert eng._proj_branches is not None
    target = EngineSpecTarget(eng)
    target.prefill([3, 17, 101])
    names, seen = _names(eng), []

    def spy(real):
        def launch(w, *args, rows=1, beside=False, **kw):
            seen.append((names.get(id(w), "?"), rows, beside))
            return real(w, *args, rows=rows, beside=beside, **kw)
        return launch
    monkeypatch.setattr(matvec, "launch_matvec_q8", spy(matvec.launch_matvec_q8))
    monkeypatch.setattr(matvec_q6k, "launch_matvec_q8_q6k_r",
                        spy(matvec_q6k.launch_matvec_q8_q6k_r))
    target.verify([5, 9, 11])
    verify = [(n, b) for n, r, b in seen if r == 3]
    assert verify and "?" not in [n for n, _ in verify], seen
    got = {n: {b for m, b in verify if m == n} for n, _ in verify}
    # both kinds ran: GDN and attention layers' projections, and the launches alone
    assert {"attn_qkv.weight", "attn_gate.weight", "attn_q.weight", "ssm_out.weight",
            "attn_output.weight", "ffn_down.weight"} <= set(got), got
    for name, besides in got.items():
        assert besides == {name in BESIDE}, (name, besides)
    assert ALONE & set(got) and not ALONE & BESIDE
