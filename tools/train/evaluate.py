"""Reference evaluation of the bundled models (Python, transformers `DeepseekV3ForCausalLM`).

Usage: python tools/train/evaluate.py [--models models] [--n 500] [--threads 2]

Everything runs in fp32 computed from the saved bf16 weights, with greedy decoding and a KV cache.
Writes:
  models/eval.json                      accuracy vs thinking budget, thinking lengths, draft agreement
  models/workload/prompts.jsonl         held-out prompts + answer + the target's natural thinking length
  models/workload/prompts.txt           the same prompt texts, one per line
  models/workload/reference_greedy.jsonl  the target's greedy continuations of the first 50 prompts
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections import Counter, defaultdict

import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import task  # noqa: E402

ANSWER_RE = re.compile(r"The answer is (\d)\.")
N_WORKLOAD = 320
N_REFERENCE = 50
REFERENCE_MAX_NEW = 128
BATCH = 64
GEN_BATCH = 128


def load(path):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    return model


@torch.no_grad()
def greedy_exact(model, prompts: list[list[int]], max_new: int, eos: int) -> list[list[int]]:
    """Greedy continuations (up to and including eos) without any padding: prompts are grouped
    by exact length. Used for the reference continuations the engine is checked against."""
    by_len = defaultdict(list)
    for i, p in enumerate(prompts):
        by_len[len(p)].append(i)
    results: list[list[int] | None] = [None] * len(prompts)
    for _, idxs in sorted(by_len.items()):
        for c in range(0, len(idxs), BATCH):
            chunk = idxs[c:c + BATCH]
            ids = torch.tensor([prompts[i] for i in chunk])  # [b, L]
            out = model(input_ids=ids, use_cache=True)
            past = out.past_key_values
            nxt = out.logits[:, -1].argmax(-1)  # [b]
            gen = [nxt]
            done = nxt == eos
            for _ in range(max_new - 1):
                if bool(done.all()):
                    break
                out = model(input_ids=nxt[:, None], past_key_values=past, use_cache=True)
                past = out.past_key_values
                nxt = out.logits[:, -1].argmax(-1)
                gen.append(nxt)
                done = done | (nxt == eos)
            g = torch.stack(gen, 1).tolist()  # [b, n_new]
            for row, i in zip(g, chunk):
                if eos in row:
                    row = row[:row.index(eos) + 1]
                results[i] = row
    return results


@torch.no_grad()
def greedy(model, prompts: list[list[int]], max_new: int, eos: int, pad: int = 0) -> list[list[int]]:
    """Batched greedy continuations (up to and including eos): prompts sorted by length and
    left-padded (attention mask + generate's position ids), results in input order."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    results: list[list[int] | None] = [None] * len(prompts)
    for c in range(0, len(order), GEN_BATCH):
        chunk = order[c:c + GEN_BATCH]
        L = max(len(prompts[i]) for i in chunk)
        ids = torch.full((len(chunk), L), pad, dtype=torch.long)  # [b, L]
        mask = torch.zeros((len(chunk), L), dtype=torch.long)  # [b, L]
        for r, i in enumerate(chunk):
            p = prompts[i]
            ids[r, L - len(p):] = torch.tensor(p)
            mask[r, L - len(p):] = 1
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False,
                             eos_token_id=eos, pad_token_id=pad)
        for r, i in enumerate(chunk):
            row = out[r, L:].tolist()
            if eos in row:
                row = row[:row.index(eos) + 1]
            results[i] = row
    return results


@torch.no_grad()
def argmax_tf(model, seqs: list[list[int]]) -> list[list[int]]:
    """Teacher-forced argmax at every position (prediction of token t+1 from tokens <= t).
    Sequences are sorted by length and right-padded: causal attention keeps padding out of the
    real positions, and padded positions are dropped."""
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    res: list[list[int] | None] = [None] * len(seqs)
    for c in range(0, len(order), GEN_BATCH):
        chunk = order[c:c + GEN_BATCH]
        L = max(len(seqs[i]) for i in chunk)
        ids = torch.zeros((len(chunk), L), dtype=torch.long)  # [b, L]
        for r, i in enumerate(chunk):
            ids[r, :len(seqs[i])] = torch.tensor(seqs[i])
        am = model(input_ids=ids, use_cache=False).logits.argmax(-1).tolist()  # [b, L]
        for r, i in enumerate(chunk):
            res[i] = am[r][:len(seqs[i])]
    return res


