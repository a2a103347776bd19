#!/usr/bin/env python3
"""Generate the DeepSeek-V3.2 (DSA, sparse attention) golden fixtures models/golden/v32_*/.

Same recipe as make_golden.py (whose helpers this script imports): a tiny RANDOM
DeepseekV32ForCausalLM checkpoint written through transformers' save_pretrained, reloaded with
from_pretrained, and fp32 reference outputs computed by transformers (eager attention). On top
of the V3 references (logits, residual stream, routes) every fixture records what the DSA
indexer selected, and the prompts are re-drawn until no top-k selection is decided by a
near-tie (MIN_INDEX_MARGIN), exactly as routing decisions are guarded by MIN_ROUTE_MARGIN.

The fixtures sit beside the V2/V3 ones (models/golden/<name>/), so every golden test of the Rust
suite runs them; tests/golden_v32.rs adds the V3.2-specific checks.

Run by hand (not in CI), from the repository root:

    python tools/golden/make_golden_v32.py                 # all V3.2 fixtures
    python tools/golden/make_golden_v32.py v32_odd         # selected fixtures
    python tools/golden/check_formulas_v32.py              # independent float64 check

models/golden/V32.md documents every formula and tensor these files rely on.
"""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import save_file
from transformers import (
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
    DeepseekV32Config,
    DeepseekV32ForCausalLM,
)
from transformers.cache_utils import DynamicCache

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_golden as mg  # noqa: E402  (shared helpers: init, save, routing, decode check)

OUT_DIR = mg.OUT_DIR
PROMPT_LENS = mg.PROMPT_LENS  # (37, 21, 9)
# Indexer top-k decisions closer than this (in index-score units, scores are O(1)) are fragile:
# prompts are re-drawn until, in every layer and every prompt, the k-th best causal key beats
# the (k+1)-th by at least this much. (f32-vs-f64 score noise is ~1e-7.)
MIN_INDEX_MARGIN = 2e-4
MAX_ATTEMPTS = 200
# Fixtures must stay small.
MAX_FIXTURE_BYTES = 700_000

# ----------------------------------------------------------------------------------------
# Fixture specifications
# ----------------------------------------------------------------------------------------

_V32_BASE = dict(
    num_attention_heads=4,
    num_key_value_heads=4,
    kv_lora_rank=32,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=16,
    rms_norm_eps=1e-6,
    hidden_act="silu",
    attention_bias=False,
    attention_dropout=0.0,
    pad_token_id=None,
    bos_token_id=0,
    eos_token_id=1,
    initializer_range=0.02,
    use_cache=True,
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=24,
    num_hidden_layers=2,
    q_lora_rank=32,
    n_routed_experts=8,
    n_shared_experts=1,
    num_experts_per_tok=2,
    n_group=4,
    topk_group=2,
    norm_topk_prob=True,
    routed_scaling_factor=2.5,
    first_k_dense_replace=1,
    max_position_embeddings=64,
    rope_parameters=mg._yarn(10000.0, 4.0, 1.0, 1.0, 16),
    tie_word_embeddings=False,
    # Hub-config keys transformers' V3.2 class does not read (it hard-codes noaux_tc + sigmoid).
    topk_method="noaux_tc",
    scoring_func="sigmoid",
    moe_layer_freq=1,
    num_nextn_predict_layers=0,
    # DSA indexer
    index_n_heads=4,
    index_head_dim=16,
    index_topk=8,
)

