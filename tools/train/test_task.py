"""Checks of the task generator and tokenizer (plain asserts; run: python tools/train/test_task.py,
or under pytest). Fast: no model is built."""
from __future__ import annotations

import os
import random
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import task  # noqa: E402

TOK = task.train_tokenizer(seed=0)


def test_special_token_ids():
    for i, s in enumerate(task.SPECIAL_TOKENS):
        assert TOK.token_to_id(s) == i, s


def test_roundtrip_every_sample():
    rng = random.Random(3)
    for _ in range(20000):
        s = task.full_text(task.make_problem(rng))
        ids = task.encode(TOK, s)
        assert TOK.decode(ids, skip_special_tokens=False) == s, s


def test_single_token_lookups():
    for sign in "+-":
        for d in range(1, task.MAX_STEP + 1):
            assert task.encode(TOK, f"{sign}{d}") == [TOK.token_to_id(f"{sign}{d}")]
    for d in range(10):
        assert len(task.encode(TOK, str(d))) == 1
    p = task.make_problem(random.Random(5), n_ops=7)
    think = task.encode(TOK, task.thinking_text(p))
    assert len(think) == 8 * 7  # name, op, ':', value, op, '=', value, ';'


def test_answer_is_the_chain_result():
    rng = random.Random(11)
    for _ in range(2000):
        p = task.make_problem(rng)
        v = int(re.search(r"x=(\d)", p["question"]).group(1))
        for step in p["steps"]:
            m = re.fullmatch(r"([a-z])([+-])(\d):(\d)\2\3=(\d);", step)
            assert m and int(m.group(4)) == v
            v = (v + int(m.group(3))) % 10 if m.group(2) == "+" else (v - int(m.group(3))) % 10
            assert int(m.group(5)) == v
        assert p["answer"] == str(v)
        assert task.MIN_OPS <= p["n_ops"] <= task.MAX_OPS


def test_cut_sample_mask():
    p = task.make_problem(random.Random(8), n_ops=5)
    ids, mask = task.encode_sample(TOK, p, cut_at=10)
    end = TOK.token_to_id(task.END_THINK)
    k = ids.index(end)
    assert mask[k] == 0 and all(mask[k + 1:])
    assert TOK.decode(ids[k + 1:], skip_special_tokens=True) == task.answer_text(p)
    full, fmask = task.encode_sample(TOK, p)
    assert fmask[full.index(end)] == 1
    assert sum(fmask) == len(full) - len(task.encode(TOK, task.prompt_text(p)))


if __name__ == "__main__":
    for name, fn in list(globals().items()):
        if name.startswith("test_"):
            fn()
            print("ok", name)
