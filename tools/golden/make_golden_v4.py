#!/usr/bin/env python3
"""Generate the DeepSeek-V4 golden fixtures models/golden/v4_*/.

A tiny RANDOM DeepseekV4ForCausalLM (transformers 5.24, CPU, float32, eager) per spec, written
with save_pretrained, reloaded with from_pretrained, and its full-forward logits recorded per
prompt. Prompts are re-drawn until no routing top-k and no indexer top-k decision is a near-tie
(MIN_MARGIN), so an f32 engine must make the same discrete choices. Every fixture is also checked
here: cached token-by-token decode and a chunked prefill (split inside a compression window)
agree with the full forward (DECODE_TOL). `v4_mixed_official` holds the weights of `v4_mixed`
under the official DeepSeek naming (`embed`, `layers.N.attn.kv_norm`, `hc_head_fn`, int32
`tid2eid`, no `model.` prefix); transformers loads it through its conversion mapping and must
give the same logits, which this script checks.

`v4_mixed_official` also carries a random MTP layer (`mtp.0.*`, the official naming, in a second
shard `mtp.safetensors` + `model.safetensors.index.json`; transformers ignores `mtp.*` and still
loads the directory with unchanged logits, checked here) and `mtp_reference.safetensors`: the
MTP layer's logits per prompt position j (input token t_{j+1}, the target's residual streams at j
before its hyper head, embedding zeroed at position 0) computed as DeepSeek's `MTPBlock` (V4
inference/model.py) and vLLM's `deepseek_v4_mtp.py` run it, with transformers' own V4 decoder
block (built as layer `num_hidden_layers` of an extended config whose extra layer is sliding
attention with top-k MoE: the official config's last `compress_ratios` entry is 0). transformers
has no V4 MTP, so this hand-written wrapper is the reference.

Run by hand (not in CI), from the repository root:

    python tools/golden/make_golden_v4.py            # all V4 fixtures
    python tools/golden/make_golden_v4.py v4_tied    # selected

models/golden/V4.md documents the formulas and tensors these files rely on.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import tempfile

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM
from transformers.cache_utils import DynamicCache
from transformers.models.deepseek_v4 import modeling_deepseek_v4 as mv4

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT_DIR = os.path.join(ROOT, "models", "golden")
PROMPT_LENS = (64, 37, 9)
MIN_MARGIN = 2e-4
DECODE_TOL = 3e-5
MAX_ATTEMPTS = 300
MAX_FIXTURE_BYTES = 700_000

_BASE = dict(
    vocab_size=128, hidden_size=32, moe_intermediate_size=16, num_attention_heads=4,
    num_key_value_heads=1, head_dim=16, q_lora_rank=24, num_experts_per_tok=2, n_routed_experts=8,
    n_shared_experts=1, hc_sinkhorn_iters=20, o_groups=2, o_lora_rank=8, index_n_heads=8,
    index_head_dim=16, partial_rotary_factor=0.5, max_position_embeddings=512, rms_norm_eps=1e-6,
    bos_token_id=0, eos_token_id=1, pad_token_id=None, swiglu_limit=10.0,
)

SPECS = {
    # every layer type, hash + top-k MoE, hc_mult 2, untied, sqrtsoftplus
    "v4_mixed": dict(seed=4101, cfg=dict(
        num_hidden_layers=4, hc_mult=2, sliding_window=8, index_topk=3,
        layer_types=["heavily_compressed_attention", "compressed_sparse_attention",
                     "sliding_attention", "compressed_sparse_attention"],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
        mlp_layer_types=["hash_moe", "moe", "moe", "moe"], tie_word_embeddings=False)),
    # tied embeddings, hc_mult 3, YaRN on the compressed branch, rate 2 CSA, two hash layers,
    # a low swiglu_limit so the clamps bite
    "v4_tied": dict(seed=4102, cfg=dict(
        num_hidden_layers=3, hc_mult=3, sliding_window=6, index_topk=5,
        layer_types=["compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"],
        compress_rates={"compressed_sparse_attention": 2, "heavily_compressed_attention": 16},
        mlp_layer_types=["hash_moe", "hash_moe", "moe"], tie_word_embeddings=True, swiglu_limit=0.6,
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128,
                         "beta_fast": 32.0, "beta_slow": 1.0},
        hc_sinkhorn_iters=7, o_groups=4, o_lora_rank=4)),
    # legacy spellings: compress_ratios, num_hash_layers, qk_rope_head_dim; sigmoid scoring
    "v4_legacy": dict(seed=4103, legacy=True, cfg=dict(
        num_hidden_layers=3, hc_mult=2, sliding_window=10, index_topk=2, scoring_func="sigmoid",
        compress_ratios=[4, 0, 128], compress_rate_hca=8, num_hash_layers=1, qk_rope_head_dim=4,
        tie_word_embeddings=False)),
    # sliding-window layers only: the hybrid-SWA draft shape
    "v4_sliding": dict(seed=4104, cfg=dict(
        num_hidden_layers=2, hc_mult=2, sliding_window=5, index_topk=4,
        layer_types=["sliding_attention", "sliding_attention"],
        mlp_layer_types=["hash_moe", "moe"], tie_word_embeddings=False)),
}
OFFICIAL_TWIN = {"v4_mixed_official": "v4_mixed"}
# The official checkpoint's storage: fp8 e4m3 block-128 linears with ue8m0 (power-of-two) scales,
# fp4 e2m1 routed experts (two per byte, low nibble first) with ue8m0 scales per 32 columns.
QUANT_TWIN = {"v4_official_fp8": "v4_mixed"}
FP8_LINEARS = (".attn.wq_a.weight", ".attn.wq_b.weight", ".attn.wkv.weight", ".attn.wo_a.weight",
               ".attn.wo_b.weight", ".attn.indexer.wq_b.weight", ".shared_experts.w1.weight",
               ".shared_experts.w2.weight", ".shared_experts.w3.weight")
FP4_LUT = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def build(spec):
    kw = dict(_BASE)
    kw.update(spec["cfg"])
    if spec.get("legacy"):
        kw.pop("partial_rotary_factor")
    cfg = DeepseekV4Config(**kw)
    cfg._attn_implementation = "eager"
    torch.manual_seed(spec["seed"])
    return DeepseekV4ForCausalLM(cfg).eval()


def init_random(model, seed):
    gen = torch.Generator().manual_seed(seed)
    cfg = model.config
    h = cfg.hidden_size
    tied = bool(cfg.tie_word_embeddings)
    r = lambda shape: torch.randn(shape, generator=gen)  # noqa: E731
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if name.endswith("embed_tokens.weight"):
                p.copy_(r(p.shape) * (2.0 / math.sqrt(h) if tied else 1.0))
            elif name == "lm_head.weight":
                p.copy_(r(p.shape) * (2.0 / math.sqrt(h)))
            elif name.endswith("sinks"):
                p.copy_(r(p.shape) * 1.0)
            elif name.endswith("position_bias"):
                p.copy_(r(p.shape) * 0.7)
            elif name.endswith("_hc.base") or name.endswith("hc_base"):
                p.copy_(r(p.shape) * 0.7)
            elif name.endswith("_hc.scale") or name.endswith("hc_scale"):
                p.copy_(1.0 + 0.3 * r(p.shape))
            elif name.endswith("_hc.fn") or name.endswith("hc_fn"):
                p.copy_(r(p.shape) * (2.0 / math.sqrt(p.shape[-1])))
            elif "norm" in name:
                p.copy_(1.0 + 0.2 * r(p.shape))
            elif name.endswith("mlp.gate.weight"):
                p.copy_(r(p.shape) * (1.5 / math.sqrt(h)))
            elif p.ndim == 3:  # experts [E, out, in]
                p.copy_(r(p.shape) * (1.0 / math.sqrt(p.shape[-1])))
            else:
                gain = 1.5 if ("q_" in name or "kv_proj" in name) else 1.0
                p.copy_(r(p.shape) * (gain / math.sqrt(p.shape[-1])))
        for name, b in model.named_buffers():
            if name.endswith("tid2eid"):
                # distinct experts per token
                rows = [torch.randperm(cfg.n_routed_experts, generator=gen)[: b.shape[1]] for _ in range(b.shape[0])]
                b.copy_(torch.stack(rows))
            elif name.endswith("e_score_correction_bias"):
                b.copy_(r(b.shape) * 0.1)


class Recorder:
    """Captures routing and indexer scores to measure top-k margins."""

    def __init__(self):
        self.route, self.index = [], []
        self._orig_router = mv4.DeepseekV4TopKRouter.forward
        self._orig_scorer = mv4.DeepseekV4Indexer.forward
        rec = self

        def router(mod, hs):
            out = rec._orig_router(mod, hs)
            flat = hs.reshape(-1, mod.hidden_dim)
            s = mod.score_fn(torch.nn.functional.linear(flat, mod.weight)) + mod.e_score_correction_bias
            rec.route.append((s.detach().double(), mod.top_k))
            return out

        def indexer(mod, hidden_states, q_residual, position_ids, cache, layer_idx):
            orig_scorer = mod.scorer.forward

            def scorer(q, ckv, hs):
                sc = orig_scorer(q, ckv, hs)
                rec.index.append((sc.detach().double(), position_ids.detach(), mod.compress_rate, mod.index_topk))
                return sc

            mod.scorer.forward = scorer
            try:
                return rec._orig_scorer(mod, hidden_states, q_residual, position_ids, cache, layer_idx)
            finally:
                mod.scorer.forward = orig_scorer

        mv4.DeepseekV4TopKRouter.forward = router
        mv4.DeepseekV4Indexer.forward = indexer

    def close(self):
        mv4.DeepseekV4TopKRouter.forward = self._orig_router
        mv4.DeepseekV4Indexer.forward = self._orig_scorer

    def margins(self):
        route = math.inf
        for s, k in self.route:
            top = s.sort(-1, descending=True).values
            if top.shape[-1] > k:
                route = min(route, float((top[:, k - 1] - top[:, k]).min()))
        index, selective = math.inf, 0
        for sc, pos, m, k in self.index:
            sc = sc[0]
            for t in range(sc.shape[0]):
                valid = (int(pos[0, t]) + 1) // m
                if valid > k:
                    selective += 1
                    top = sc[t, :valid].sort(descending=True).values
                    index = min(index, float(top[k - 1] - top[k]))
        return route, index, selective


def draw_prompts(model, spec):
    gen = torch.Generator().manual_seed(spec["seed"] + 7)
    vocab = model.config.vocab_size
    for attempt in range(MAX_ATTEMPTS):
        prompts = [torch.randint(2, vocab, (n,), generator=gen) for n in PROMPT_LENS]
        rec = Recorder()
        try:
            with torch.no_grad():
                for p in prompts:
                    model(p[None])
        finally:
            rec.close()
        route, index, selective = rec.margins()
        if route >= MIN_MARGIN and index >= MIN_MARGIN:
            return prompts, attempt, route, index, selective
    raise SystemExit(f"no prompt set with margins >= {MIN_MARGIN}")


def cached_checks(model, ids, full):
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        dec = torch.cat([model(ids[None, i:i + 1], cache=cache, use_cache=True).logits[0]
                         for i in range(len(ids))])
        cache = DynamicCache(config=model.config)
        cut = min(len(ids) - 1, 13)  # inside a compression window for every rate used
        a = model(ids[None, :cut], cache=cache, use_cache=True).logits[0]
        b = model(ids[None, cut:], cache=cache, use_cache=True).logits[0]
    return float((dec - full).abs().max()), float((torch.cat([a, b]) - full).abs().max())


def to_official(tensors):
    out = {}
    for k, v in tensors.items():
        if k == "model.embed_tokens.weight":
            k = "embed.weight"
        elif k == "model.norm.weight":
            k = "norm.weight"
        elif k.startswith("model.hc_head.hc_"):
            k = "hc_head_" + k[len("model.hc_head.hc_"):]
        elif k.startswith("model."):
            k = k[len("model."):]
        k = k.replace(".attn.norm.", ".attn.kv_norm.")
        if k.endswith("tid2eid"):
            v = v.to(torch.int32)
        out[k] = v.contiguous()
    return out


LEGACY_DROP = ("layer_types", "mlp_layer_types", "compress_rates", "partial_rotary_factor", "rope_parameters",
               "qk_rope_head_dim")


def write_legacy_config(out, spec):
    """The config.json of older V4 checkpoints: compress_ratios (0/4/128 per layer),
    compress_rate_csa / compress_rate_hca, num_hash_layers and qk_rope_head_dim instead of the
    transformers-5 fields. transformers folds them in at load time."""
    path = os.path.join(out, "config.json")
    cfg = json.load(open(path))
    for k in LEGACY_DROP:
        cfg.pop(k, None)
    for k in ("compress_ratios", "compress_rate_hca", "num_hash_layers", "qk_rope_head_dim"):
        cfg[k] = spec["cfg"][k]
    json.dump(cfg, open(path, "w"), indent=2)


def make(name, spec):
    model = build(spec)
    init_random(model, spec["seed"])
    out = os.path.join(OUT_DIR, name)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        model = DeepseekV4ForCausalLM.from_pretrained(tmp, attn_implementation="eager").eval()
        prompts, attempt, route_m, index_m, selective = draw_prompts(model, spec)
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        shutil.copy(os.path.join(tmp, "config.json"), out)
        shutil.copy(os.path.join(tmp, "model.safetensors"), out)
    if spec.get("legacy"):
        write_legacy_config(out, spec)
        model = DeepseekV4ForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    ref, meta_prompts = {}, []
    with torch.no_grad():
        for i, p in enumerate(prompts):
            full = model(p[None]).logits[0]
            dec, chunk = cached_checks(model, p, full)
            assert dec < DECODE_TOL and chunk < DECODE_TOL, (name, i, dec, chunk)
            ref[f"prompt_{i}"] = p.to(torch.int64)
            ref[f"logits_full_{i}"] = full.float().contiguous()
            meta_prompts.append(dict(len=len(p), max_abs_logit=float(full.abs().max()),
                                     decode_vs_full_max_abs_diff=dec, chunked_vs_full_max_abs_diff=chunk))
    save_file(ref, os.path.join(out, "reference.safetensors"))
    meta = dict(fixture=name, architecture="DeepseekV4ForCausalLM", generated_by="tools/golden/make_golden_v4.py",
                versions=dict(torch=torch.__version__, transformers=transformers.__version__),
                seed=spec["seed"], prompt_seed_attempt=attempt, naming="transformers save_pretrained",
                min_route_margin=route_m, min_index_margin=index_m, indexer_rows_selecting=selective,
                prompts=meta_prompts)
    json.dump(meta, open(os.path.join(out, "reference.json"), "w"), indent=2)
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    assert size < MAX_FIXTURE_BYTES, (name, size)
    print(f"{name}: attempt {attempt}, route margin {route_m:.2e}, index margin {index_m:.2e} "
          f"({selective} selective rows), {size} bytes")


def make_official(name, src):
    sdir, out = os.path.join(OUT_DIR, src), os.path.join(OUT_DIR, name)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    for f in ("config.json", "reference.safetensors"):
        shutil.copy(os.path.join(sdir, f), out)
    save_file(to_official(load_file(os.path.join(sdir, "model.safetensors"))), os.path.join(out, "model.safetensors"),
              metadata={"format": "pt"})
    model = DeepseekV4ForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    ref = load_file(os.path.join(out, "reference.safetensors"))
    worst = 0.0
    with torch.no_grad():
        for i in range(len(PROMPT_LENS)):
            worst = max(worst, float((model(ref[f"prompt_{i}"][None]).logits[0] - ref[f"logits_full_{i}"]).abs().max()))
    assert worst == 0.0, worst
    meta = json.load(open(os.path.join(sdir, "reference.json")))
    meta.update(fixture=name, naming=f"official DeepSeek (weights of {src}); transformers loads it bitwise equal")
    json.dump(meta, open(os.path.join(out, "reference.json"), "w"), indent=2)
    print(f"{name}: official naming of {src}, transformers logits identical")


def ue8m0(amax, qmax):
    """Power-of-two scale >= amax / qmax (ue8m0 rounds up), as a float32 tensor."""
    return torch.exp2(torch.ceil(torch.log2(torch.clamp(amax / qmax, min=2.0 ** -126))))


def quant_fp8(w, block=128):
    r, c = w.shape
    sr, sc = -(-r // block), -(-c // block)
    scale = torch.empty(sr, sc)
    q = torch.empty(r, c, dtype=torch.float8_e4m3fn)
    deq = torch.empty(r, c)
    for i in range(sr):
        for j in range(sc):
            blk = w[i * block:(i + 1) * block, j * block:(j + 1) * block]
            s_ = ue8m0(blk.abs().max(), 448.0)
            qb = (blk / s_).to(torch.float8_e4m3fn)
            scale[i, j] = s_
            q[i * block:(i + 1) * block, j * block:(j + 1) * block] = qb
            deq[i * block:(i + 1) * block, j * block:(j + 1) * block] = qb.float() * s_
    return q, scale.to(torch.float8_e8m0fnu), deq


def quant_fp4(w, gran=32):
    r, c = w.shape
    assert c % 2 == 0
    sc = -(-c // gran)
    bn = c // sc
    assert bn * sc == c
    scale = ue8m0(w.reshape(r, sc, bn).abs().amax(-1), 6.0)  # [r, sc]
    x = w / scale.repeat_interleave(bn, dim=1)
    idx = (x[..., None] - FP4_LUT).abs().argmin(-1)  # nearest e2m1 (ties to the lower code)
    deq = FP4_LUT[idx] * scale.repeat_interleave(bn, dim=1)
    packed = (idx[:, 0::2] | (idx[:, 1::2] << 4)).to(torch.uint8).view(torch.int8)
    return packed, scale.to(torch.float8_e8m0fnu), deq


def make_quant(name, src):
    """Official naming + the official storage formats; the reference logits are transformers' on
    the dequantised weights (which the quantised values represent exactly)."""
    sdir, out = os.path.join(OUT_DIR, src), os.path.join(OUT_DIR, name)
    official = to_official(load_file(os.path.join(sdir, "model.safetensors")))
    stored, deq_official = {}, {}
    n8 = n4 = 0
    for k, v in official.items():
        base = k[: -len(".weight")] if k.endswith(".weight") else None
        if k.endswith(FP8_LINEARS):
            q, sc, d = quant_fp8(v.float())
            stored[k], stored[base + ".scale"], deq_official[k] = q, sc, d
            n8 += 1
        elif ".experts." in k and ".shared_experts." not in k:
            q, sc, d = quant_fp4(v.float())
            stored[k], stored[base + ".scale"], deq_official[k] = q, sc, d
            n4 += 1
        else:
            stored[k], deq_official[k] = v, v
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    cfg = json.load(open(os.path.join(sdir, "config.json")))
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": [128, 128], "scale_fmt": "ue8m0", "expert_dtype": "fp4"}
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)
    save_file({k: v.contiguous() for k, v in stored.items()}, os.path.join(out, "model.safetensors"),
              metadata={"format": "pt"})
    # reference: transformers on the dequantised weights (official naming, unquantised config)
    with tempfile.TemporaryDirectory() as tmp:
        plain = dict(cfg)
        plain.pop("quantization_config")
        json.dump(plain, open(os.path.join(tmp, "config.json"), "w"))
        save_file({k: v.contiguous() for k, v in deq_official.items()}, os.path.join(tmp, "model.safetensors"),
                  metadata={"format": "pt"})
        model = DeepseekV4ForCausalLM.from_pretrained(tmp, attn_implementation="eager").eval()
        src_ref = load_file(os.path.join(sdir, "reference.safetensors"))
        ref, worst = {}, 0.0
        with torch.no_grad():
            for i in range(len(PROMPT_LENS)):
                p = src_ref[f"prompt_{i}"]
                full = model(p[None]).logits[0]
                dec, chunk = cached_checks(model, p, full)
                assert dec < DECODE_TOL and chunk < DECODE_TOL, (name, i, dec, chunk)
                ref[f"prompt_{i}"] = p
                ref[f"logits_full_{i}"] = full.float().contiguous()
                worst = max(worst, float((full - src_ref[f"logits_full_{i}"]).abs().max()))
    save_file(ref, os.path.join(out, "reference.safetensors"))
    meta = json.load(open(os.path.join(sdir, "reference.json")))
    meta.update(fixture=name, naming=f"official DeepSeek, weights of {src} stored as the official checkpoint "
                f"stores them: {n8} fp8 e4m3 block-128 linears, {n4} fp4 e2m1 experts (ue8m0 scales); reference "
                "= transformers on the dequantised weights", quantisation_vs_bf16_max_abs_logit_diff=worst)
    json.dump(meta, open(os.path.join(out, "reference.json"), "w"), indent=2)
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    print(f"{name}: {n8} fp8 + {n4} fp4 tensors, {size} bytes, logits moved {worst:.3f} by quantisation")


MTP_SHARD = {"v4_mixed_official": dict(seed=4111)}
MTP_TYPE = "sliding_attention"


def rms(x, w, eps):
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def mtp_logits(target, ext, p, prm):
    """The MTP layer's (logits, output streams) at positions 0..T-2 of prompt p (see the module
    doc); the output streams are what a chained draft feeds back as its hidden state."""
    cfg = target.config
    n, eps = cfg.num_hidden_layers, cfg.rms_norm_eps
    seen = {}
    hook = target.model.hc_head.register_forward_pre_hook(lambda mod, args: seen.update(x=args[0]))
    try:
        target(p[None])
    finally:
        hook.remove()
    streams = seen["x"]  # [1, T, N, D], before the hyper head
    t1 = len(p) - 1
    tok = p[1:][None]
    pos = torch.arange(t1)[None]
    e = target.model.embed_tokens(tok).clone()
    e[:, 0] = 0.0  # position 0
    x = (torch.nn.functional.linear(rms(e, prm["enorm.weight"], eps), prm["e_proj.weight"])[:, :, None, :]
         + torch.nn.functional.linear(rms(streams[:, :t1], prm["hnorm.weight"], eps), prm["h_proj.weight"]))
    m = ext.model
    cache = DynamicCache(config=ext.config)
    mask = mv4.create_sliding_window_causal_mask(config=ext.config, inputs_embeds=e, attention_mask=None,
                                                 cache=cache, position_ids=pos)
    pe = {k: m.rotary_emb(e, position_ids=pos, layer_type=k) for k in ("main", "compress")}
    out = m.layers[n](x, position_embeddings=pe, position_ids=pos, attention_mask=mask, input_ids=None,
                      cache=cache)
    flat = out.flatten(2).float()
    flat = flat * torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + eps)
    mixes = torch.nn.functional.linear(flat, prm["hc_head_fn"])
    pre = torch.sigmoid(mixes * prm["hc_head_scale"] + prm["hc_head_base"]) + cfg.hc_eps
    col = (pre.unsqueeze(-1) * out).sum(dim=2)
    logits = torch.nn.functional.linear(rms(col, prm["norm.weight"], eps), target.lm_head.weight)[0]
    return logits, out[0].flatten(1)


def official_layer_names(tensors, layer, prefix):
    out = {}
    for k, v in tensors.items():
        if k.startswith(f"model.layers.{layer}."):
            out[prefix + k[len(f"model.layers.{layer}."):].replace("attn.norm.", "attn.kv_norm.")] = v
    return out


def add_mtp(name, spec):
    out = os.path.join(OUT_DIR, name)
    for f in ("mtp.safetensors", "model.safetensors.index.json", "mtp_reference.safetensors"):
        if os.path.exists(os.path.join(out, f)):
            os.remove(os.path.join(out, f))
    target = DeepseekV4ForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    cfg = target.config
    n, h, nh = cfg.num_hidden_layers, cfg.hidden_size, cfg.hc_mult
    ref = load_file(os.path.join(out, "reference.safetensors"))
    prompts = [ref[f"prompt_{i}"] for i in range(len(PROMPT_LENS))]
    for attempt in range(MAX_ATTEMPTS):
        seed = spec["seed"] + 1000 * attempt
        ecfg = DeepseekV4Config(**{**cfg.to_dict(), "num_hidden_layers": n + 1,
                                   "layer_types": list(cfg.layer_types) + [MTP_TYPE],
                                   "mlp_layer_types": list(cfg.mlp_layer_types) + ["moe"]})
        ecfg._attn_implementation = "eager"
        ext = DeepseekV4ForCausalLM(ecfg).eval()
        init_random(ext, seed)
        with tempfile.TemporaryDirectory() as tmp:
            ext.save_pretrained(tmp, safe_serialization=True)
            block = official_layer_names(load_file(os.path.join(tmp, "model.safetensors")), n, "mtp.0.")
        gen = torch.Generator().manual_seed(seed + 1)
        r = lambda shape: torch.randn(shape, generator=gen)  # noqa: E731
        prm = {"enorm.weight": 1.0 + 0.2 * r(h), "hnorm.weight": 1.0 + 0.2 * r(h), "norm.weight": 1.0 + 0.2 * r(h),
               "e_proj.weight": r((h, h)) / math.sqrt(h), "h_proj.weight": r((h, h)) / math.sqrt(h),
               "hc_head_fn": r((nh, nh * h)) * (2.0 / math.sqrt(nh * h)), "hc_head_base": r(nh) * 0.7,
               "hc_head_scale": 1.0 + 0.3 * r(1)}
        rec = Recorder()
        try:
            with torch.no_grad():
                logits, streams = zip(*[mtp_logits(target, ext, p, prm) for p in prompts])
        finally:
            rec.close()
        route = math.inf
        for sc, k in rec.route:  # the target's routers and the MTP block's
            top = sc.sort(-1, descending=True).values
            route = min(route, float((top[:, k - 1] - top[:, k]).min()))
        if route >= MIN_MARGIN:
            break
    else:
        raise SystemExit(f"{name}: no MTP draw with routing margin >= {MIN_MARGIN}")
    mtp = {**block, **{"mtp.0." + k: v.contiguous() for k, v in prm.items()}}
    save_file({k: v.contiguous() for k, v in mtp.items()}, os.path.join(out, "mtp.safetensors"),
              metadata={"format": "pt"})
    main_names = list(load_file(os.path.join(out, "model.safetensors")))
    total = sum(os.path.getsize(os.path.join(out, f)) for f in ("model.safetensors", "mtp.safetensors"))
    index = {"metadata": {"total_size": total},
             "weight_map": {**{k: "model.safetensors" for k in sorted(main_names)},
                            **{k: "mtp.safetensors" for k in sorted(mtp)}}}
    json.dump(index, open(os.path.join(out, "model.safetensors.index.json"), "w"), indent=1)
    save_file({**{f"prompt_{i}": p for i, p in enumerate(prompts)},
               **{f"mtp_logits_{i}": lg.float().contiguous() for i, lg in enumerate(logits)},
               **{f"mtp_streams_{i}": x.float().contiguous() for i, x in enumerate(streams)}},
              os.path.join(out, "mtp_reference.safetensors"))
    # transformers still loads the directory (index + two shards) and ignores mtp.*
    again = DeepseekV4ForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    with torch.no_grad():
        worst = max(float((again(p[None]).logits[0] - ref[f"logits_full_{i}"]).abs().max())
                    for i, p in enumerate(prompts))
    assert worst == 0.0, worst
    meta = json.load(open(os.path.join(out, "reference.json")))
    meta["mtp"] = dict(seed=seed, attempt=attempt, layer_type=MTP_TYPE, mlp_type="moe", min_route_margin=route,
                       tensors=len(mtp), max_abs_logit=max(float(lg.abs().max()) for lg in logits),
                       reference="mtp_reference.safetensors: mtp_logits_i [len(prompt_i) - 1, vocab], "
                       "mtp_streams_i [len(prompt_i) - 1, hc_mult * hidden] (the block's output streams)")
    json.dump(meta, open(os.path.join(out, "reference.json"), "w"), indent=2)
    print(f"{name}: MTP layer ({len(mtp)} tensors, attempt {attempt}, route margin {route:.2e}); "
          f"transformers still loads it with identical logits")


def main(argv):
    names = argv or list(SPECS) + list(OFFICIAL_TWIN) + list(QUANT_TWIN)
    for n in names:
        if n in SPECS:
            make(n, SPECS[n])
        elif n in OFFICIAL_TWIN:
            make_official(n, OFFICIAL_TWIN[n])
            if n in MTP_SHARD:
                add_mtp(n, MTP_SHARD[n])
        else:
            make_quant(n, QUANT_TWIN[n])


if __name__ == "__main__":
    main(sys.argv[1:])