SPECS = {
    # index_topk (8) < every prompt (37 / 21 / 9): the indexer really drops keys.
    "v32_topk_small": dict(
        seed=3201,
        config=dict(_V32_BASE),
        bias_std=0.15,
        expect_drops=True,
    ),
    # index_topk (64) > every prompt and >= max_position_embeddings: the selection keeps every
    # causal key, so the model must equal dense V3 MLA with the same weights (asserted).
    "v32_topk_large": dict(
        seed=3202,
        config=dict(_V32_BASE, num_hidden_layers=3, intermediate_size=64, moe_intermediate_size=16,
                    n_routed_experts=6, n_group=3, topk_group=2, index_topk=64),
        bias_std=0.15,
        expect_drops=False,
    ),
    # Nothing a power of two: hidden 72, vocab 100, intermediate 60 / 20, 3 heads, q_lora 40, kv_lora 24, nope 12, rope 6, v 10,
    # 5 index heads of dim 20 (6 rope + 14 pass), index_topk 5, 6 experts in 3 groups; YaRN with
    # mscale != mscale_all_dim (cos/sin factor 1.0648 enters the indexer's RoPE too) and a
    # fractional ramp.
    "v32_odd": dict(
        seed=3203,
        config=dict(
            _V32_BASE,
            vocab_size=100,
            hidden_size=72,
            intermediate_size=60,
            moe_intermediate_size=20,
            num_hidden_layers=3,
            num_attention_heads=3,
            num_key_value_heads=3,
            q_lora_rank=40,
            kv_lora_rank=24,
            qk_nope_head_dim=12,
            qk_rope_head_dim=6,
            v_head_dim=10,
            n_routed_experts=6,
            n_group=3,
            topk_group=2,
            routed_scaling_factor=1.75,
            rope_parameters=mg._yarn(10000.0, 4.0, 1.0, 0.5, 16, beta_fast=32, beta_slow=0.25),
            index_n_heads=5,
            index_head_dim=20,
            index_topk=5,
        ),
        bias_std=0.15,
        expect_drops=True,
    ),
}

INDEXER = "self_attn.indexer."

# ----------------------------------------------------------------------------------------
# Model construction
# ----------------------------------------------------------------------------------------


def build_model(spec):
    config = DeepseekV32Config(**copy.deepcopy(spec["config"]))
    config._attn_implementation = "eager"
    torch.manual_seed(spec["seed"])
    model = DeepseekV32ForCausalLM(config).float().eval()
    mg.init_random(model, dict(spec, arch="v3"))  # V3 recipe for everything (router bias incl.)
    init_indexer(model, spec["seed"])
    return model


def init_indexer(model, seed):
    """Indexer weights: O(1) index scores that differ across keys, a non-trivial LayerNorm
    (weight != 1, bias != 0) and per-head weights of both signs."""
    gen = torch.Generator().manual_seed(seed + 31)
    cfg = model.config
    h, ql = cfg.hidden_size, cfg.q_lora_rank
    with torch.no_grad():
        for layer in model.model.layers:
            ix = layer.self_attn.indexer
            ix.wq_b.weight.copy_(torch.randn(ix.wq_b.weight.shape, generator=gen) * (1.5 / math.sqrt(ql)))
            ix.wk.weight.copy_(torch.randn(ix.wk.weight.shape, generator=gen) * (1.0 / math.sqrt(h)))
            ix.k_norm.weight.copy_(1.0 + 0.2 * torch.randn(ix.k_norm.weight.shape, generator=gen))
            ix.k_norm.bias.copy_(0.3 * torch.randn(ix.k_norm.bias.shape, generator=gen))
            ix.weights_proj.weight.copy_(
                torch.randn(ix.weights_proj.weight.shape, generator=gen) * (2.0 / math.sqrt(h)))


def load_reference_model(dirname, attn="eager"):
    model, info = DeepseekV32ForCausalLM.from_pretrained(
        dirname, dtype=torch.float32, output_loading_info=True, attn_implementation=attn)
    assert not info["missing_keys"], info["missing_keys"]
    assert not info.get("mismatched_keys"), info["mismatched_keys"]
    return model.eval(), info


def dense_v3_twin(ref, spec):
    """The same weights in transformers' DENSE DeepseekV3ForCausalLM (indexer dropped)."""
    cfg = {k: v for k, v in copy.deepcopy(spec["config"]).items() if not k.startswith("index_")}
    cfg["rope_interleave"] = True
    config = DeepseekV3Config(**cfg)
    config._attn_implementation = "eager"
    m3 = DeepseekV3ForCausalLM(config).float().eval()
    sd = {k: v for k, v in ref.state_dict().items() if ".indexer." not in k}
    m3.load_state_dict(sd, strict=True)
    return m3


