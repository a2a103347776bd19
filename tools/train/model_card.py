"""Render models/README.md (the model card) from the saved configs, train_stats.json files,
models/train_all.json and models/eval.json, so every number in the card is a measured one.

Usage: python tools/train/model_card.py [--models models]
"""
from __future__ import annotations

import argparse
import json
import os

NAMES = ("target", "draft", "draft-weak")


def pct(x):
    return "n/a" if x is None else f"{100 * x:.1f}%"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="models")
    args = ap.parse_args()
    M = args.models
    cfg = {n: json.load(open(os.path.join(M, n, "config.json"))) for n in NAMES}
    st = {n: json.load(open(os.path.join(M, n, "train_stats.json"))) for n in NAMES}
    for n in NAMES:  # a model trained in two phases: report both
        ph1 = os.path.join(M, n, "train_stats_phase1.json")
        if os.path.exists(ph1):
            a = json.load(open(ph1))
            b = st[n]
            st[n] = dict(b, steps=f"{a['steps']}+{b['steps']}", train_tokens=a["train_tokens"] + b["train_tokens"],
                         wall_s=a["wall_s"] + b["wall_s"],
                         tokens_per_s=(a["train_tokens"] + b["train_tokens"]) / (a["wall_s"] + b["wall_s"]))
    ev = json.load(open(os.path.join(M, "eval.json")))
    tall = json.load(open(os.path.join(M, "train_all.json")))
    wall = tall.get("train_wall_s")
    size = {n: os.path.getsize(os.path.join(M, n, "model.safetensors")) for n in NAMES}
    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(M) for f in fs)

    t = cfg["target"]
    d = cfg["draft"]
    acc = ev["target"]["answer_accuracy"]
    tl = ev["target"]["thinking_tokens"]
    L = []
    w = L.append
    w("# Bundled models: mod-10 program evaluation with a thinking scratchpad\n")
    w("Three small `DeepseekV3ForCausalLM` checkpoints trained from scratch in this repository on a "
      "synthetic task (nothing is downloaded): `target` (MLA + MoE, the model the engine serves), "
      "`draft` (a dense model with the same tokenizer, for speculative decoding) and `draft-weak` "
      "(same architecture as `draft`, trained briefly, for draft-swap tests). This file is generated "
      "by `tools/train/model_card.py` from the measured JSON files next to the models.\n")
    w("## Task\n")
    w("Each sample is `<bos>` question `<think>` scratchpad `</think>` answer `<eos>`:\n")
    w("```\n<bos>Q: Let x=4. Evaluate mod 10: k+3,l-2,m+1<think>k+3:4+3=7;l-2:7-2=5;m+1:5+1=6;</think>The answer is 6.<eos>\n```\n")
    w("A start value (always written `x=<digit>`) and 4..10 operations (add or subtract 1..3, "
      "mod 10) labelled by consecutive letters from a random first letter (x skipped); six question wordings and three operation separators. The scratchpad "
      "applies one operation per step (8 tokens per step), so the answer (the last value) needs "
      "every step: with the thinking cut short the model can only guess. "
      "Training mixes in 15% of samples whose thinking is cut at a random token and followed by "
      "`</think>` and the right answer, so a forced early end is in distribution (the `</think>` of "
      "those samples is not trained on, so the model never learns to stop early). The loss covers "
      "thinking + answer only. Held-out problems come from a separate seed "
      "(`task.heldout_problems`).\n")
    w("## Tokenizer\n")
    w(f"`tokenizer.json` (identical in every model directory): a BPE trained with the `tokenizers` "
      f"library, {t['vocab_size']} tokens. Special added tokens: `<pad>`=0, `<bos>`=1, `<eos>`=2, "
      "`<think>`=3, `</think>`=4. The pre-tokenizer isolates each digit, each signed digit (`+3`, "
      "`-2` are single tokens), each word and each other character, so every scratchpad lookup is a "
      "single-token match; the decoder is `Fuse`, so decode(encode(x)) == x "
      f"(checked on {ev['tokenizer_roundtrip']['samples']} samples: "
      f"{ev['tokenizer_roundtrip']['failures']} failures). No post-processor: prompts carry their "
      "own `<bos>`; encode with `add_special_tokens=False`.\n")
    w("## Format\n")
    w("`config.json` + `model.safetensors` + `tokenizer.json` (+ `tokenizer_config.json`, "
      "`generation_config.json`), written by `save_pretrained` (transformers "
      f"{t.get('transformers_version')}). All weights are bf16 except, in MoE layers, "
      "`mlp.gate.weight` and `mlp.gate.e_score_correction_bias`, which are fp32 (as transformers "
      "keeps them). Experts are stored under the classic per-expert names "
      "`mlp.experts.E.{gate,up,down}_proj.weight`. The config uses the transformers 5.x spelling: "
      "`rope_parameters` (yarn) and `rope_interleave: true` (checkpoint k_pe/q_pe pairs are "
      "interleaved), plus the explicit extra keys `topk_method: noaux_tc`, `scoring_func: sigmoid`; "
      "`num_nextn_predict_layers: 0` (no MTP weights). The router biases are non-zero "
      "(aux-loss-free balancing was used in fine-tuning), so an engine that ignores "
      "`e_score_correction_bias` routes differently.\n")
    w("| | target | draft / draft-weak |")
    w("|---|---|---|")
    rows = [
        ("layers", "num_hidden_layers"), ("hidden", "hidden_size"), ("heads", "num_attention_heads"),
        ("q_lora_rank", "q_lora_rank"), ("kv_lora_rank", "kv_lora_rank"),
        ("qk_nope / qk_rope / v head dims", None), ("dense intermediate", "intermediate_size"),
        ("first_k_dense_replace", "first_k_dense_replace"),
    ]
    for label, key in rows:
        if key is None:
            f = lambda c: f"{c['qk_nope_head_dim']} / {c['qk_rope_head_dim']} / {c['v_head_dim']}"
        else:
            f = lambda c, k=key: str(c[k])
        w(f"| {label} | {f(t)} | {f(d)} |")
    w(f"| MoE | {t['n_routed_experts']} routed x {t['moe_intermediate_size']} + "
      f"{t['n_shared_experts']} shared, top-{t['num_experts_per_tok']}, n_group {t['n_group']}, "
      f"topk_group {t['topk_group']}, scale {t['routed_scaling_factor']}, "
      f"norm_topk_prob {t['norm_topk_prob']} | none (all layers dense) |")
    rp = t["rope_parameters"]
    w(f"| rope | yarn factor {rp['factor']}, original_max_position_embeddings "
      f"{rp['original_max_position_embeddings']}, theta {rp['rope_theta']}, mscale {rp['mscale']}, "
      f"mscale_all_dim {rp['mscale_all_dim']}, max_position_embeddings "
      f"{t['max_position_embeddings']} | same |")
    w("")
    w("## Sizes and training\n")
    w("| model | params total | params active / token | model.safetensors | steps x batch | "
      "train tokens | wall time | tokens/s | final loss |")
    w("|---|---|---|---|---|---|---|---|---|")
    for n in NAMES:
        s = st[n]
        w(f"| {n} | {s['params']['total'] / 1e6:.2f}M | {s['params']['active_per_token'] / 1e6:.2f}M | "
          f"{size[n] / 1e6:.1f} MB | {s['steps']} x {s['batch']} | {s['train_tokens'] / 1e6:.2f}M | "
          f"{s['wall_s'] / 60:.1f} min | {s['tokens_per_s']:.0f} | {s['final_loss_ema']:.3f} |")
    w("")
    sd, sw, stg = st["draft"], st["draft-weak"], st["target"]
    w("Command: `tools/train/train_all.sh` (pinned versions in `tools/train/requirements.txt`), "
      "seeded; one CPU thread per job. Stage 1 trains `draft` "
      f"({sd['steps']} steps, lr {sd['lr']}, seed {sd['seed']}) and `draft-weak` ({sw['steps']} steps, "
      f"lr {sw['lr']}, seed {sw['seed']}: stopped early on purpose) at the same time (AdamW, warm-up "
      "then cosine decay, batch 16). Stage 2 builds the target by split sparse upcycling of the "
      "trained draft (`train.upcycle_from_draft`): layer i of the draft becomes layer i of the "
      "target; in the MoE layers the draft's dense MLP (768 units) is split in two halves, the "
      "shared expert computes the first half and every routed expert starts as a copy of the "
      "second half with its down projection divided by `routed_scaling_factor`, so with "
      "`norm_topk_prob` the upcycled target computes exactly the draft's logits whatever the "
      f"routing (asserted; measured max logit difference {stg.get('upcycle_max_logit_diff') or 0:.1e}). "
      f"Each routed expert is then scaled element-wise by (1 + {stg.get('upcycle_noise')} N(0,1)), "
      f"and fine-tuning ({stg['steps']} steps, lr {stg['lr']}, aux-loss-free router-bias balancing: "
      "gamma 1e-3 every 10 steps) repairs that noise through the experts each token is routed to, "
      "so the routed experts carry real weight (see the routing figures below). "
      f"Measured wall time for all training: {wall / 60:.1f} min on a 2-core machine "
      f"({tall.get('note', 'stages as in train_all.sh')}); tokens count non-padding tokens. "
      "CI never trains. Total size of `models/` (including `golden/`, which is not produced here): "
      f"{total / 1e6:.1f} MB.\n")
    w("## Evaluation\n")
    w(f"`tools/train/evaluate.py`, {ev['n_problems']} held-out problems, {ev['compute']}.\n")
    w("| target thinking budget | answer accuracy |")
    w("|---|---|")
    w(f"| full (natural length) | {pct(acc['full'])} |")
    w(f"| cut at 50% (`</think>` forced) | {pct(acc['cut_50'])} |")
    w(f"| cut at 25% | {pct(acc['cut_25'])} |")
    w(f"| no thinking | {pct(acc['none'])} |")
    w("")
    w(f"Target scratchpads exactly equal to the reference solution: "
      f"{pct(ev['target']['thinking_trace_exact_match'])}. Natural thinking length (tokens): mean "
      f"{tl['mean']}, min {tl['min']}, p10 {tl['p10']}, median {tl['p50']}, p90 {tl['p90']}, "
      f"max {tl['max']}; histogram {json.dumps(tl['histogram_by_10'])}. Accuracy by number of "
      f"operations: {json.dumps({k: (None if v is None else round(v, 3)) for k, v in ev['target']['accuracy_by_n_ops'].items()})}.\n")
    w("The thinking budget acts as a step, not a curve: the answer is the value after the last "
      "operation, so a scratchpad cut anywhere before its end leaves the model guessing (chance is "
      "10%).\n")
    ml = ev["target"].get("moe_layers", [])
    if ml:
        w("MoE layers (first 64 traces): " + "; ".join(
            f"layer {m['layer']}: routed/shared output norm {m['routed_over_shared_norm']}, "
            f"{m['experts_used']} experts used, max expert share {m['max_expert_share']}, bias "
            f"[{m['bias_min']}, {m['bias_max']}]" for m in ml) + ".")
    ra = ev["target"].get("routing_ablation")
    if ra:
        w(f"Routing ablation (teacher-forced greedy agreement with the target's own argmax on 200 "
          f"traces): every token sent to the wrong experts {pct(ra['agreement_wrong_experts'])}, "
          f"router bias ignored {pct(ra['agreement_bias_ignored'])}. Wrong routing moves the logits "
          "but flips few or no greedy tokens on this easy task (the routed experts were upcycled "
          "from one MLP half), so the engine's routing is checked exactly by the golden-logit tests "
          "instead.\n")
    w("Draft agreement with the target: teacher-forced on the target's own greedy traces, the fraction "
      "of positions where the draft's argmax equals the target's (the expected per-token acceptance "
      "under greedy verification); expected tokens per verification step walks the traces with a "
      "k-token draft (accepted prefix + one target token).\n")
    w("| draft | agreement (thinking) | agreement (thinking + answer) | tokens / verify k=2 | k=4 | "
      "k=6 | its own accuracy, full thinking |")
    w("|---|---|---|---|---|---|---|")
    for n, r in ev["drafts"].items():
        e = r["expected_tokens_per_verify"]
        w(f"| {n} | {pct(r['agreement_thinking'])} | {pct(r['agreement_thinking_plus_answer'])} | "
          f"{e['k=2']} | {e['k=4']} | {e['k=6']} | {pct(r['own_answer_accuracy_full_thinking'])} |")
    w("")
    w("## Workload files (`models/workload/`)\n")
    w("- `prompts.jsonl`: the first 320 held-out problems, one JSON per line: `prompt` "
      "(`<bos>Q: ...<think>`, exactly what the model continues), `prompt_token_ids`, `answer`, "
      "`n_ops`, `natural_thinking_tokens` (length of the target's greedy scratchpad).")
    w("- `prompts.txt`: the same prompt texts, one per line.")
    w("- `reference_greedy.jsonl`: the target's greedy continuations of the first 50 prompts "
      "(`prompt_token_ids`, `output_token_ids`, at most 128 new tokens, ending with `<eos>`), "
      "computed in fp32 from the bf16 weights without padding. bf16 compute can flip near-ties, so "
      "check an engine against these in fp32. Batched (left-padded) generation reproduced "
      f"{pct(ev.get('reference_matches_batched_generation'))} of them.\n")
    w("## License\n")
    w("MIT, like the rest of the project. The training data is synthetic, generated by "
      "`tools/train/task.py`; no third-party data or weights were used.")
    open(os.path.join(M, "README.md"), "w").write("\n".join(L) + "\n")
    print("wrote", os.path.join(M, "README.md"))


if __name__ == "__main__":
    main()
