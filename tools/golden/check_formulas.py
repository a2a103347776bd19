#!/usr/bin/env python3
"""Independent float64 NumPy forward that reads ONLY the fixture files and the formulas
written in models/golden/README.md, and checks them against the transformers reference
logits. It is the executable form of the README: if it passes, the README's formulas and
layout facts are sufficient to reproduce the golden logits.

    python tools/golden/check_formulas.py            # all fixtures
    python tools/golden/check_formulas.py v3_fp8     # selected
"""

from __future__ import annotations

import json
import math
import os
import sys

import numpy as np
from safetensors import safe_open

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
GOLDEN = os.path.join(ROOT, "models", "golden")


def e4m3_table():
    """256-entry decode table for float8_e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa;
    exponent 0 = subnormal (m/8 * 2^-6); 0x7F / 0xFF = NaN; no infinities."""
    t = np.zeros(256, dtype=np.float64)
    for b in range(256):
        s = -1.0 if b & 0x80 else 1.0
        e = (b >> 3) & 0xF
        m = b & 0x7
        if e == 0xF and m == 0x7:
            t[b] = np.nan
        elif e == 0:
            t[b] = s * (m / 8.0) * 2.0 ** -6
        else:
            t[b] = s * (1.0 + m / 8.0) * 2.0 ** (e - 7)
    return t


def load(dirname):
    with open(os.path.join(dirname, "config.json")) as f:
        cfg = json.load(f)
    import torch  # only to read bf16 / fp8 bytes out of safetensors

    raw = {}
    with safe_open(os.path.join(dirname, "model.safetensors"), "pt") as f:
        for k in f.keys():
            raw[k] = f.get_tensor(k)
    table = e4m3_table()
    w = {}
    for k, t in raw.items():
        if k.endswith("_scale_inv"):
            continue
        if t.dtype == torch.float8_e4m3fn:
            q = table[t.view(torch.uint8).numpy().astype(np.int64)].astype(np.float32)
            s = raw[k + "_scale_inv"].numpy().astype(np.float32)
            blk = cfg["quantization_config"]["weight_block_size"]
            o, i = q.shape
            sf = np.repeat(np.repeat(s, blk[0], 0)[:o], blk[1], 1)[:, :i]
            w[k] = (q * sf).astype(np.float32).astype(np.float64)  # one f32 multiply
        else:
            w[k] = t.float().numpy().astype(np.float64)
    return cfg, w