# ----------------------------------------------------------------------------------------
# Indexer re-implementation (checked against transformers' own selections)
# ----------------------------------------------------------------------------------------


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


@torch.no_grad()
def indexer_parts(ix, x, qr, pos, inv_freq, af, dtype=torch.float32):
    """Index scores for one sequence. x: indexer input (= the attention input, i.e. the
    input_layernorm output) [T, hidden]; qr: q_a_layernorm(q_a_proj(x)) [T, q_lora]; pos [T].
    Returns (scores [T, T] without causal mask, keys [T, D] as cached, weights [T, H])."""
    cast = lambda t: t.detach().to(dtype)  # noqa: E731
    H, D, r = ix.n_heads, ix.head_dim, ix.qk_rope_head_dim
    T = x.shape[0]
    x, qr = cast(x), cast(qr)
    q = F.linear(qr, cast(ix.wq_b.weight)).view(T, H, D)
    k = F.layer_norm(F.linear(x, cast(ix.wk.weight)), (D,), cast(ix.k_norm.weight),
                     cast(ix.k_norm.bias), eps=ix.k_norm.eps)
    freqs = pos.to(dtype)[:, None] * inv_freq.to(dtype)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)  # [T, r]
    cos, sin = emb.cos() * af, emb.sin() * af
    q_rot = q[..., :r] * cos[:, None] + rotate_half(q[..., :r]) * sin[:, None]  # rope = FIRST r dims
    k_rot = k[..., :r] * cos + rotate_half(k[..., :r]) * sin
    q = torch.cat([q_rot, q[..., r:]], -1)
    k = torch.cat([k_rot, k[..., r:]], -1)
    s = torch.relu(torch.einsum("thd,sd->ths", q, k) * (D ** -0.5))  # [T, H, T]
    w = F.linear(x, cast(ix.weights_proj.weight)) * (H ** -0.5)  # [T, H]
    scores = torch.einsum("th,ths->ts", w, s)
    return scores, k, w


def select(scores, k):
    """Causal top-k per row. Returns (list of sorted index lists, margins [T] (inf = nothing
    dropped)). A tie would be broken by position (lower first) here; the fixtures contain none."""
    T = scores.shape[0]
    sel, margins = [], torch.full((T,), float("inf"), dtype=torch.float64)
    for t in range(T):
        v = scores[t, : t + 1].double()
        n = t + 1
        if n <= k:
            sel.append(list(range(n)))
            continue
        order = sorted(range(n), key=lambda s: (-float(v[s]), s))
        sel.append(sorted(order[:k]))
        margins[t] = float(v[order[k - 1]] - v[order[k]])
    return sel, margins


class IndexerCapture:
    """Forward hooks on every layer's indexer: inputs and transformers' returned indices."""

    def __init__(self, model):
        self.calls = []
        self.handles = []
        for li, layer in enumerate(model.model.layers):
            self.handles.append(layer.self_attn.indexer.register_forward_hook(
                lambda mod, args, kwargs, out, li=li: self.calls.append(dict(
                    layer=li,
                    x=args[0].detach()[0].clone(),
                    qr=args[1].detach()[0].clone(),
                    cos=args[2][0].detach()[0].clone(),
                    sin=args[2][1].detach()[0].clone(),
                    out=out.detach()[0].clone(),
                    cached=kwargs.get("cache") is not None,
                )), with_kwargs=True))

    def close(self):
        for h in self.handles:
            h.remove()


def tf_selection(out_row, t):
    """transformers' top-k row for query position t, restricted to causal keys (when fewer than
    index_topk keys are causal its top-k also returns masked future positions: harmless for the
    eager mask, see V32.md)."""
    return sorted(int(s) for s in out_row.tolist() if s <= t)