@torch.no_grad()
def moe_stats(model, seqs: list[list[int]]) -> list[dict]:
    """Per MoE layer: how much the routed experts contribute (mean ||routed|| / ||shared|| per
    token), how many experts are used, and the router-bias range."""
    out = []
    hooks = []
    for li, layer in enumerate(model.model.layers):
        mlp = layer.mlp
        if not hasattr(mlp, "experts"):
            continue
        rec = {"layer": li}
        store = {}
        hooks.append(mlp.experts.register_forward_hook(lambda m, i, o, s=store: s.__setitem__("r", o)))
        hooks.append(mlp.shared_experts.register_forward_hook(lambda m, i, o, s=store: s.__setitem__("s", o.reshape(-1, o.shape[-1]))))
        hooks.append(mlp.gate.register_forward_hook(lambda m, i, o, s=store: s.__setitem__("idx", o[2])))
        out.append((rec, store, mlp))
    L = max(len(s) for s in seqs)
    ids = torch.zeros((len(seqs), L), dtype=torch.long)  # [b, L]
    for r, s in enumerate(seqs):
        ids[r, :len(s)] = torch.tensor(s)
    real = torch.zeros((len(seqs), L), dtype=torch.bool)  # [b, L] true on non-padding positions
    for r, s in enumerate(seqs):
        real[r, :len(s)] = True
    real = real.reshape(-1)  # [b * L]
    model(input_ids=ids, use_cache=False)
    res = []
    for rec, store, mlp in out:
        rn = store["r"].reshape(-1, store["r"].shape[-1])[real].norm(dim=-1)  # [n_real]
        sn = store["s"][real].norm(dim=-1)  # [n_real]
        ratio = (rn / sn.clamp_min(1e-9)).mean().item()
        used = torch.bincount(store["idx"][real].reshape(-1), minlength=mlp.gate.num_experts)
        b = mlp.gate.e_score_correction_bias
        rec.update({"routed_over_shared_norm": round(ratio, 4), "experts_used": int((used > 0).sum()),
                    "max_expert_share": round(used.max().item() / used.sum().item(), 4),
                    "bias_min": round(b.min().item(), 4), "bias_max": round(b.max().item(), 4)})
        res.append(rec)
    for h in hooks:
        h.remove()
    return res


@torch.no_grad()
def routing_ablation(model, seqs: list[list[int]], ref_am: list[list[int]], lo_hi) -> dict:
    """Does routing matter? Teacher-forced argmax agreement with the model's own argmax when every
    token is sent to the wrong experts (each chosen index shifted by one, same weights) and when
    the router's correction bias is ignored. Only positions predicting generated tokens count."""
    gates = [layer.mlp.gate for layer in model.model.layers if hasattr(layer.mlp, "gate")]

    def agreement():
        am = argmax_tf(model, seqs)
        same = total = 0
        for a, r, (lo, hi) in zip(am, ref_am, lo_hi):
            same += sum(a[i] == r[i] for i in range(lo, hi))
            total += hi - lo
        return round(same / total, 4)

    res = {}
    hooks = [g.register_forward_hook(
        lambda m, i, o: (o[0], o[1], (o[2] + 1) % m.num_experts)) for g in gates]
    res["agreement_wrong_experts"] = agreement()
    for h in hooks:
        h.remove()
    saved = [g.e_score_correction_bias.clone() for g in gates]
    for g in gates:
        g.e_score_correction_bias.zero_()
    res["agreement_bias_ignored"] = agreement()
    for g, b in zip(gates, saved):
        g.e_score_correction_bias.copy_(b)
    return res


def split_trace(tok, gen: list[int]):
    """(thinking ids, ids after </think>) of a generated continuation."""
    end = tok.token_to_id(task.END_THINK)
    if end in gen:
        k = gen.index(end)
        return gen[:k], gen[k + 1:]
    return gen, []


def parse_answer(tok, ids: list[int]) -> str | None:
    m = ANSWER_RE.search(tok.decode(ids, skip_special_tokens=True))
    return m.group(1) if m else None


def accuracy(answers, problems):
    if not problems:
        return None
    ok = sum(a == p["answer"] for a, p in zip(answers, problems))
    return ok / len(problems)


def expected_accepted(matches: list[bool], k: int) -> float:
    """Mean tokens emitted per verification step for a k-token draft under greedy verification:
    accepted prefix + one target token, walked along the trace."""
    i, steps, emitted = 0, 0, 0
    n = len(matches)
    while i < n:
        a = 0
        while a < k and i + a < n and matches[i + a]:
            a += 1
        step = min(a + 1, n - i)
        emitted += step
        i += step
        steps += 1
    return emitted / max(1, steps)


