"""Synthetic reasoning task and tokenizer for the bundled specmla models.

Task: a mod-10 "program evaluation" chain. A question names a start value (always written
``x=<digit>``) and a list of 4..10 operations labelled by consecutive letters from a random
starting letter (``k+3``, ``l-2`` ...; x is skipped), each adding or subtracting 1..3. The scratchpad
evaluates one operation per step (``k+3:4+3=7;``), so every step is a single-token lookup in the
question plus a one-digit table lookup, and the answer (the last value) cannot be produced
without the steps. Sample text:

    <bos>Q: Let x=4. Evaluate mod 10: k+3,l-2,m+1<think>k+3:4+3=7;l-2:7-2=5;m+1:5+1=6;</think>The answer is 6.<eos>

The tokenizer is a BPE trained with the `tokenizers` library. Its pre-tokenizer isolates every
digit, every signed digit (``+3``, ``-7``: one token each), every word and every other character,
so merges only happen inside words; decoding fuses tokens back, so decode(encode(x)) == x.
"""
from __future__ import annotations

import random
import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

PAD, BOS, EOS, THINK, END_THINK = "<pad>", "<bos>", "<eos>", "<think>", "</think>"
SPECIAL_TOKENS = [PAD, BOS, EOS, THINK, END_THINK]  # ids 0..4 in this order

MIN_OPS, MAX_OPS = 4, 10
# Operations add or subtract 1..MAX_STEP. Small steps keep the one-step table learnable by small
# models (the result is correlated with the previous value alone, which gives the gradient a
# first-order signal; with +0..9 both operands alone carry no information about the result).
MAX_STEP = 3
# Variable names: lowercase letters except x (x names the start value).
VAR_NAMES = [c for c in string.ascii_lowercase if c != "x"]

QUESTION_TEMPLATES = [
    "Q: Let x={s}. Evaluate mod 10: {ops}",
    "Q: Start from x={s} and apply mod 10: {ops}",
    "Q: With x={s}, compute mod 10 in order: {ops}",
    "Q: Begin with x={s}. Run the program mod 10: {ops}",
    "Q: Given x={s}, work out mod 10 the steps {ops}",
    "Q: Take x={s}. What is the result mod 10 of {ops}",
]
OP_SEPARATORS = [",", ", ", " "]
ANSWER_TEMPLATE = "The answer is {a}."


def make_problem(rng: random.Random, n_ops: int | None = None) -> dict:
    """One problem: start value, labelled ops, question text, scratchpad steps, answer."""
    n = n_ops if n_ops is not None else rng.randint(MIN_OPS, MAX_OPS)
    start = rng.randint(0, 9)
    first = rng.randint(0, len(VAR_NAMES) - n)
    names = VAR_NAMES[first:first + n]
    ops = [(rng.choice("+-"), rng.randint(1, MAX_STEP)) for _ in range(n)]
    sep = rng.choice(OP_SEPARATORS)
    question = rng.choice(QUESTION_TEMPLATES).format(
        s=start, ops=sep.join(f"{nm}{sg}{d}" for nm, (sg, d) in zip(names, ops))
    )
    steps = []
    v = start
    for nm, (sg, d) in zip(names, ops):
        nv = (v + d) % 10 if sg == "+" else (v - d) % 10
        steps.append(f"{nm}{sg}{d}:{v}{sg}{d}={nv};")
        v = nv
    return {"question": question, "steps": steps, "answer": str(v), "n_ops": n}


def prompt_text(p: dict) -> str:
    """What the model is given: `<bos>` question `<think>`."""
    return f"{BOS}{p['question']}{THINK}"


def thinking_text(p: dict) -> str:
    return "".join(p["steps"])


def answer_text(p: dict) -> str:
    return ANSWER_TEMPLATE.format(a=p["answer"])


def full_text(p: dict) -> str:
    return f"{prompt_text(p)}{thinking_text(p)}{END_THINK}{answer_text(p)}{EOS}"


def pre_tokenizer():
    # signed digit | digit | word | any other single character (spaces included)
    return pre_tokenizers.Split(Regex(r"[+\-][0-9]|[0-9]|[A-Za-z]+|[^A-Za-z0-9]"), behavior="isolated")


def train_tokenizer(seed: int = 0, n_samples: int = 20000) -> Tokenizer:
    """Train the BPE tokenizer on generated samples (deterministic for a seed)."""
    rng = random.Random(seed)
    corpus = []
    for _ in range(n_samples):
        p = make_problem(rng)
        corpus.append(p["question"] + thinking_text(p) + answer_text(p))
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizer()
    tok.decoder = decoders.Fuse()
    alphabet = sorted(set(string.ascii_letters + string.digits + string.punctuation + " "))
    trainer = trainers.BpeTrainer(
        vocab_size=256,
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=alphabet,
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    return tok


def encode(tok: Tokenizer, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids


def encode_sample(tok: Tokenizer, p: dict, cut_at: int | None = None):
    """Token ids and loss mask for one training sample.

    The mask covers thinking + `</think>` + answer + `<eos>` (not the prompt). With `cut_at`, the
    thinking is truncated to its first `cut_at` tokens, then `</think>` and the answer follow; the
    `</think>` of a cut sample is not trained on (so the model never learns to stop early), the
    answer is (so a forced early end is in distribution).
    """
    prompt = encode(tok, prompt_text(p))
    think = encode(tok, thinking_text(p))
    end = encode(tok, END_THINK)
    ans = encode(tok, answer_text(p) + EOS)
    if cut_at is not None:
        think = think[:cut_at]
    ids = prompt + think + end + ans
    mask = [0] * len(prompt) + [1] * len(think) + [0 if cut_at is not None else 1] + [1] * len(ans)
    return ids, mask


def problem_stream(seed: int):
    """Infinite deterministic stream of training problems for a seed (held-out sets use other seeds)."""
    rng = random.Random(seed)
    while True:
        yield make_problem(rng)


def heldout_problems(n: int, seed: int = 12345) -> list[dict]:
    """Held-out problems, disjoint from training in the sense of a separate seed; exact question
    strings seen in training are very unlikely (up to 10 * 6 * 3 * 16 * 6^10 combinations)."""
    rng = random.Random(seed)
    return [make_problem(rng) for _ in range(n)]