def prompt_analysis(model, ids):
    """One full forward under hooks: V3 references via make_golden.prompt_routes plus the
    indexer's selections, scores and margins (re-implementation checked against transformers)."""
    cfg = model.config
    rot = model.model.rotary_emb
    inv_freq, af = rot.inv_freq.detach().float(), float(rot.attention_scaling)
    cap = IndexerCapture(model)
    try:
        logits, hidden, routes, route_margin, flips, decisions = mg.prompt_routes(
            model, {"arch": "v3"}, ids)
    finally:
        cap.close()
    T = ids.shape[0]
    pos = torch.arange(T)
    assert len(cap.calls) == cfg.num_hidden_layers
    layers = []
    for c in cap.calls:
        ix = model.model.layers[c["layer"]].self_attn.indexer
        # transformers' cos/sin are the model's rotary embedding (YaRN inv_freq, attention factor)
        freqs = pos.float()[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), -1)
        assert torch.allclose(c["cos"], emb.cos() * af, atol=1e-6)
        assert torch.allclose(c["sin"], emb.sin() * af, atol=1e-6)
        scores, keys, weights = indexer_parts(ix, c["x"], c["qr"], pos, inv_freq, af)
        scores64, _, _ = indexer_parts(ix, c["x"], c["qr"], pos, inv_freq.double(), af, torch.float64)
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
        noise = float((scores.double() - scores64).abs()[causal].max())
        sel, margins = select(scores64, cfg.index_topk)
        tf_sel = [tf_selection(c["out"][t], t) for t in range(T)]
        layers.append(dict(
            sel=sel, tf_sel=tf_sel, margins=margins, scores=scores, keys=keys, weights=weights,
            noise=noise, agree=(sel == tf_sel),
        ))
    index_margin = min(float(l["margins"].min()) for l in layers)
    return dict(logits=logits, hidden=hidden, routes=routes, route_margin=route_margin,
                flips=flips, decisions=decisions, layers=layers, index_margin=index_margin)


def draw_prompts(spec, model, vocab):
    """Random prompts (fixed seed), re-drawn while any routing or indexer decision is fragile."""
    for attempt in range(MAX_ATTEMPTS):
        g = torch.Generator().manual_seed(spec["seed"] * 100 + attempt)
        prompts = [torch.randint(0, vocab, (n,), generator=g, dtype=torch.int64) for n in PROMPT_LENS]
        results = [prompt_analysis(model, p) for p in prompts]
        rm = min(r["route_margin"] for r in results)
        im = min(r["index_margin"] for r in results)
        if rm >= mg.MIN_ROUTE_MARGIN and im >= MIN_INDEX_MARGIN:
            for r in results:
                for li, l in enumerate(r["layers"]):
                    assert l["agree"], f"indexer re-implementation disagrees at layer {li}"
            return prompts, results, attempt
        print(f"  prompts attempt {attempt}: route margin {rm:.2e}, index margin {im:.2e}, redrawing")
    raise RuntimeError("could not draw prompts with robust routing and index selection")


# ----------------------------------------------------------------------------------------
# Decode / cache checks
# ----------------------------------------------------------------------------------------


def decode_check(model, ids, full, full_sel):
    """make_golden.decode_check (token-by-token decode and a two-chunk prefill must reproduce the
    full forward) plus: the indexer selects the same causal keys in both."""
    L = model.config.num_hidden_layers
    T = ids.shape[0]
    cap = IndexerCapture(model)
    try:
        worst = mg.decode_check(model, ids, full)
    finally:
        cap.close()
    calls = cap.calls
    assert len(calls) == T * L + 2 * L, len(calls)
    sel_mismatch = 0
    for t in range(T):  # token-by-token: one call per layer per step, S = 1, keys 0..t
        for li in range(L):
            c = calls[t * L + li]
            assert c["layer"] == li and c["cached"] and c["out"].shape == (1, min(model.config.index_topk, t + 1))
            sel_mismatch += tf_selection(c["out"][0], t) != full_sel[li][t]
    half = T // 2
    for chunk, (start, stop) in enumerate(((0, half), (half, T))):
        for li in range(L):
            c = calls[T * L + chunk * L + li]
            assert c["layer"] == li
            for row, t in enumerate(range(start, stop)):
                sel_mismatch += tf_selection(c["out"][row], t) != full_sel[li][t]
    return worst, sel_mismatch