def length_stats(xs):
    xs = sorted(xs)
    n = len(xs)
    return {
        "mean": round(sum(xs) / n, 2), "min": xs[0], "p10": xs[n // 10], "p50": xs[n // 2],
        "p90": xs[(9 * n) // 10], "max": xs[-1],
        "histogram_by_10": {f"{b}-{b+9}": c for b, c in sorted(Counter(x // 10 * 10 for x in xs).items())},
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="models")
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.time()

    tok = Tokenizer.from_file(os.path.join(args.models, "target", "tokenizer.json"))
    eos = tok.token_to_id(task.EOS)
    end = tok.token_to_id(task.END_THINK)
    problems = task.heldout_problems(args.n)
    prompts = [task.encode(tok, task.prompt_text(p)) for p in problems]

    # Tokenizer round trip on every held-out sample and on training-stream samples.
    stream = task.problem_stream(99)
    rt_texts = [task.full_text(p) for p in problems] + [task.full_text(next(stream)) for _ in range(5000)]
    rt_fail = sum(tok.decode(task.encode(tok, s), skip_special_tokens=False) != s for s in rt_texts)

    result = {"n_problems": args.n, "compute": "fp32 from bf16 weights, greedy, KV cache",
              "tokenizer_roundtrip": {"samples": len(rt_texts), "failures": rt_fail}}
    target = load(os.path.join(args.models, "target"))
    gens = greedy(target, prompts, 200, eos)
    thinks, tails = zip(*(split_trace(tok, g) for g in gens))
    full_acc = accuracy([parse_answer(tok, t) for t in tails], problems)
    natural = [len(t) for t in thinks]
    gold_think = [len(task.encode(tok, task.thinking_text(p))) for p in problems]
    budget = {"full": full_acc}
    for name, frac in (("cut_50", 0.5), ("cut_25", 0.25), ("none", 0.0)):
        forced = [pr + list(th[:int(frac * len(th))]) + [end] for pr, th in zip(prompts, thinks)]
        outs = greedy(target, forced, 16, eos)
        budget[name] = accuracy([parse_answer(tok, o) for o in outs], problems)
    trace_exact = sum(list(th) == task.encode(tok, task.thinking_text(p)) for th, p in zip(thinks, problems))
    result["target"] = {
        "answer_accuracy": budget,
        "thinking_trace_exact_match": trace_exact / args.n,
        "thinking_tokens": length_stats(natural),
        "thinking_tokens_reference_solution": length_stats(gold_think),
        "accuracy_by_n_ops": {
            str(n): accuracy(
                [parse_answer(tok, t) for t, p in zip(tails, problems) if p["n_ops"] == n],
                [p for p in problems if p["n_ops"] == n])
            for n in range(task.MIN_OPS, task.MAX_OPS + 1)
        },
    }
    print(json.dumps(result["target"]["answer_accuracy"]), flush=True)

    # Draft agreement, teacher-forced on the target's own greedy traces.
    seqs = [pr + g for pr, g in zip(prompts, gens)]
    tgt_am = argmax_tf(target, seqs)
    result["target"]["moe_layers"] = moe_stats(target, seqs[:64])
    # positions whose prediction is a generated token
    gen_pos = [(len(pr) - 1, len(pr) + len(g) - 1) for pr, g in zip(prompts, gens)]
    result["target"]["routing_ablation"] = routing_ablation(target, seqs[:200], tgt_am[:200], gen_pos[:200])
    print("routing", json.dumps(result["target"]["routing_ablation"]), flush=True)
    result["drafts"] = {}
    for dname in ("draft", "draft-weak"):
        dpath = os.path.join(args.models, dname)
        if not os.path.isdir(dpath):
            continue
        draft = load(dpath)
        d_am = argmax_tf(draft, seqs)
        all_m, think_m = [], []
        per_seq = []
        for (lo, hi), g, ta, da in zip(gen_pos, gens, tgt_am, d_am):
            m = [ta[i] == da[i] for i in range(lo, hi)]
            per_seq.append(m)
            all_m += m
            k_end = g.index(end) if end in g else len(g)
            think_m += m[:k_end]
        dgens = greedy(draft, prompts, 200, eos)
        dacc = accuracy([parse_answer(tok, split_trace(tok, g)[1]) for g in dgens], problems)
        result["drafts"][dname] = {
            "agreement_thinking_plus_answer": round(sum(all_m) / len(all_m), 4),
            "agreement_thinking": round(sum(think_m) / len(think_m), 4),
            "expected_tokens_per_verify": {
                f"k={k}": round(sum(expected_accepted(m, k) for m in per_seq) / len(per_seq), 3)
                for k in (2, 4, 6)
            },
            "own_answer_accuracy_full_thinking": dacc,
        }
        print(dname, json.dumps(result["drafts"][dname]), flush=True)

    # Workload for the engine's tests and benchmarks.
    wdir = os.path.join(args.models, "workload")
    os.makedirs(wdir, exist_ok=True)
    with open(os.path.join(wdir, "prompts.jsonl"), "w") as f, open(os.path.join(wdir, "prompts.txt"), "w") as ft:
        for p, pr, n in list(zip(problems, prompts, natural))[:N_WORKLOAD]:
            text = task.prompt_text(p)
            f.write(json.dumps({"prompt": text, "prompt_token_ids": pr, "answer": p["answer"],
                                "n_ops": p["n_ops"], "natural_thinking_tokens": n}) + "\n")
            ft.write(text + "\n")
    refs = greedy_exact(target, prompts[:N_REFERENCE], REFERENCE_MAX_NEW, eos)  # no padding at all
    result["reference_matches_batched_generation"] = sum(
        r == g[:REFERENCE_MAX_NEW] for r, g in zip(refs, gens[:N_REFERENCE])) / N_REFERENCE
    with open(os.path.join(wdir, "reference_greedy.jsonl"), "w") as f:
        for pr, out in zip(prompts, refs):
            f.write(json.dumps({"prompt_token_ids": pr, "output_token_ids": out}) + "\n")

    result["eval_wall_s"] = round(time.time() - t0, 1)
    with open(os.path.join(args.models, "eval.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
