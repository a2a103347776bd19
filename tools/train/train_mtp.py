"""Train a DeepSeek-V3 multi-token-prediction (MTP) layer for the bundled target, target frozen.

Usage: python tools/train/train_mtp.py [--target models/target] [--steps 400] [--threads 2]
       python tools/train/train_mtp.py --reference models/golden/mtp_reference.safetensors
           (torch reference MTP log-probs of the saved layer, for tests/spec_mtp.rs)

The MTP layer is fed as vLLM (`deepseek_mtp.py`) and SGLang (`deepseek_nextn.py`) feed the
official weights: x_j = eh_proj([enorm(embed(t_{j+1})) | hnorm(h_j)]) with the embedding zeroed at
position 0 and h_j the target's hidden state after its final norm; one DeepseekV3 decoder layer
(MoE, its own attention over positions 0..); logits = shared_head.head(shared_head.norm(x'))
predict t_{j+2}. Loss: next-next-token cross entropy on the task traces' generated tokens.

Writes the layer as a SECOND shard `mtp.safetensors` (`model.layers.{L}.*`, bf16; router gate and
correction bias f32) plus `model.safetensors.index.json` mapping every tensor to its shard, and
sets `num_nextn_predict_layers: 1` in config.json; the main `model.safetensors` is not rewritten.
transformers still loads the directory (it ignores the MTP tensors). Held-out per-token
acceptance (greedy MTP draft == the target's greedy next-next token on held-out traces) is
printed and saved in mtp_stats.json.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tokenizers import Tokenizer
from transformers import DeepseekV3ForCausalLM
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as md

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import task  # noqa: E402
from train import make_batches  # noqa: E402


class Mtp(torch.nn.Module):
    def __init__(self, target):
        super().__init__()
        cfg = target.config
        h = cfg.hidden_size
        self.L = cfg.num_hidden_layers
        self.enorm = md.DeepseekV3RMSNorm(h, eps=cfg.rms_norm_eps)
        self.hnorm = md.DeepseekV3RMSNorm(h, eps=cfg.rms_norm_eps)
        self.eh_proj = torch.nn.Linear(2 * h, h, bias=False)
        self.layer = md.DeepseekV3DecoderLayer(cfg, layer_idx=self.L)
        self.head_norm = md.DeepseekV3RMSNorm(h, eps=cfg.rms_norm_eps)
        self.head = torch.nn.Linear(h, cfg.vocab_size, bias=False)
        # Init: the decoder layer from the target's last layer, the head from the lm_head,
        # eh_proj = [0 | I] (starts as "one more layer on the target's hidden state").
        self.layer.load_state_dict(target.model.layers[self.L - 1].state_dict())
        self.head.weight.data.copy_(target.lm_head.weight.data)
        self.head_norm.weight.data.copy_(target.model.norm.weight.data)
        with torch.no_grad():
            self.eh_proj.weight.zero_()
            self.eh_proj.weight[:, h:] = torch.eye(h)
            self.eh_proj.weight[:, :h] = 0.02 * torch.randn(h, h)

    def forward(self, target, ids, hidden):
        """ids [B, T], hidden [B, T, h] (final-norm) -> logits [B, T-1, vocab] at positions
        0..T-2, row j predicting ids[:, j + 2]."""
        e = target.model.embed_tokens(ids[:, 1:])  # t_{j+1}
        e = e.clone()
        e[:, 0] = 0.0  # position 0: embedding masked, as vLLM / SGLang do
        x = self.eh_proj(torch.cat([self.enorm(e), self.hnorm(hidden[:, :-1])], dim=-1))
        pos = torch.arange(x.shape[1]).unsqueeze(0).expand(x.shape[0], -1)
        pe = target.model.rotary_emb(x, pos)
        x = self.layer(x, attention_mask=None, position_ids=pos, position_embeddings=pe)
        if isinstance(x, tuple):
            x = x[0]
        return self.head(self.head_norm(x))

    def state_for_checkpoint(self):
        """Tensors in the DeepSeek-V3 checkpoint naming (per-expert gate/up/down)."""
        p = f"model.layers.{self.L}"
        out = {
            f"{p}.enorm.weight": self.enorm.weight,
            f"{p}.hnorm.weight": self.hnorm.weight,
            f"{p}.eh_proj.weight": self.eh_proj.weight,
            f"{p}.shared_head.norm.weight": self.head_norm.weight,
            f"{p}.shared_head.head.weight": self.head.weight,
        }
        for n, t in self.layer.state_dict().items():
            if n == "mlp.experts.gate_up_proj":
                inter = t.shape[1] // 2
                for e in range(t.shape[0]):
                    out[f"{p}.mlp.experts.{e}.gate_proj.weight"] = t[e, :inter]
                    out[f"{p}.mlp.experts.{e}.up_proj.weight"] = t[e, inter:]
            elif n == "mlp.experts.down_proj":
                for e in range(t.shape[0]):
                    out[f"{p}.mlp.experts.{e}.down_proj.weight"] = t[e]
            else:
                out[f"{p}.{n}"] = t
        res = {}
        for k, v in out.items():
            keep_f32 = k.endswith("mlp.gate.weight") or k.endswith("e_score_correction_bias")
            res[k] = v.detach().to(torch.float32 if keep_f32 else torch.bfloat16).contiguous()
        return res


def load_mtp(target, target_dir):
    """The saved MTP layer back into an `Mtp` module (for the reference logits)."""
    m = Mtp(target)
    p = f"model.layers.{m.L}."
    with safe_open(os.path.join(target_dir, "mtp.safetensors"), "pt") as f:
        sd = {k[len(p):]: f.get_tensor(k).float() for k in f.keys()}
    layer_sd = {}
    experts = {}
    for k, v in sd.items():
        if k.startswith("mlp.experts."):
            _, _, e, name, _ = k.split(".")
            experts.setdefault(int(e), {})[name] = v
        elif k in ("enorm.weight", "hnorm.weight", "eh_proj.weight"):
            getattr(m, k.split(".")[0]).weight.data.copy_(v)
        elif k == "shared_head.norm.weight":
            m.head_norm.weight.data.copy_(v)
        elif k == "shared_head.head.weight":
            m.head.weight.data.copy_(v)
        else:
            layer_sd[k] = v
    n = len(experts)
    layer_sd["mlp.experts.gate_up_proj"] = torch.stack(
        [torch.cat([experts[e]["gate_proj"], experts[e]["up_proj"]]) for e in range(n)])
    layer_sd["mlp.experts.down_proj"] = torch.stack([experts[e]["down_proj"] for e in range(n)])
    m.layer.load_state_dict(layer_sd)
    return m


def save(mtp, target_dir, stats):
    tensors = mtp.state_for_checkpoint()
    save_file(tensors, os.path.join(target_dir, "mtp.safetensors"), metadata={"format": "pt"})
    with safe_open(os.path.join(target_dir, "model.safetensors"), "pt") as f:
        main_names = list(f.keys())
    total = sum(v.numel() * v.element_size() for v in tensors.values())
    with safe_open(os.path.join(target_dir, "model.safetensors"), "pt") as f:
        for k in main_names:
            t = f.get_slice(k)
            shape = t.get_shape()
            total += math.prod(shape) * (4 if t.get_dtype() == "F32" else 2)
    wm = {k: "model.safetensors" for k in main_names}
    wm.update({k: "mtp.safetensors" for k in tensors})
    with open(os.path.join(target_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(wm.items()))}, f, indent=1)
    cp = os.path.join(target_dir, "config.json")
    cfg = json.load(open(cp))
    cfg["num_nextn_predict_layers"] = 1
    with open(cp, "w") as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(target_dir, "mtp_stats.json"), "w") as f:
        json.dump(stats, f, indent=1)


@torch.no_grad()
def heldout_acceptance(target, mtp, tok, n=64):
    """Per-token acceptance on held-out traces: greedy MTP draft of t_{j+2} equals the target's
    greedy prediction there (what a k=1 MTP drafter gets accepted), over generated positions."""
    hits = tot = 0
    for p in task.heldout_problems(n):
        ids, mask = task.encode_sample(tok, p, None)
        x = torch.tensor([ids])
        out = target.model(input_ids=x)
        hid = out.last_hidden_state
        tgt = target.lm_head(hid).argmax(-1)[0]  # tgt[j] = target's greedy t_{j+1}
        lg = mtp(target, x, hid).argmax(-1)[0]  # lg[j] = MTP's t_{j+2}
        for j in range(len(ids) - 2):
            if mask[j + 2]:
                tot += 1
                hits += int(lg[j] == tgt[j + 1])
    return hits / max(1, tot), tot


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="models/target")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--reference", help="write torch reference MTP log-probs for fixed inputs (safetensors) and exit")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    target = DeepseekV3ForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    tok = Tokenizer.from_file(os.path.join(args.target, "tokenizer.json"))
    if args.reference:
        mtp = load_mtp(target, args.target).eval()
        tensors = {}
        for i, p in enumerate(task.heldout_problems(2, seed=777)):
            ids, _ = task.encode_sample(tok, p, None)
            ids = ids[:40]
            with torch.no_grad():
                x = torch.tensor([ids])
                hid = target.model(input_ids=x).last_hidden_state
                lg = torch.log_softmax(mtp(target, x, hid), dim=-1)[0]
            tensors[f"prompt_{i}"] = torch.tensor(ids, dtype=torch.int64)
            tensors[f"mtp_log_probs_{i}"] = lg.contiguous()  # [T-1, vocab]; row j predicts token j+2
        save_file(tensors, args.reference, metadata={"torch": torch.__version__,
                  "note": "log_softmax of MTP logits; row j: inputs token j+1 and the target's final-norm hidden state at j"})
        print(f"wrote {args.reference}")
        return
    mtp = Mtp(target)
    mtp.train()
    acc0, _ = heldout_acceptance(target, mtp.eval(), tok)
    mtp.train()
    print(f"held-out acceptance at init: {acc0:.3f}", flush=True)
    opt = torch.optim.AdamW(mtp.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    rng = random.Random(args.seed)
    stream = task.problem_stream(args.seed * 1000 + 11)
    queue = []
    t0 = time.time()
    ema = None
    curve = []
    warm = 30
    for step in range(args.steps):
        if not queue:
            queue = make_batches(tok, stream, rng, args.batch, 4, 0.0)
        ids, labels = queue.pop()
        lr = args.lr * min(1.0, (step + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / args.steps)))
        for g in opt.param_groups:
            g["lr"] = lr
        with torch.no_grad():
            hid = target.model(input_ids=ids).last_hidden_state
        logits = mtp(target, ids, hid)  # [B, T-1, V]; row j predicts ids[:, j + 2]
        lab = labels[:, 2:]
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), lab.reshape(-1), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(mtp.parameters(), 1.0)
        opt.step()
        lv = float(loss.detach())
        ema = lv if ema is None else 0.95 * ema + 0.05 * lv
        if (step + 1) % 25 == 0:
            curve.append({"step": step + 1, "loss_ema": round(ema, 4), "elapsed_s": round(time.time() - t0, 1)})
            print(f"step {step+1}/{args.steps} loss {lv:.4f} ema {ema:.4f} {time.time()-t0:.0f}s", flush=True)
    mtp.eval()
    acc, n = heldout_acceptance(target, mtp, tok)
    stats = {"steps": args.steps, "lr": args.lr, "batch": args.batch, "seed": args.seed,
             "threads": args.threads, "wall_s": round(time.time() - t0, 1), "final_loss_ema": round(ema, 4),
             "heldout_acceptance_k1": round(acc, 4), "heldout_positions": n,
             "heldout_acceptance_at_init": round(acc0, 4), "curve": curve, "torch": torch.__version__}
    print(json.dumps({k: v for k, v in stats.items() if k != "curve"}), flush=True)
    save(mtp, args.target, stats)


if __name__ == "__main__":
    main()