@torch.no_grad()
def cache_contents(model, ids):
    """Prefill with a DynamicCache and return what each layer stores."""
    cache = DynamicCache(config=model.config)
    model(input_ids=ids.unsqueeze(0), cache=cache, use_cache=True)
    out = []
    for layer in cache.layers:
        out.append(dict(kind=type(layer).__name__, latent=layer.keys[0, 0].clone(),
                        k_pe=layer.values[0, 0].clone(), index_keys=layer.indexer_keys[0].clone()))
    return out


# ----------------------------------------------------------------------------------------
# Main per fixture
# ----------------------------------------------------------------------------------------


def make_fixture(name, spec):
    print(f"== {name}")
    out_dir = os.path.join(OUT_DIR, name)
    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    model = build_model(spec)
    with tempfile.TemporaryDirectory() as tmp:
        cfg, tensors = mg.save_via_transformers(model, tmp)
    cfg = dict(cfg)
    cfg.pop("torch_dtype", None)
    cfg["dtype"] = "float32"
    mg.write_checkpoint(out_dir, cfg, tensors)

    ref, info = load_reference_model(out_dir)
    unexpected = sorted(info["unexpected_keys"])
    with torch.no_grad():
        rsd = ref.state_dict()
        for k, t in model.state_dict().items():
            if k in tensors:
                assert torch.equal(rsd[k].float(), tensors[k].float()), f"{name}: {k} not loaded as stored"
    c = ref.config
    H, D, K = c.index_n_heads, c.index_head_dim, c.index_topk

    prompts, results, attempt = draw_prompts(spec, ref, cfg["vocab_size"])
    twin = dense_v3_twin(ref, spec)
    sdpa, _ = load_reference_model(out_dir, attn="sdpa")
    out = {}
    meta_prompts = []
    decode_worst = 0.0
    flips = decisions = 0
    drop_rows = drop_keys = rows_total = self_not_selected = 0
    sparse_vs_dense = []
    for i, (p, r) in enumerate(zip(prompts, results)):
        logits = r["logits"]
        T = p.shape[0]
        out[f"prompt_{i}"] = p.clone()
        out[f"logits_full_{i}"] = logits.contiguous()
        full_sel = [l["sel"] for l in r["layers"]]
        d, mism = decode_check(ref, p, logits, full_sel)
        assert d < mg.DECODE_TOL, f"{name}: cached decode differs from full forward by {d}"
        assert mism == 0, f"{name}: decode selects different keys than the full forward ({mism} rows)"
        decode_worst = max(decode_worst, d)
        with torch.no_grad():
            dense = mg.full_forward(twin, p)
            d_sdpa = float((mg.full_forward(sdpa, p) - logits).abs().max())
        dd = float((dense - logits).abs().max())
        sparse_vs_dense.append(dd)
        flips += r["flips"]
        decisions += r["decisions"]
        per_layer = []
        for li, l in enumerate(r["layers"]):
            dr = sum(1 for t in range(T) if t + 1 > K)
            dk = sum(t + 1 - len(l["sel"][t]) for t in range(T))
            sn = sum(1 for t in range(T) if t + 1 > K and t not in l["sel"][t])
            drop_rows += dr
            drop_keys += dk
            rows_total += T
            self_not_selected += sn
            m = float(l["margins"].min())
            per_layer.append({
                "layer": li,
                "rows_dropping_keys": dr,
                "keys_dropped": dk,
                "rows_where_query_token_not_selected": sn,
                "min_index_margin": m if math.isfinite(m) else None,
                "f32_vs_f64_score_max_abs_diff": l["noise"],
            })
        meta_prompts.append({
            "len": int(T),
            "max_abs_logit": float(logits.abs().max()),
            "logits_rms": float(logits.pow(2).mean().sqrt()),
            "min_route_margin": r["route_margin"] if math.isfinite(r["route_margin"]) else None,
            "min_index_margin": r["index_margin"] if math.isfinite(r["index_margin"]) else None,
            "decode_vs_full_max_abs_diff": d,
            "decode_selection_mismatches": mism,
            "sdpa_vs_eager_max_abs_diff": d_sdpa,
            "dense_v3_vs_sparse_max_abs_logit_diff": dd,
            "indexer": per_layer,
        })
        # Selections: as a mask for every prompt; as sorted causal key indices (-1 padded) for
        # prompt 0.
        kk = min(K, T)
        idx = torch.full((c.num_hidden_layers, T, kk), -1, dtype=torch.int64)
        mask = torch.zeros((c.num_hidden_layers, T, T), dtype=torch.uint8)
        for li, l in enumerate(r["layers"]):
            for t in range(T):
                s = l["sel"][t]
                idx[li, t, : len(s)] = torch.tensor(s, dtype=torch.int64)
                mask[li, t, s] = 1
        out[f"index_mask_{i}"] = mask.contiguous()
        if i == 0:
            out["index_idx_0"] = idx.contiguous()
            out["hidden_0"] = r["hidden"].contiguous()
            routes = r["routes"]
            layers = sorted(routes)
            out["route_idx_0"] = torch.stack([routes[l][0] for l in layers]).to(torch.int64).contiguous()
            out["route_w_0"] = torch.stack([routes[l][1] for l in layers]).float().contiguous()
            moe_layers = layers
            causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
            out["index_scores_0"] = torch.stack(
                [l["scores"].masked_fill(~causal, 0.0) for l in r["layers"]]).float().contiguous()
            out["index_weights_0"] = torch.stack([l["weights"] for l in r["layers"]]).float().contiguous()
            cc = cache_contents(ref, p)
            for li, (l, cl) in enumerate(zip(r["layers"], cc)):
                assert cl["kind"] == "DynamicIndexedLayer", cl["kind"]
                kd = float((cl["index_keys"] - l["keys"]).abs().max())
                assert kd < 1e-5, f"{name}: cached indexer keys differ from the re-implementation by {kd}"
            out["index_keys_0"] = torch.stack([cl["index_keys"] for cl in cc]).float().contiguous()
            cache_layout = {
                "layer_class": cc[0]["kind"],
                "keys": f"[1, 1, T, kv_lora_rank={c.kv_lora_rank}] kv_a_layernorm(c_kv) (not roped)",
                "values": f"[1, 1, T, qk_rope_head_dim={c.qk_rope_head_dim}] roped k_pe",
                "indexer_keys": f"[1, T, index_head_dim={D}] k_norm(wk(x)) with RoPE on the first "
                                f"{c.qk_rope_head_dim} dims, dtype {str(cc[0]['index_keys'].dtype)}",
            }
    out["logits_rms"] = torch.tensor([m["logits_rms"] for m in meta_prompts], dtype=torch.float32)
    inv_freq, attn_factor, softmax_scale = mg.rope_facts(ref)
    out["rope_inv_freq"] = inv_freq

    d = float((mg.full_forward(model, prompts[0]) - out["logits_full_0"]).abs().max())
    assert d < 1e-5, f"{name}: reloaded model differs from the generated one by {d}"
    max_abs = max(m["max_abs_logit"] for m in meta_prompts)
    tol_abs = max(5e-4, 1e-4 * max_abs)
    if spec["expect_drops"]:
        assert drop_rows > 0
        assert max(sparse_vs_dense) > 100 * tol_abs, \
            f"{name}: sparse selection barely changes logits ({max(sparse_vs_dense)})"
    else:
        assert drop_rows == 0
        assert max(sparse_vs_dense) < 1e-5, f"{name}: index_topk >= T but differs from dense V3"
    assert flips > 0, f"{name}: bias does not change routing"

    meta = {
        "fixture": name,
        "architecture": cfg.get("architectures", [None])[0],
        "generated_by": "tools/golden/make_golden_v32.py",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "seed": spec["seed"],
        "prompt_seed_attempt": attempt,
        "weight_storage": "f32",
        "config_spelling": "transformers-5 (rope_parameters; no rope_interleave key: V3.2 MLA rope is "
                           "always interleaved, the indexer's never)",
        "tensors_written_by_transformers": len(tensors),
        "lm_head_in_file": "lm_head.weight" in tensors,
        "unexpected_keys_on_transformers_load": unexpected,
        "prompts": meta_prompts,
        "prompt_dtype": "int64",
        "max_abs_logit": max_abs,
        "decode_vs_full_max_abs_diff": decode_worst,
        "min_route_margin": min((m["min_route_margin"] for m in meta_prompts
                                 if m["min_route_margin"] is not None), default=None),
        "min_index_margin": min((m["min_index_margin"] for m in meta_prompts
                                 if m["min_index_margin"] is not None), default=None),
        "min_index_margin_required": MIN_INDEX_MARGIN,
        "moe_layers": moe_layers,
        "softmax_scale": softmax_scale,
        "softmax_scale_unscaled": (cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]) ** -0.5,
        "rope_attention_factor": attn_factor,
        "indexer": {
            "index_topk": K,
            "index_n_heads": H,
            "index_head_dim": D,
            "rope_dims": f"first {c.qk_rope_head_dim} of each index head / key, half-split (rotate_half)",
            "score_scale": D ** -0.5,
            "head_weight_scale": H ** -0.5,
            "k_norm": "LayerNorm(index_head_dim, eps=1e-6, weight + bias)",
            "selection_rows_dropping_keys": drop_rows,
            "selection_rows_total": rows_total,
            "keys_dropped_total": drop_keys,
            "rows_where_query_token_not_selected": self_not_selected,
            "sparse_vs_dense_v3_max_abs_logit_diff": max(sparse_vs_dense),
            "cache": cache_layout,
        },
        "suggested_tolerance": {
            "logits_max_abs_diff": tol_abs,
            "argmax_must_match": True,
            "index_selection_must_match": True,
            "note": "fp32 engine vs this fp32 reference; every indexer top-k boundary has a margin "
                    ">= min_index_margin_required, so an f32 engine must select exactly the keys of "
                    "index_mask_i (index_idx_0 for prompt 0)",
        },
        "bias_routing_flips": {"changed_decisions": flips, "total_decisions": decisions},
        "reference_tensors": {k: {"dtype": str(v.dtype).replace("torch.", ""), "shape": list(v.shape)}
                              for k, v in sorted(out.items())},
    }
    save_file(out, os.path.join(out_dir, "reference.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "reference.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    for fn in os.listdir(out_dir):
        os.chmod(os.path.join(out_dir, fn), 0o644)
    size = sum(os.path.getsize(os.path.join(out_dir, fn)) for fn in os.listdir(out_dir))
    assert size < MAX_FIXTURE_BYTES, f"{name}: {size} bytes"
    print(f"  max|logit| {max_abs:.3f}  decode diff {decode_worst:.2e}  route margin "
          f"{meta['min_route_margin']:.2e}  index margin {meta['min_index_margin']}  "
          f"drop rows {drop_rows}/{rows_total} (keys dropped {drop_keys}, self not selected "
          f"{self_not_selected})  sparse-vs-dense {max(sparse_vs_dense):.3e}  "
          f"sdpa {max(m['sdpa_vs_eager_max_abs_diff'] for m in meta_prompts):.1e}  "
          f"bias flips {flips}/{decisions}  size {size / 1024:.0f} KiB")
    return meta


def main(argv):
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    names = argv or list(SPECS)
    os.makedirs(OUT_DIR, exist_ok=True)
    for n in names:
        make_fixture(n, SPECS[n])


if __name__ == "__main__":
    np.random.seed(0)
    main(sys.argv[1:])
