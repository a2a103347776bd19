"""Check the saved model directories as a consumer would see them.

Usage: python tools/train/check_models.py [--models models]
For each of target, draft, draft-weak: `AutoModelForCausalLM.from_pretrained(dir)` loads the
directory as it is; the config has the fields the engine relies on; the safetensors hold bf16 for
every weight except the router gate weight and e_score_correction_bias (fp32); the tokenizer file
loads with `tokenizers` and `AutoTokenizer` and round-trips samples. Also checks the total size of
models/ (< 150 MB). Exits non-zero on any failure.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys

import torch
from safetensors import safe_open
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import task  # noqa: E402

FP32_SUFFIXES = ("mlp.gate.weight", "mlp.gate.e_score_correction_bias")


def check_dir(path: str, errors: list[str]) -> dict:
    def need(cond, msg):
        if not cond:
            errors.append(f"{path}: {msg}")

    cfg = json.load(open(os.path.join(path, "config.json")))
    need(cfg.get("architectures") == ["DeepseekV3ForCausalLM"], "architectures")
    need(cfg.get("topk_method") == "noaux_tc" and cfg.get("scoring_func") == "sigmoid", "router keys")
    rp = cfg.get("rope_parameters") or {}
    need(rp.get("rope_type") == "yarn" and rp.get("factor", 1) > 1, "yarn rope")
    need(cfg.get("q_lora_rank"), "q_lora_rank")
    need(cfg["kv_lora_rank"] < cfg["num_attention_heads"] * (cfg["qk_nope_head_dim"] + cfg["v_head_dim"]),
         "kv_lora_rank < heads x head dims")
    dtypes = {}
    n_params = 0
    with safe_open(os.path.join(path, "model.safetensors"), "pt") as f:
        for k in f.keys():
            t = f.get_slice(k)
            dt = t.get_dtype()
            shape = t.get_shape()
            n = 1
            for s in shape:
                n *= s
            n_params += n
            dtypes[dt] = dtypes.get(dt, 0) + 1
            want = "F32" if k.endswith(FP32_SUFFIXES) else "BF16"
            need(dt == want, f"{k} is {dt}, want {want}")
    model = AutoModelForCausalLM.from_pretrained(path)
    need(type(model).__name__ == "DeepseekV3ForCausalLM", "loads as DeepseekV3ForCausalLM")
    tok = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
    for i, s in enumerate(task.SPECIAL_TOKENS):
        need(tok.token_to_id(s) == i, f"special token {s} id")
    hf_tok = AutoTokenizer.from_pretrained(path)
    rng = random.Random(7)
    for _ in range(500):
        s = task.full_text(task.make_problem(rng))
        ids = tok.encode(s, add_special_tokens=False).ids
        need(tok.decode(ids, skip_special_tokens=False) == s, "tokenizers round trip")
        ids2 = hf_tok(s, add_special_tokens=False)["input_ids"]
        need(ids2 == ids and hf_tok.decode(ids2) == s, "AutoTokenizer round trip")
        if len(errors) > 20:
            break
    size = os.path.getsize(os.path.join(path, "model.safetensors"))
    return {"tensors_by_dtype": dtypes, "params": n_params, "safetensors_bytes": size}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="models")
    args = ap.parse_args()
    torch.set_num_threads(2)
    errors: list[str] = []
    report = {}
    for name in ("target", "draft", "draft-weak"):
        report[name] = check_dir(os.path.join(args.models, name), errors)
    total = 0
    for root, _, files in os.walk(args.models):
        total += sum(os.path.getsize(os.path.join(root, fn)) for fn in files)
    report["models_dir_bytes"] = total
    if total >= 150 * 1024 * 1024:
        errors.append(f"models/ is {total} bytes (>= 150 MB)")
    t = report["target"]["safetensors_bytes"]
    if t <= 60 * 1000 * 1000:
        errors.append(f"target weights are {t} bytes (<= 60 MB)")
    print(json.dumps(report, indent=1))
    if errors:
        print("\n".join(errors))
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
