#!/usr/bin/env python3
"""Independent float64 NumPy forward of DeepSeek-V3.2 (MLA + DSA indexer) that reads ONLY the
fixture files models/golden/v32_*/ and the formulas of models/golden/V32.md, and checks the
logits, the indexer's selections (every prompt), and for prompt 0 the index scores, per-head
weights and cached index keys against the transformers reference. It is the executable form of
V32.md (the MLA / MoE part reuses check_formulas.py, the executable form of README.md).

    python tools/golden/check_formulas_v32.py              # all V3.2 fixtures
    python tools/golden/check_formulas_v32.py v32_odd      # selected
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
from safetensors import safe_open

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_formulas import GOLDEN, load, mlp, rms, rope_interleaved, rope_setup, router  # noqa: E402

V32 = GOLDEN


def layer_norm(x, w, b, eps=1e-6):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)  # biased variance
    return (x - mu) / np.sqrt(var + eps) * w + b


def rope_half(x, pos, inv, af):
    """Non-interleaved RoPE on the last axis (size d): pair i = (x[i], x[i + d/2])."""
    d = x.shape[-1]
    ang = pos[:, None] * inv[None, :]  # [T, d/2]
    c, s = np.cos(ang) * af, np.sin(ang) * af
    if x.ndim == 3:  # [T, H, d]
        c, s = c[:, None], s[:, None]
    a, b = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([a * c - b * s, b * c + a * s], -1)


def indexer(cfg, w, p, h, qa, pos, inv, af):
    """Returns (scores [T, T] (future = -inf), keys [T, D], weights [T, H], selected mask [T, T])."""
    H, D, r, K = cfg["index_n_heads"], cfg["index_head_dim"], cfg["qk_rope_head_dim"], cfg["index_topk"]
    T = h.shape[0]
    q = (qa @ w[p + "self_attn.indexer.wq_b.weight"].T).reshape(T, H, D)
    k = layer_norm(h @ w[p + "self_attn.indexer.wk.weight"].T,
                   w[p + "self_attn.indexer.k_norm.weight"], w[p + "self_attn.indexer.k_norm.bias"])
    q = np.concatenate([rope_half(q[..., :r], pos, inv, af), q[..., r:]], -1)  # rope = FIRST r dims
    k = np.concatenate([rope_half(k[:, :r], pos, inv, af), k[:, r:]], -1)
    s = np.maximum(np.einsum("thd,sd->ths", q, k) * D ** -0.5, 0.0)  # ReLU per head
    wt = (h @ w[p + "self_attn.indexer.weights_proj.weight"].T) * H ** -0.5
    scores = np.einsum("th,ths->ts", wt, s)
    scores = np.where(np.tril(np.ones((T, T), dtype=bool)), scores, -np.inf)
    sel = np.zeros((T, T), dtype=bool)
    for t in range(T):
        order = np.argsort(-scores[t, : t + 1], kind="stable")  # ties -> lower position
        sel[t, order[: min(K, t + 1)]] = True
    return scores, k, wt, sel


def forward(cfg, w, ids):
    H = cfg["num_attention_heads"]
    dn, dr, dv, r = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"]
    eps = cfg["rms_norm_eps"]
    inv, af, scale = rope_setup(cfg)
    T = len(ids)
    pos = np.arange(T, dtype=np.float64)
    x = w["model.embed_tokens.weight"][ids]
    extras = []
    for L in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{L}."
        h = rms(x, w[p + "input_layernorm.weight"], eps)
        qa = rms(h @ w[p + "self_attn.q_a_proj.weight"].T, w[p + "self_attn.q_a_layernorm.weight"], 1e-6)
        q = (qa @ w[p + "self_attn.q_b_proj.weight"].T).reshape(T, H, dn + dr).transpose(1, 0, 2)
        q_nope, q_pe = q[..., :dn], rope_interleaved(q[..., dn:], pos, inv, af)
        ckv = h @ w[p + "self_attn.kv_a_proj_with_mqa.weight"].T
        c = rms(ckv[:, :r], w[p + "self_attn.kv_a_layernorm.weight"], 1e-6)
        k_pe = rope_interleaved(ckv[:, r:], pos, inv, af)
        kv = (c @ w[p + "self_attn.kv_b_proj.weight"].T).reshape(T, H, dn + dv).transpose(1, 0, 2)
        k_nope, v = kv[..., :dn], kv[..., dn:]
        scores, keys, wt, sel = indexer(cfg, w, p, h, qa, pos, inv, af)
        mask = np.where(sel, 0.0, -np.inf)  # sel is already causal
        sc = (q_nope @ k_nope.transpose(0, 2, 1) + q_pe @ k_pe.T[None]) * scale + mask
        pr = np.exp(sc - sc.max(-1, keepdims=True))
        pr /= pr.sum(-1, keepdims=True)
        o = (pr @ v).transpose(1, 0, 2).reshape(T, H * dv)
        x = x + o @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"], eps)
        extras.append((scores, keys, wt, sel))
        if L < cfg["first_k_dense_replace"]:
            x = x + mlp(h, w, p + "mlp.")
            continue
        idx, wts = router(cfg, h, w, p + "mlp.", "v3")
        y = mlp(h, w, p + "mlp.shared_experts.")
        for t in range(T):
            for j in range(idx.shape[1]):
                y[t] += wts[t, j] * mlp(h[t:t + 1], w, p + f"mlp.experts.{idx[t, j]}.")[0]
        x = x + y
    x = rms(x, w["model.norm.weight"], eps)
    return x @ w["lm_head.weight"].T, extras


def check(name):
    d = os.path.join(V32, name)
    cfg, w = load(d)
    assert cfg["model_type"] == "deepseek_v32"
    meta = json.load(open(os.path.join(d, "reference.json")))
    with safe_open(os.path.join(d, "reference.safetensors"), "np") as f:
        ref = {k: f.get_tensor(k) for k in f.keys()}
    inv, af, scale = rope_setup(cfg)
    assert np.allclose(inv, ref["rope_inv_freq"], rtol=1e-6)
    assert abs(af - meta["rope_attention_factor"]) < 1e-12 and abs(scale - meta["softmax_scale"]) < 1e-12
    worst = 0.0
    aux = {}
    for i in range(len(meta["prompts"])):
        logits, extras = forward(cfg, w, ref[f"prompt_{i}"].astype(np.int64))
        worst = max(worst, float(np.abs(logits - ref[f"logits_full_{i}"]).max()))
        assert (logits.argmax(-1) == ref[f"logits_full_{i}"].argmax(-1)).all()
        sel = np.stack([e[3] for e in extras]).astype(np.uint8)
        assert np.array_equal(sel, ref[f"index_mask_{i}"]), f"{name}: prompt {i} selection differs"
        if i == 0:
            T = sel.shape[1]
            causal = np.tril(np.ones((T, T), dtype=bool))
            sc = np.stack([np.where(causal, e[0], 0.0) for e in extras])
            aux["scores"] = float(np.abs(sc - ref["index_scores_0"]).max())
            aux["keys"] = float(np.abs(np.stack([e[1] for e in extras]) - ref["index_keys_0"]).max())
            aux["weights"] = float(np.abs(np.stack([e[2] for e in extras]) - ref["index_weights_0"]).max())
            idx = ref["index_idx_0"]
            for L in range(idx.shape[0]):
                for t in range(T):
                    row = idx[L, t][idx[L, t] >= 0]
                    assert np.array_equal(row, np.flatnonzero(sel[L, t])), (L, t)
    tol = meta["suggested_tolerance"]["logits_max_abs_diff"]
    ok = worst <= tol and max(aux.values()) < 1e-4
    print(f"{name:16s} float64 formulas vs reference: logits max|diff| {worst:.2e} (tol {tol:.2e}), "
          f"selections equal, prompt-0 scores {aux['scores']:.1e} keys {aux['keys']:.1e} "
          f"weights {aux['weights']:.1e} {'ok' if ok else 'FAIL'}")
    return ok


def main(argv):
    names = argv or sorted(
        n for n in os.listdir(V32) if n.startswith("v32_") and os.path.isfile(os.path.join(V32, n, "config.json"))
    )
    ok = all([check(n) for n in names])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main(sys.argv[1:])