def rope_setup(cfg):
    """(inv_freq [rope/2], cos/sin factor, softmax scale) from either config spelling."""
    d = cfg["qk_rope_head_dim"]
    if "rope_parameters" in cfg and cfg["rope_parameters"] is not None:
        rp = dict(cfg["rope_parameters"])
        rtype = rp.get("rope_type", rp.get("type", "default"))
        theta = rp["rope_theta"]
    else:
        rp = dict(cfg.get("rope_scaling") or {})
        rtype = rp.get("type", rp.get("rope_type", "default")) if rp else "default"
        theta = cfg["rope_theta"]
    base = theta ** (-(np.arange(0, d, 2, dtype=np.float64) / d))
    qk = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    scale = qk ** -0.5
    if rtype == "default":
        return base, 1.0, scale
    assert rtype == "yarn", rtype
    factor = rp["factor"]
    orig = rp["original_max_position_embeddings"]
    bf, bs = rp.get("beta_fast") or 32, rp.get("beta_slow") or 1

    def corr_dim(rot):
        return d * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(theta))

    low, high = corr_dim(bf), corr_dim(bs)
    if rp.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(d // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    inv = base / factor * ramp + base * (1.0 - ramp)

    def m(f, ms):
        return 1.0 if f <= 1 else 0.1 * ms * math.log(f) + 1.0

    ms, msa = rp.get("mscale"), rp.get("mscale_all_dim")
    attn_factor = m(factor, ms) / m(factor, msa) if (ms and msa) else m(factor, 1.0)
    if rp.get("attention_factor") is not None:
        attn_factor = rp["attention_factor"]
    if msa:
        scale = scale * m(factor, msa) ** 2
    return inv, attn_factor, scale


def rms(x, w, eps):
    return w * (x / np.sqrt((x * x).mean(-1, keepdims=True) + eps))


def rope_interleaved(x, pos, inv, af):
    """x [..., T, d]: pairs (x[2i], x[2i+1]) rotated by pos * inv[i]; cos/sin scaled by af."""
    ang = pos[:, None] * inv[None, :]  # [T, d/2]
    c, s = np.cos(ang) * af, np.sin(ang) * af
    a, b = x[..., 0::2], x[..., 1::2]
    y = np.empty_like(x)
    y[..., 0::2] = a * c - b * s
    y[..., 1::2] = b * c + a * s
    return y


def silu(x):
    return x / (1.0 + np.exp(-x))


def mlp(x, w, p):
    return (silu(x @ w[p + "gate_proj.weight"].T) * (x @ w[p + "up_proj.weight"].T)) @ w[p + "down_proj.weight"].T


def router(cfg, x, w, p, arch):
    E, k = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    logits = x @ w[p + "gate.weight"].T
    T = x.shape[0]
    if arch == "v3":
        s = 1.0 / (1.0 + np.exp(-logits))
        ch = s + w[p + "gate.e_score_correction_bias"]
        G, kg = cfg["n_group"], cfg["topk_group"]
        g = np.sort(ch.reshape(T, G, E // G), -1)[..., ::-1][..., :2].sum(-1)
    else:
        z = np.exp(logits - logits.max(-1, keepdims=True))
        s = z / z.sum(-1, keepdims=True)
        ch = s.copy()
        if cfg["topk_method"] == "group_limited_greedy":
            G, kg = cfg["n_group"], cfg["topk_group"]
            g = s.reshape(T, G, E // G).max(-1)
        else:
            G, kg, g = 1, 1, None
    if g is not None and kg < G:
        keep = np.zeros((T, G), dtype=bool)
        np.put_along_axis(keep, np.argsort(-g, -1)[:, :kg], True, -1)
        keep = np.repeat(keep, E // G, -1)
        ch = np.where(keep, ch, -np.inf if arch == "v3" else 0.0)
    idx = np.argsort(-ch, -1, kind="stable")[:, :k]
    wt = np.take_along_axis(s, idx, -1)
    if arch == "v3" and cfg["norm_topk_prob"]:
        wt = wt / (wt.sum(-1, keepdims=True) + 1e-20)
    return idx, wt * cfg["routed_scaling_factor"]


def forward(cfg, w, ids):
    arch = "v3" if cfg["model_type"] == "deepseek_v3" else "v2"
    H = cfg["num_attention_heads"]
    dn, dr, dv, r = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"]
    eps = cfg["rms_norm_eps"]
    inv, af, scale = rope_setup(cfg)
    T = len(ids)
    pos = np.arange(T, dtype=np.float64)
    x = w["model.embed_tokens.weight"][ids]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    routes = []
    for L in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{L}."
        h = rms(x, w[p + "input_layernorm.weight"], eps)
        if cfg["q_lora_rank"] is None:
            q = h @ w[p + "self_attn.q_proj.weight"].T
        else:
            qa = rms(h @ w[p + "self_attn.q_a_proj.weight"].T, w[p + "self_attn.q_a_layernorm.weight"], eps)
            q = qa @ w[p + "self_attn.q_b_proj.weight"].T
        q = q.reshape(T, H, dn + dr).transpose(1, 0, 2)  # [H, T, nope+rope]
        q_nope, q_pe = q[..., :dn], rope_interleaved(q[..., dn:], pos, inv, af)
        ckv = h @ w[p + "self_attn.kv_a_proj_with_mqa.weight"].T  # [T, kv_lora + rope]
        c = rms(ckv[:, :r], w[p + "self_attn.kv_a_layernorm.weight"], eps)
        k_pe = rope_interleaved(ckv[:, r:], pos, inv, af)  # [T, rope], shared by heads
        kv = (c @ w[p + "self_attn.kv_b_proj.weight"].T).reshape(T, H, dn + dv).transpose(1, 0, 2)
        k_nope, v = kv[..., :dn], kv[..., dn:]
        sc = (q_nope @ k_nope.transpose(0, 2, 1) + q_pe @ k_pe.T[None]) * scale + mask
        pr = np.exp(sc - sc.max(-1, keepdims=True))
        pr /= pr.sum(-1, keepdims=True)
        o = (pr @ v).transpose(1, 0, 2).reshape(T, H * dv)
        x = x + o @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"], eps)
        moe = L >= cfg["first_k_dense_replace"] and L % cfg.get("moe_layer_freq", 1) == 0
        if not moe:
            x = x + mlp(h, w, p + "mlp.")
            continue
        idx, wt = router(cfg, h, w, p + "mlp.", arch)
        routes.append(np.sort(idx, -1))
        y = mlp(h, w, p + "mlp.shared_experts.")
        for t in range(T):
            for j in range(idx.shape[1]):
                y[t] += wt[t, j] * mlp(h[t:t + 1], w, p + f"mlp.experts.{idx[t, j]}.")[0]
        x = x + y
    x = rms(x, w["model.norm.weight"], eps)
    head = w["lm_head.weight"] if "lm_head.weight" in w else w["model.embed_tokens.weight"]
    return x @ head.T, routes


def check(name):
    d = os.path.join(GOLDEN, name)
    cfg, w = load(d)
    meta = json.load(open(os.path.join(d, "reference.json")))
    if cfg.get("tie_word_embeddings"):
        assert "lm_head.weight" not in w
    with safe_open(os.path.join(d, "reference.safetensors"), "np") as f:
        ref = {k: f.get_tensor(k) for k in f.keys()}
    inv, af, scale = rope_setup(cfg)
    assert np.allclose(inv, ref["rope_inv_freq"], rtol=1e-6), (inv, ref["rope_inv_freq"])
    assert abs(af - meta["rope_attention_factor"]) < 1e-12 and abs(scale - meta["softmax_scale"]) < 1e-12
    worst = 0.0
    for i in range(len(meta["prompts"])):
        logits, routes = forward(cfg, w, ref[f"prompt_{i}"].astype(np.int64))
        diff = float(np.abs(logits - ref[f"logits_full_{i}"]).max())
        worst = max(worst, diff)
        assert (logits.argmax(-1) == ref[f"logits_full_{i}"].argmax(-1)).all()
        if i == 0 and "route_idx_0" in ref:
            assert np.array_equal(np.stack(routes), ref["route_idx_0"]), "routing differs"
    tol = meta["suggested_tolerance"]["logits_max_abs_diff"]
    status = "ok" if worst <= tol else "FAIL"
    print(f"{name:18s} float64 formulas vs reference: max|diff| {worst:.2e} (tolerance {tol:.2e}) {status}")
    return worst <= tol


def main(argv):
    # Fixture directories only; the V3.2 fixtures (model_type deepseek_v32) have their own check,
    # check_formulas_v32.py.
    def is_v2_v3(n):
        path = os.path.join(GOLDEN, n, "config.json")
        if not os.path.isfile(path):
            return False
        with open(path) as f:
            return json.load(f).get("model_type") != "deepseek_v32"

    names = argv or sorted(n for n in os.listdir(GOLDEN) if is_v2_v3(n))
    ok = all([check(n) for n in names])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main(sys.argv[1:])
