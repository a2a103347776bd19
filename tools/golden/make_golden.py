#!/usr/bin/env python3
"""Generate the golden-logit fixtures under models/golden/.

Each fixture is a tiny RANDOM DeepSeek-V2/V3 checkpoint (config.json + model.safetensors)
written through transformers, plus reference outputs computed in fp32 by transformers
(reference.safetensors + reference.json). The Rust tests read these files; the README in
models/golden/ documents every tensor and every formula they rely on.

Run by hand (not in CI), from the repository root:

    python tools/golden/make_golden.py            # all fixtures
    python tools/golden/make_golden.py v3_yarn    # selected fixtures

Everything is seeded; re-running with the pinned versions (requirements.txt) reproduces
the same files up to float summation order of the installed torch build.
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
import transformers
from safetensors.torch import load_file, save_file
from transformers import (
    DeepseekV2Config,
    DeepseekV2ForCausalLM,
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
)
from transformers.cache_utils import DynamicCache

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT_DIR = os.path.join(ROOT, "models", "golden")

PROMPT_LENS = (37, 21, 9)
# Decode-vs-full agreement the reference itself must reach (absolute, fp32).
DECODE_TOL = 3e-5
# Routing decisions closer than this (in score units) are considered fragile: a different
# summation order in the engine could flip them. Prompts are re-drawn until every decision
# in every prompt has at least this margin.
MIN_ROUTE_MARGIN = 2e-4

FP8_MAX = 448.0
BLOCK = 128

# ----------------------------------------------------------------------------------------
# Fixture specifications
# ----------------------------------------------------------------------------------------

# Common small MLA dims.
_MLA = dict(
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
    pretraining_tp=1,
)


def _yarn(theta, factor, mscale, mscale_all_dim, orig, beta_fast=32, beta_slow=1):
    return {
        "rope_type": "yarn",
        "rope_theta": theta,
        "factor": factor,
        "mscale": mscale,
        "mscale_all_dim": mscale_all_dim,
        "original_max_position_embeddings": orig,
        "beta_fast": beta_fast,
        "beta_slow": beta_slow,
    }


_V3_BASE = dict(
    _MLA,
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=24,
    num_hidden_layers=3,
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
    rope_parameters=_yarn(10000.0, 4.0, 1.0, 1.0, 16),
    rope_interleave=True,
    tie_word_embeddings=False,
    # Extra keys (transformers' V3 class hard-codes these; hub configs carry them).
    topk_method="noaux_tc",
    scoring_func="sigmoid",
    moe_layer_freq=1,
    num_nextn_predict_layers=0,
)

_V2_BASE = dict(
    _MLA,
    vocab_size=128,
    hidden_size=64,
    intermediate_size=64,
    moe_intermediate_size=24,
    num_hidden_layers=2,
    q_lora_rank=None,
    n_routed_experts=8,
    n_shared_experts=2,
    num_experts_per_tok=2,
    norm_topk_prob=False,
    routed_scaling_factor=1.0,
    first_k_dense_replace=1,
    max_position_embeddings=64,
    tie_word_embeddings=False,
    mlp_bias=False,
    scoring_func="softmax",
    moe_layer_freq=1,
    num_nextn_predict_layers=0,
)

SPECS = {
    "v3_yarn": dict(
        arch="v3",
        seed=1001,
        config=dict(_V3_BASE, num_nextn_predict_layers=1),
        bias_std=0.15,
        mtp=True,
        storage="f32",
    ),
    "v2_lite": dict(
        arch="v2",
        seed=1002,
        config=dict(
            _V2_BASE,
            topk_method="greedy",
            n_group=1,
            topk_group=1,
            rope_parameters=_yarn(10000.0, 4.0, 0.707, 0.707, 16),
        ),
        storage="f32",
    ),
    "v2_group_limited": dict(
        arch="v2",
        seed=1003,
        config=dict(
            _V2_BASE,
            topk_method="group_limited_greedy",
            n_group=4,
            topk_group=2,
            num_experts_per_tok=3,
            routed_scaling_factor=1.5,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
        storage="f32",
    ),
    "v3_tied": dict(
        arch="v3",
        seed=1004,
        config=dict(_V3_BASE, num_hidden_layers=2, tie_word_embeddings=True),
        bias_std=0.15,
        storage="f32",
        hub_spelling=True,
    ),
    "v3_fp8": dict(
        arch="v3",
        seed=1005,
        config=dict(
            _V3_BASE,
            num_hidden_layers=2,
            hidden_size=160,
            intermediate_size=320,
            moe_intermediate_size=48,
            q_lora_rank=48,
        ),
        bias_std=0.15,
        storage="fp8",
    ),
    "v3_dense3": dict(
        arch="v3",
        seed=1006,
        config=dict(
            _V3_BASE,
            num_hidden_layers=4,
            first_k_dense_replace=3,
            intermediate_size=64,
            # mscale != mscale_all_dim: cos/sin carry a factor != 1 here; beta_slow 0.25
            # puts a fractional value on the YaRN ramp (ramp = [0, 0.5, 1, 1]).
            rope_parameters=_yarn(10000.0, 4.0, 1.0, 0.5, 16, beta_fast=32, beta_slow=0.25),
        ),
        bias_std=0.15,
        storage="f32",
    ),
    # Compatibility cases (configs transformers loads that a strict reading would refuse):
    # YaRN `factor` used as given although max_position_embeddings / original (48 / 16 = 3)
    # differs, an explicit cos/sin `attention_factor`, and an unrounded correction range.
    "v3_yarn_capped": dict(
        arch="v3",
        seed=1007,
        config=dict(
            _V3_BASE,
            num_hidden_layers=2,
            max_position_embeddings=48,
            rope_parameters=dict(
                _yarn(10000.0, 4.0, 1.0, 1.0, 16, beta_fast=8, beta_slow=0.5),
                attention_factor=1.08,
                truncate=False,
            ),
        ),
        bias_std=0.15,
        storage="f32",
    ),
    # Every layer dense (first_k_dense_replace >= num_hidden_layers) while the MoE fields hold
    # values that would be invalid in a MoE model: transformers ignores them, so must we.
    "v3_dense_moe_fields": dict(
        arch="v3",
        seed=1008,
        config=dict(
            _V3_BASE,
            num_hidden_layers=2,
            first_k_dense_replace=2,
            n_group=3,
            topk_group=5,
            num_experts_per_tok=20,
        ),
        bias_std=0.15,
        storage="f32",
    ),
    # fp8 with some linears left in bf16 (quantization_config.modules_to_not_convert).
    "v3_fp8_partial": dict(
        arch="v3",
        seed=1009,
        config=dict(
            _V3_BASE,
            num_hidden_layers=2,
            hidden_size=160,
            intermediate_size=320,
            moe_intermediate_size=48,
            q_lora_rank=48,
        ),
        bias_std=0.15,
        storage="fp8",
        not_convert=[
            "lm_head",
            "model.layers.0.self_attn.kv_b_proj",
            "model.layers.0.mlp.down_proj",
            "model.layers.1.mlp.shared_experts",
            "model.layers.1.mlp.experts.3",
        ],
    ),
    "v3_bf16": dict(
        arch="v3",
        seed=1001,  # same weights as v3_yarn
        config=dict(_V3_BASE, num_nextn_predict_layers=1),
        bias_std=0.15,
        mtp=True,
        storage="bf16",
    ),
}

# ----------------------------------------------------------------------------------------
# Model construction
# ----------------------------------------------------------------------------------------


def build_model(spec):
    cfg_kwargs = copy.deepcopy(spec["config"])
    if spec["arch"] == "v3":
        config = DeepseekV3Config(**cfg_kwargs)
        cls = DeepseekV3ForCausalLM
    else:
        config = DeepseekV2Config(**cfg_kwargs)
        cls = DeepseekV2ForCausalLM
    config._attn_implementation = "eager"
    torch.manual_seed(spec["seed"])
    model = cls(config).float().eval()
    init_random(model, spec)
    return model


def init_random(model, spec):
    """Seeded random weights with O(1) activations, non-uniform attention, O(1-10) logits."""
    gen = torch.Generator().manual_seed(spec["seed"])
    cfg = model.config
    h = cfg.hidden_size
    tied = bool(cfg.tie_word_embeddings)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if name.endswith("embed_tokens.weight"):
                std = 2.0 / math.sqrt(h) if tied else 1.0
                p.copy_(torch.randn(p.shape, generator=gen) * std)
            elif name == "lm_head.weight":
                p.copy_(torch.randn(p.shape, generator=gen) * (2.0 / math.sqrt(h)))
            elif "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith("mlp.gate.weight"):
                p.copy_(torch.randn(p.shape, generator=gen) * (1.5 / math.sqrt(h)))
            else:
                fan_in = p.shape[-1]
                gain = 1.5 if ("q_" in name or "kv_a" in name or "kv_b" in name) else 1.0
                p.copy_(torch.randn(p.shape, generator=gen) * (gain / math.sqrt(fan_in)))
        if spec["arch"] == "v3":
            for layer in model.model.layers:
                gate = getattr(layer.mlp, "gate", None)
                if gate is not None and hasattr(gate, "e_score_correction_bias"):
                    b = torch.randn(gate.e_score_correction_bias.shape, generator=gen) * spec["bias_std"]
                    gate.e_score_correction_bias.copy_(b)
    if tied:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


# ----------------------------------------------------------------------------------------
# Checkpoint writing
# ----------------------------------------------------------------------------------------


def save_via_transformers(model, tmp):
    model.save_pretrained(tmp, safe_serialization=True)
    with open(os.path.join(tmp, "config.json")) as f:
        cfg = json.load(f)
    tensors = load_file(os.path.join(tmp, "model.safetensors"))
    return cfg, tensors


def add_mtp(tensors, cfg, gen):
    """Random MTP module under model.layers.{num_hidden_layers} (V3 hub layout)."""
    n = cfg["num_hidden_layers"]
    h = cfg["hidden_size"]
    v = cfg["vocab_size"]
    src = f"model.layers.{n - 1}."
    dst = f"model.layers.{n}."
    extra = {}
    for name, t in tensors.items():
        if name.startswith(src):
            new = dst + name[len(src):]
            if "norm" in name:
                extra[new] = 1.0 + 0.2 * torch.randn(t.shape, generator=gen)
            elif name.endswith("e_score_correction_bias"):
                extra[new] = 0.15 * torch.randn(t.shape, generator=gen)
            else:
                extra[new] = torch.randn(t.shape, generator=gen) / math.sqrt(t.shape[-1])
    extra[dst + "embed_tokens.weight"] = torch.randn((v, h), generator=gen)
    extra[dst + "enorm.weight"] = 1.0 + 0.2 * torch.randn((h,), generator=gen)
    extra[dst + "hnorm.weight"] = 1.0 + 0.2 * torch.randn((h,), generator=gen)
    extra[dst + "eh_proj.weight"] = torch.randn((h, 2 * h), generator=gen) / math.sqrt(2 * h)
    extra[dst + "shared_head.norm.weight"] = 1.0 + 0.2 * torch.randn((h,), generator=gen)
    extra[dst + "shared_head.head.weight"] = torch.randn((v, h), generator=gen) * (2.0 / math.sqrt(h))
    out = dict(tensors)
    out.update({k: t.float().contiguous() for k, t in extra.items()})
    return out


QUANT_SUFFIXES = (
    "self_attn.q_a_proj.weight",
    "self_attn.q_b_proj.weight",
    "self_attn.q_proj.weight",
    "self_attn.kv_a_proj_with_mqa.weight",
    "self_attn.kv_b_proj.weight",
    "self_attn.o_proj.weight",
    "gate_proj.weight",
    "up_proj.weight",
    "down_proj.weight",
)


def is_quantised(name):
    return name.startswith("model.layers.") and name.endswith(QUANT_SUFFIXES)


def quantise_fp8(w):
    """Block-quantise [out, in] f32 -> (e4m3 [out, in], scale_inv f32 [ceil(out/128), ceil(in/128)])."""
    out_f, in_f = w.shape
    bo, bi = -(-out_f // BLOCK), -(-in_f // BLOCK)
    scale = torch.empty((bo, bi), dtype=torch.float32)
    q = torch.empty((out_f, in_f), dtype=torch.float8_e4m3fn)
    for i in range(bo):
        for j in range(bi):
            blk = w[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK]
            s = float(blk.abs().max()) / FP8_MAX
            s = s if s > 0 else 1.0
            scale[i, j] = s
            q[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK] = (blk / s).to(torch.float8_e4m3fn)
    return q, scale


def dequantise_fp8(q, scale_inv):
    """W[i, j] = f32(q[i, j]) * scale_inv[i // 128, j // 128] (one f32 multiply)."""
    out_f, in_f = q.shape
    s = scale_inv.repeat_interleave(BLOCK, 0)[:out_f].repeat_interleave(BLOCK, 1)[:, :in_f]
    return q.to(torch.float32) * s


def not_converted(name, modules):
    """Whether `name` belongs to a module listed in modules_to_not_convert."""
    return any(name == m or name.startswith(m + ".") for m in modules)


def to_storage(tensors, storage, not_convert=()):
    """Returns (stored tensors, f32 tensors the reference must use)."""
    if storage == "f32":
        return tensors, tensors
    if storage == "bf16":
        stored, ref = {}, {}
        for k, t in tensors.items():
            if k.endswith("e_score_correction_bias"):
                stored[k] = t.float()
            else:
                stored[k] = t.to(torch.bfloat16)
            ref[k] = stored[k].float()
        return stored, ref
    if storage == "fp8":
        stored, ref = {}, {}
        for k, t in tensors.items():
            if is_quantised(k) and not not_converted(k, not_convert):
                q, s = quantise_fp8(t.float())
                stored[k] = q
                stored[k + "_scale_inv"] = s
                ref[k] = dequantise_fp8(q, s)
            elif k.endswith("e_score_correction_bias"):
                stored[k] = t.float()
                ref[k] = stored[k]
            else:
                # Norms, embeddings, lm_head and router gate stay unquantised (bf16 as in the
                # official fp8 release).
                stored[k] = t.to(torch.bfloat16)
                ref[k] = stored[k].float()
        return stored, ref
    raise ValueError(storage)


def to_hub_spelling(cfg):
    """Rewrite transformers-5 rope spelling into the hub spelling (top-level rope_theta +
    rope_scaling with "type")."""
    rp = cfg.pop("rope_parameters")
    cfg.pop("rope_interleave", None)
    cfg["rope_theta"] = rp["rope_theta"]
    if rp["rope_type"] == "default":
        cfg["rope_scaling"] = None
    else:
        rs = {"type": rp["rope_type"]}
        for key in ("factor", "mscale", "mscale_all_dim", "original_max_position_embeddings",
                    "beta_fast", "beta_slow"):
            rs[key] = rp[key]
        cfg["rope_scaling"] = rs
    return cfg


def write_checkpoint(dirname, cfg, stored):
    os.makedirs(dirname, exist_ok=True)
    with open(os.path.join(dirname, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    save_file({k: v.contiguous() for k, v in sorted(stored.items())},
              os.path.join(dirname, "model.safetensors"), metadata={"format": "pt"})


def load_reference_model(spec, dirname):
    cls = DeepseekV3ForCausalLM if spec["arch"] == "v3" else DeepseekV2ForCausalLM
    model, info = cls.from_pretrained(dirname, dtype=torch.float32, output_loading_info=True,
                                      attn_implementation="eager")
    assert not info["missing_keys"], info["missing_keys"]
    assert not info.get("mismatched_keys"), info["mismatched_keys"]
    return model.eval(), info


# ----------------------------------------------------------------------------------------
# Router re-implementation (checked against transformers' own choices)
# ----------------------------------------------------------------------------------------


@torch.no_grad()
def route(arch, cfg, x, weight, bias=None, use_bias=True):
    """Returns (indices [T, k] sorted ascending, weights [T, k] aligned, margin [T])."""
    logits = x.float() @ weight.float().t()  # [T, E]
    E = logits.shape[1]
    k = cfg.num_experts_per_tok
    T = logits.shape[0]
    if arch == "v3":
        scores = logits.sigmoid()
        choice = scores + (bias if (use_bias and bias is not None) else 0.0)
        G, kg = cfg.n_group, cfg.topk_group
        grouped = choice.view(T, G, E // G)
        gscore = grouped.topk(min(2, E // G), dim=-1).values.sum(-1)  # [T, G]
    else:
        scores = logits.softmax(-1)
        choice = scores
        if cfg.topk_method == "group_limited_greedy":
            G, kg = cfg.n_group, cfg.topk_group
            gscore = scores.view(T, G, E // G).max(-1).values
        else:
            G, kg, gscore = 1, 1, None
    margins = torch.full((T,), float("inf"))
    if gscore is not None and kg < G:
        gs = gscore.sort(-1, descending=True).values
        margins = torch.minimum(margins, gs[:, kg - 1] - gs[:, kg])
        keep = torch.zeros_like(gscore, dtype=torch.bool)
        keep.scatter_(1, gscore.topk(kg, -1).indices, True)
        keep = keep.unsqueeze(-1).expand(T, G, E // G).reshape(T, E)
        choice = choice.masked_fill(~keep, float("-inf"))
    cs = choice.sort(-1, descending=True).values
    if k < E:
        nxt = cs[:, k]
        m = cs[:, k - 1] - torch.where(torch.isinf(nxt), torch.full_like(nxt, -1e9), nxt)
        margins = torch.minimum(margins, m)
    idx = choice.topk(k, -1).indices.sort(-1).values
    w = scores.gather(1, idx)
    if arch == "v3" and cfg.norm_topk_prob:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    w = w * cfg.routed_scaling_factor
    return idx, w, margins


# ----------------------------------------------------------------------------------------
# Reference computation
# ----------------------------------------------------------------------------------------


class Capture:
    """Hooks: residual stream after each layer, and router inputs/outputs."""

    def __init__(self, model):
        self.handles = []
        self.hidden = []
        self.routes = {}
        m = model.model
        self.handles.append(m.embed_tokens.register_forward_hook(
            lambda mod, inp, out: self.hidden.append(out.detach()[0].clone())))
        for li, layer in enumerate(m.layers):
            self.handles.append(layer.register_forward_hook(
                lambda mod, inp, out: self.hidden.append(
                    (out[0] if isinstance(out, tuple) else out).detach()[0].clone())))
            gate = getattr(layer.mlp, "gate", None)
            if gate is not None and not isinstance(gate, torch.nn.Linear):
                def hook(mod, inp, out, li=li):
                    self.routes[li] = (inp[0].detach().reshape(-1, inp[0].shape[-1]).clone(),
                                       out[2].detach().clone(), out[1].detach().clone())
                self.handles.append(gate.register_forward_hook(hook))

    def close(self):
        for h in self.handles:
            h.remove()


def full_forward(model, ids):
    with torch.no_grad():
        return model(input_ids=ids.unsqueeze(0), use_cache=False).logits[0].float()


def decode_check(model, ids, full):
    """Token-by-token cached decode and chunked prefill must reproduce the full forward."""
    worst = 0.0
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        for t in range(ids.shape[0]):
            out = model(input_ids=ids[t:t + 1].unsqueeze(0), cache=cache, use_cache=True).logits[0, -1]
            worst = max(worst, float((out - full[t]).abs().max()))
        cache = DynamicCache(config=model.config)
        half = ids.shape[0] // 2
        a = model(input_ids=ids[:half].unsqueeze(0), cache=cache, use_cache=True).logits[0]
        b = model(input_ids=ids[half:].unsqueeze(0), cache=cache, use_cache=True).logits[0]
        worst = max(worst, float((torch.cat([a, b]) - full).abs().max()))
    return worst


def prompt_routes(model, spec, ids):
    """Run one prompt under hooks; verify our router re-implementation; return details."""
    cap = Capture(model)
    try:
        logits = full_forward(model, ids)
    finally:
        cap.close()
    cfg = model.config
    per_layer = {}
    min_margin = float("inf")
    flips = 0
    decisions = 0
    for li in sorted(cap.routes):
        x, tf_idx, tf_w = cap.routes[li]
        gate = model.model.layers[li].mlp.gate
        bias = getattr(gate, "e_score_correction_bias", None)
        idx, w, margin = route(spec["arch"], cfg, x, gate.weight, bias)
        tf_sorted, order = tf_idx.sort(-1)
        assert torch.equal(idx, tf_sorted), f"router re-implementation disagrees at layer {li}"
        assert torch.allclose(w, tf_w.gather(1, order), atol=1e-6), f"router weights differ at layer {li}"
        min_margin = min(min_margin, float(margin.min()))
        if spec["arch"] == "v3" and bias is not None:
            idx0, _, _ = route(spec["arch"], cfg, x, gate.weight, bias, use_bias=False)
            flips += int((idx0 != idx).any(-1).sum())
            decisions += idx.shape[0]
        per_layer[li] = (idx, w)
    hidden = torch.stack(cap.hidden)  # [n_layers + 1, T, H]
    return logits, hidden, per_layer, min_margin, flips, decisions


def draw_prompts(spec, model, vocab):
    """Random prompts (fixed seed); re-drawn while any routing decision is fragile."""
    for attempt in range(50):
        g = torch.Generator().manual_seed(spec["seed"] * 100 + attempt)
        prompts = [torch.randint(0, vocab, (n,), generator=g, dtype=torch.int64) for n in PROMPT_LENS]
        results = [prompt_routes(model, spec, p) for p in prompts]
        margin = min(r[3] for r in results)
        if margin >= MIN_ROUTE_MARGIN:
            return prompts, results, attempt
        print(f"  prompts attempt {attempt}: min routing margin {margin:.2e} too small, redrawing")
    raise RuntimeError("could not draw prompts with robust routing")


def rope_facts(model):
    rot = model.model.rotary_emb
    attn = model.model.layers[0].self_attn
    return rot.inv_freq.detach().float().clone(), float(rot.attention_scaling), float(attn.scaling)


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
        cfg, tensors = save_via_transformers(model, tmp)
    names_written_by_transformers = sorted(tensors)

    gen = torch.Generator().manual_seed(spec["seed"] + 7)
    if spec.get("mtp"):
        tensors = add_mtp(tensors, cfg, gen)
    stored, ref_tensors = to_storage(tensors, spec["storage"], spec.get("not_convert", ()))

    cfg = dict(cfg)
    cfg.pop("dtype", None)
    cfg.pop("torch_dtype", None)
    cfg["dtype"] = {"f32": "float32", "bf16": "bfloat16", "fp8": "bfloat16"}[spec["storage"]]
    if spec["storage"] == "fp8":
        cfg["quantization_config"] = {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": [BLOCK, BLOCK],
        }
        if spec.get("not_convert"):
            cfg["quantization_config"]["modules_to_not_convert"] = list(spec["not_convert"])
    if spec.get("hub_spelling"):
        cfg = to_hub_spelling(cfg)
    write_checkpoint(out_dir, cfg, stored)

    # Reference model: what transformers itself loads from the fixture (fp8: from the
    # dequantised weights, since transformers' fp8 path needs an accelerator).
    if spec["storage"] == "fp8":
        with tempfile.TemporaryDirectory() as tmp:
            rcfg = dict(cfg)
            rcfg.pop("quantization_config")
            rcfg["dtype"] = "float32"
            write_checkpoint(tmp, rcfg, ref_tensors)
            ref, info = load_reference_model(spec, tmp)
    else:
        ref, info = load_reference_model(spec, out_dir)
    unexpected = sorted(info["unexpected_keys"])

    # The loaded model must hold exactly the (rounded) weights we meant.
    with torch.no_grad():
        rsd = ref.state_dict()
        for k, t in model.state_dict().items():
            expect = ref_tensors.get(k)
            if expect is None:
                continue  # fused experts / tied lm_head: checked via logits below
            assert torch.equal(rsd[k].float(), expect.float()), f"{name}: {k} not loaded as stored"

    prompts, results, attempt = draw_prompts(spec, ref, cfg["vocab_size"])
    out = {}
    meta_prompts = []
    decode_worst = 0.0
    flips = decisions = 0
    for i, (p, (logits, hidden, routes, margin, fl, dec)) in enumerate(zip(prompts, results)):
        out[f"prompt_{i}"] = p.clone()
        out[f"logits_full_{i}"] = logits.contiguous()
        d = decode_check(ref, p, logits)
        decode_worst = max(decode_worst, d)
        assert d < DECODE_TOL, f"{name}: cached decode differs from full forward by {d}"
        flips += fl
        decisions += dec
        meta_prompts.append({
            "len": int(p.shape[0]),
            "max_abs_logit": float(logits.abs().max()),
            "logits_rms": float(logits.pow(2).mean().sqrt()),
            "min_route_margin": margin if math.isfinite(margin) else None,
            "decode_vs_full_max_abs_diff": d,
        })
        if i == 0:
            out["hidden_0"] = hidden.contiguous()
            if routes:
                layers = sorted(routes)
                out["route_idx_0"] = torch.stack([routes[l][0] for l in layers]).to(torch.int64).contiguous()
                out["route_w_0"] = torch.stack([routes[l][1] for l in layers]).float().contiguous()
                moe_layers = layers
            else:
                moe_layers = []
    logits_rms = torch.tensor([m["logits_rms"] for m in meta_prompts], dtype=torch.float32)
    out["logits_rms"] = logits_rms
    inv_freq, attn_factor, softmax_scale = rope_facts(ref)
    out["rope_inv_freq"] = inv_freq

    # Sanity: the in-memory model (pre-save) agrees with the loaded one for f32 storage,
    # which proves the written config (incl. hub spelling) means the same model.
    if spec["storage"] == "f32":
        d = float((full_forward(model, prompts[0]) - out["logits_full_0"]).abs().max())
        assert d < 1e-5, f"{name}: reloaded model differs from the generated one by {d}"

    max_abs = max(m["max_abs_logit"] for m in meta_prompts)
    tol_abs = max(5e-4, 1e-4 * max_abs)
    meta = {
        "fixture": name,
        "architecture": cfg.get("architectures", [None])[0],
        "generated_by": "tools/golden/make_golden.py",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "seed": spec["seed"],
        "prompt_seed_attempt": attempt,
        "weight_storage": spec["storage"],
        "config_spelling": "hub (rope_theta + rope_scaling)" if spec.get("hub_spelling")
        else "transformers-5 (rope_parameters + rope_interleave)" if spec["arch"] == "v3"
        else "transformers-5 (rope_parameters, no rope_interleave: V2 is always interleaved)",
        "mtp_tensors_in_checkpoint": bool(spec.get("mtp")),
        "tensors_written_by_transformers": len(names_written_by_transformers),
        "lm_head_in_file": "lm_head.weight" in stored,
        "unexpected_keys_on_transformers_load": unexpected,
        "prompts": meta_prompts,
        "prompt_dtype": "int64",
        "max_abs_logit": max_abs,
        "decode_vs_full_max_abs_diff": decode_worst,
        "min_route_margin": min((m["min_route_margin"] for m in meta_prompts
                                 if m["min_route_margin"] is not None), default=None),
        "moe_layers": moe_layers,
        "softmax_scale": softmax_scale,
        "softmax_scale_unscaled": (cfg_qk_head_dim(cfg)) ** -0.5,
        "rope_attention_factor": attn_factor,
        "suggested_tolerance": {
            "logits_max_abs_diff": tol_abs,
            "argmax_must_match": True,
            "note": "fp32 engine vs this fp32 reference; the reference already uses the stored "
                    "(rounded / dequantised) weights",
        },
        "reference_tensors": {k: {"dtype": str(v.dtype).replace("torch.", ""), "shape": list(v.shape)}
                              for k, v in sorted(out.items())},
    }
    if spec["arch"] == "v3":
        meta["bias_routing_flips"] = {
            "changed_decisions": flips,
            "total_decisions": decisions,
            "how": "over all 3 prompts and all MoE layers, (token, layer) decisions whose expert set "
                   "changes when e_score_correction_bias is zeroed, evaluated on the same router inputs",
        }
        print(f"  bias zeroed -> {flips}/{decisions} routing decisions change")
        if name == "v3_yarn":
            assert flips > 0, "bias does not change routing: fixture would not test it"
    if spec["storage"] == "fp8":
        meta["fp8"] = fp8_stats(stored)

    save_file(out, os.path.join(out_dir, "reference.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "reference.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    size = sum(os.path.getsize(os.path.join(out_dir, fn)) for fn in os.listdir(out_dir))
    print(f"  max|logit| {max_abs:.3f}  rms {logits_rms.tolist()}  decode diff {decode_worst:.2e}  "
          f"min margin {meta['min_route_margin']}  scale {softmax_scale:.5f}  "
          f"attn_factor {attn_factor:.5f}  size {size / 1024:.0f} KiB")
    return meta


def cfg_qk_head_dim(cfg):
    return cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]


def fp8_stats(stored):
    n_q = n_partial = n_sub = n_zero = 0
    for k, t in stored.items():
        if t.dtype != torch.float8_e4m3fn:
            continue
        n_q += 1
        o, i = t.shape
        if o % BLOCK or i % BLOCK:
            n_partial += 1
        bits = t.view(torch.uint8).to(torch.int32)
        exp = (bits >> 3) & 0xF
        mant = bits & 0x7
        n_sub += int(((exp == 0) & (mant != 0)).sum())
        n_zero += int(((exp == 0) & (mant == 0)).sum())
    return {"quantised_tensors": n_q, "with_partial_blocks": n_partial,
            "subnormal_values": n_sub, "zero_values": n_zero}


def main(argv):
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    names = argv or list(SPECS)
    os.makedirs(OUT_DIR, exist_ok=True)
    for n in names:
        make_fixture(n, SPECS[n])
    total = 0
    for dp, _, fns in os.walk(OUT_DIR):
        total += sum(os.path.getsize(os.path.join(dp, fn)) for fn in fns)
    print(f"models/golden total {total / 1024:.0f} KiB")


if __name__ == "__main__":
    np.random.seed(0)
    main(sys.argv[1:])
