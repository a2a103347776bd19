#!/usr/bin/env python3
"""Mutation experiment over the `specmla generate` CLI: one corrupted model file per run.

For each case the script copies the model directory (default ``models/draft``) to a fresh
temporary directory, applies exactly ONE mutation to one of its files, runs

    specmla generate --model TMPDIR --prompt <first line of models/workload/prompts.txt>
                     --max-tokens 8 --json --threads T

with a per-run timeout and classifies the outcome:

    OK           exit 0
    CLEAN_ERROR  exit 1 with the CLI's ``specmla: error: ...`` line (src/bin/specmla/main.rs);
                 also when a panic inside a dependency was contained and turned into that error
                 (the default panic hook still prints its ``panicked at`` line)
    PANIC        exit 101, or ``panicked at`` in stderr without the clean error exit
    ABORT        killed by a signal (SIGABRT from a failed allocation, SIGSEGV, SIGKILL, ...)
    UNCLEAN_EXIT any other non-zero exit, or exit 1 without the CLI's error line
    TIMEOUT      still running after --timeout seconds (the process group is killed)

Independently of the class, a run that takes more than ``--slow-factor`` x the median of five
unmutated baseline runs (and at least ``--slow-min-extra`` seconds more than it) is flagged
SLOW. Time is the child's CPU time (user + sys, from wait4) by default, so other load on a
shared machine does not make a run look slow; ``--slow-by wall`` uses wall time instead. A SLOW
run is re-run twice and kept SLOW only if both re-runs are slow too. Wall time, CPU time and
peak RSS are recorded for every case. An exit-0 run whose JSON has ``finish_reason: "error"``
(the request failed but the CLI still exited 0) is counted as OK and flagged FINISH_ERROR.

Mutation kinds (one per case, drawn with fixed weights):

    st_len_flip      bit/byte flip in the 8-byte little-endian header length of model.safetensors
    st_header_flip   bit/byte flip inside the JSON header of model.safetensors
    st_header_edit   structural edit of the header JSON (dtype / shape / data_offsets / key /
                     __metadata__), re-serialised with a consistent length prefix
    st_header_len    the header length replaced by a random value (0, tiny, huge, off by k, ...)
    st_body_flip     byte flips in the tensor data of model.safetensors
    st_truncate      model.safetensors truncated at a random offset
    config_field     one config.json field (nested ones too, e.g. rope_parameters.factor) set to
                     null / -1 / 0 / 1e30 / "x" / [] / {} / 2^40 / true, or deleted
    config_char      one character of config.json changed
    tok_char         one character (or raw byte) of tokenizer.json changed
    tok_struct       structural edit of tokenizer.json: a key / list element removed, or a value
                     replaced by one of another JSON type
    tokcfg_mut       tokenizer_config.json: a field set to an odd value, or one character changed
    gencfg_mut       generation_config.json: a field set to an odd value, or one character changed
    remove_file      one of the model's files removed

``--sweep config|tok-struct|tok-chars`` enumerates one family exhaustively instead (every
config.json path x every odd value; every tokenizer.json path outside the vocabulary x removal /
retyping; every tokenizer.json character replaced), so rare pairs are not left to chance.

Every case draws from its own ``random.Random("<seed>:<index>")``, so a given seed always yields
the same cases, whatever ``--jobs`` is (a sweep's case ``i`` is always the same edit). Every
case's result goes to ``--out``/results.jsonl and the counts to ``--out``/summary.json; each
PANIC / ABORT / UNCLEAN_EXIT / TIMEOUT / SLOW / FINISH_ERROR case is saved under ``--out`` as
``<index>-<kind>-<class>/`` holding ``case.json`` (mutation, description, command, result),
``stderr.txt``, ``stdout.txt`` and the mutated file (or a ``REMOVED-<name>`` marker).
``--replay DIR`` re-runs saved cases (DIR is one case directory or an ``--out`` directory
holding several) against the current ``--bin`` and prints old and new class. The exit status
is 1 when any bad case was found (or is still bad on replay), else 0.

``--link`` symlinks the unmutated files instead of copying them (for large models such as
``models/target``); the mutated file is always a fresh regular file.

Child processes get an address-space limit (``--mem-limit-mb``, default 4096; 0 = none) so a
runaway allocation aborts instead of pushing a shared machine into the OOM killer; the
limit is recorded in every saved case.json so an ABORT can be told apart from a natural
allocation failure.

Python 3 standard library only. Examples (from the repository root):

    cargo build --release --bin specmla && cp target/release/specmla /tmp/specmla-mut
    nice -n 19 python3 tools/fuzz/mutate_cli.py --bin /tmp/specmla-mut --seed 1 \\
        --count 2000 --out /tmp/mutate-out-1
    python3 tools/fuzz/mutate_cli.py --bin /tmp/specmla-mut --replay /tmp/mutate-out-1
    python3 tools/fuzz/mutate_cli.py --bin /tmp/specmla-mut --seed 1 --only 17 --keep-dir
    nice -n 19 python3 tools/fuzz/mutate_cli.py --bin /tmp/specmla-mut --sweep config \\
        --out /tmp/mutate-out-sweep-config
    python3 tools/fuzz/mutate_cli.py --bin /tmp/specmla-mut --model models/target --link \\
        --sweep config --out /tmp/mutate-out-target-sweep-config
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import copy
import json
import os
import random
import resource
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Values a config field is set to (2^40 as an exact JSON integer).
ODD_VALUES = [None, -1, 0, 1e30, "x", [], {}, 2**40, True]
DELETE = "<delete>"

# Kind -> relative weight (out of 100).
KIND_WEIGHTS = [
    ("st_len_flip", 4),
    ("st_header_flip", 10),
    ("st_header_edit", 10),
    ("st_header_len", 4),
    ("st_body_flip", 7),
    ("st_truncate", 7),
    ("config_field", 22),
    ("config_char", 4),
    ("tok_char", 12),
    ("tok_struct", 12),
    ("tokcfg_mut", 3),
    ("gencfg_mut", 3),
    ("remove_file", 2),
]

BAD_CLASSES = ("PANIC", "ABORT", "UNCLEAN_EXIT", "TIMEOUT")
ALL_CLASSES = ("OK", "CLEAN_ERROR") + BAD_CLASSES

SAFETENSORS = "model.safetensors"
CONFIG = "config.json"
TOKENIZER = "tokenizer.json"
TOKCFG = "tokenizer_config.json"
GENCFG = "generation_config.json"


# --------------------------------------------------------------------------------------------
# JSON helpers
# --------------------------------------------------------------------------------------------


def json_paths(value, prefix=()):
    """Every path (tuple of keys / indices) inside a JSON value, containers included."""
    out = []
    if isinstance(value, dict):
        for k, v in value.items():
            out.append(prefix + (k,))
            out.extend(json_paths(v, prefix + (k,)))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out.append(prefix + (i,))
            out.extend(json_paths(v, prefix + (i,)))
    return out


def path_str(path):
    return ".".join(str(p) for p in path) or "(document)"


def get_parent(doc, path):
    node = doc
    for p in path[:-1]:
        node = node[p]
    return node


def set_path(doc, path, value):
    """Set (or, for DELETE, remove) the value at `path`; returns the old value."""
    parent = get_parent(doc, path)
    old = parent[path[-1]]
    if value is DELETE:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return old


def type_name(v):
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


def same_json(a, b):
    """JSON equality (Python's `True == 1` and `0 == 0.0 == False` do not count)."""
    return type_name(a) == type_name(b) and json.dumps(a) == json.dumps(b)


def short(v, n=60):
    s = json.dumps(v) if not isinstance(v, str) or len(v) < n else json.dumps(v[:n] + "...")
    return s if len(s) <= n + 10 else s[: n + 7] + "..."


def dump_json(doc):
    return (json.dumps(doc, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


# Characters a one-character edit may write: JSON syntax, digits, letters, odd code points.
EDIT_CHARS = '{}[]",:\\ 0123456789-+.eEtfnulxyzAZ\t\n' + "\u00e9\u2028\u0000\U0001f600"


def char_edit(rng, data: bytes):
    """Change one character of a UTF-8 text file (or, 1 time in 8, one raw byte).

    Returns (new bytes, position, description); the position is a byte offset for a raw-byte
    edit and a character offset otherwise."""
    if rng.random() < 0.125:
        pos = rng.randrange(len(data))
        out = bytearray(data)
        old = out[pos]
        new = rng.choice([b for b in range(256) if b != old])
        out[pos] = new
        return bytes(out), pos, f"byte {pos}: 0x{old:02x} -> 0x{new:02x}"
    text = data.decode("utf-8", errors="surrogateescape")
    pos = rng.randrange(len(text))
    old = text[pos]
    new = rng.choice([c for c in EDIT_CHARS if c != old])
    text = text[:pos] + new + text[pos + 1 :]
    return text.encode("utf-8", errors="surrogateescape"), pos, f"char {pos}: {old!r} -> {new!r}"


def field_edit(rng, data: bytes, allow_delete=True):
    """Set one field of a JSON document (any depth) to an odd value, or delete it."""
    doc = json.loads(data)
    paths = json_paths(doc)
    path = rng.choice(paths)
    old = get_parent(doc, path)[path[-1]]
    choices = [v for v in ODD_VALUES if not same_json(v, old)]
    choices += [DELETE] if allow_delete else []
    value = copy.deepcopy(rng.choice(choices))
    old = set_path(doc, path, value)
    what = "deleted" if value is DELETE else f"{short(old)} -> {short(value)}"
    return dump_json(doc), f"{path_str(path)}: {what}"


# --------------------------------------------------------------------------------------------
# Mutations. Each takes (rng, model_dir) and returns (file name, new bytes or None to remove,
# human-readable description).
# --------------------------------------------------------------------------------------------


def read(model, name):
    return (model / name).read_bytes()


def st_split(data: bytes):
    (n,) = struct.unpack("<Q", data[:8])
    return n, data[8 : 8 + n], data[8 + n :]


def flip(rng, buf: bytearray, lo: int, hi: int):
    pos = rng.randrange(lo, hi)
    old = buf[pos]
    if rng.random() < 0.5:
        bit = rng.randrange(8)
        buf[pos] ^= 1 << bit
        return pos, f"offset {pos}: bit {bit} flipped (0x{old:02x} -> 0x{buf[pos]:02x})"
    buf[pos] = rng.choice([b for b in range(256) if b != old])
    return pos, f"offset {pos}: byte 0x{old:02x} -> 0x{buf[pos]:02x}"


def m_st_len_flip(rng, model):
    buf = bytearray(read(model, SAFETENSORS))
    _, desc = flip(rng, buf, 0, 8)
    return SAFETENSORS, bytes(buf), "header length: " + desc


def m_st_header_flip(rng, model):
    data = read(model, SAFETENSORS)
    n, _, _ = st_split(data)
    buf = bytearray(data)
    n_flips = rng.choice([1, 1, 1, 2, 4])
    flips = [flip(rng, buf, 8, 8 + n) for _ in range(n_flips)]
    pos = flips[0][0]
    ctx = data[max(8, pos - 20) : pos + 20].decode("utf-8", "replace")
    descs = "; ".join(d for _, d in flips)
    return SAFETENSORS, bytes(buf), f"header JSON: {descs} (near {ctx!r})"


def m_st_header_edit(rng, model):
    data = read(model, SAFETENSORS)
    n, header, body = st_split(data)
    doc = json.loads(header)
    names = sorted(k for k in doc if k != "__metadata__")
    name = rng.choice(names)
    t = doc[name]
    op = rng.choice(
        ["dtype", "shape_dim", "shape_len", "offsets", "offsets_swap", "drop_tensor",
         "rename", "dup_offsets", "metadata", "field_odd"]
    )
    if op == "dtype":
        new = rng.choice([d for d in ["F32", "F16", "BF16", "F8_E4M3", "I8", "U8", "I64",
                                      "BOOL", "F64", "F8_E5M2", "X", ""] if d != t["dtype"]])
        desc = f"{name}.dtype: {t['dtype']} -> {new}"
        t["dtype"] = new
    elif op == "shape_dim":
        if t["shape"]:
            i = rng.randrange(len(t["shape"]))
            new = rng.choice([v for v in [0, 1, t["shape"][i] + 1, t["shape"][i] * 2, 2**32,
                                          2**40, 2**63, 2**64 - 1, -1] if v != t["shape"][i]])
            desc = f"{name}.shape[{i}]: {t['shape'][i]} -> {new}"
            t["shape"][i] = new
        else:
            desc = f"{name}.shape: [] -> [2]"
            t["shape"] = [2]
    elif op == "shape_len":
        old = list(t["shape"])
        if t["shape"] and rng.random() < 0.5:
            t["shape"].pop()
        else:
            t["shape"].append(rng.choice([1, 2]))
        desc = f"{name}.shape: {old} -> {t['shape']}"
    elif op == "offsets":
        i = rng.randrange(2)
        old = t["data_offsets"][i]
        new = rng.choice([v for v in [0, old + 1, max(0, old - 1), old + 2, len(body),
                                      len(body) + 1, 2**40, 2**64 - 1] if v != old])
        t["data_offsets"][i] = new
        desc = f"{name}.data_offsets[{i}]: {old} -> {new}"
    elif op == "offsets_swap":
        t["data_offsets"].reverse()
        desc = f"{name}.data_offsets reversed -> {t['data_offsets']}"
    elif op == "drop_tensor":
        del doc[name]
        desc = f"tensor {name} removed from the header"
    elif op == "rename":
        doc[name + ".x"] = doc.pop(name)
        desc = f"tensor {name} renamed to {name}.x"
    elif op == "dup_offsets":
        other = rng.choice([n for n in names if n != name])
        desc = f"{name}.data_offsets := {other}.data_offsets ({doc[other]['data_offsets']})"
        t["data_offsets"] = list(doc[other]["data_offsets"])
    elif op == "metadata":
        new = rng.choice([None, 1, "x", [], {"format": 1}, {"format": "pt", "k": {}}])
        desc = f"__metadata__: {short(doc.get('__metadata__'))} -> {short(new)}"
        doc["__metadata__"] = new
    else:  # field_odd
        key = rng.choice(["dtype", "shape", "data_offsets"])
        new = copy.deepcopy(rng.choice(ODD_VALUES + [DELETE]))
        if new is DELETE:
            del t[key]
            desc = f"{name}.{key} deleted"
        else:
            desc = f"{name}.{key}: -> {short(new)}"
            t[key] = new
    raw = json.dumps(doc, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return SAFETENSORS, struct.pack("<Q", len(raw)) + raw + body, "header edit: " + desc


def m_st_header_len(rng, model):
    data = read(model, SAFETENSORS)
    n, _, _ = st_split(data)
    new = rng.choice([
        0, 1, 2, 7, n - 8, n - 1, n + 1, n + 8, n + rng.randrange(1, 4096),
        rng.randrange(0, n), len(data) - 8, len(data) - 7, len(data), 2**31, 2**32,
        100_000_000, 2**40, 2**63, 2**64 - 1, rng.randrange(2**64),
    ])
    new = max(0, min(new, 2**64 - 1))
    if new == n:
        new = n + 1
    return (SAFETENSORS, struct.pack("<Q", new) + data[8:],
            f"header length {n} -> {new}")


def m_st_body_flip(rng, model):
    data = read(model, SAFETENSORS)
    n, _, _ = st_split(data)
    buf = bytearray(data)
    n_flips = rng.choice([1, 1, 4, 16, 256])
    descs = [flip(rng, buf, 8 + n, len(buf))[1] for _ in range(n_flips)]
    extra = f" (+{n_flips - 3} more)" if n_flips > 3 else ""
    return SAFETENSORS, bytes(buf), f"body: {n_flips} flip(s): {'; '.join(descs[:3])}{extra}"


def m_st_truncate(rng, model):
    data = read(model, SAFETENSORS)
    n, _, _ = st_split(data)
    r = rng.random()
    if r < 0.3:
        at = rng.randrange(0, 8 + n)          # inside the length or the header
    elif r < 0.4:
        at = len(data) - rng.randrange(1, 9)  # the last few bytes
    else:
        at = rng.randrange(8 + n, len(data))  # inside the tensor data
    return SAFETENSORS, data[:at], f"truncated to {at} of {len(data)} bytes (header ends at {8 + n})"


def m_config_field(rng, model):
    data, desc = field_edit(rng, read(model, CONFIG))
    return CONFIG, data, desc


def m_config_char(rng, model):
    data, _, desc = char_edit(rng, read(model, CONFIG))
    return CONFIG, data, desc


def m_tok_char(rng, model):
    data = read(model, TOKENIZER)
    new, pos, desc = char_edit(rng, data)
    ctx = data.decode("utf-8", "replace")[max(0, pos - 15) : pos + 15]
    return TOKENIZER, new, f"{desc} (near {ctx!r})"


def m_tok_struct(rng, model):
    doc = json.loads(read(model, TOKENIZER))
    paths = json_paths(doc)
    # Half the time pick among the structural keys (not the ~thousands of vocab / merge entries).
    if rng.random() < 0.5:
        structural = [p for p in paths
                      if not (len(p) >= 3 and p[0] == "model" and p[1] in ("vocab", "merges"))]
        path = rng.choice(structural)
    else:
        path = rng.choice(paths)
    old = get_parent(doc, path)[path[-1]]
    op = rng.choice(["remove", "retype", "retype"])
    if op == "remove":
        set_path(doc, path, DELETE)
        desc = f"{path_str(path)} removed (was {short(old)})"
    else:
        choices = [v for v in ODD_VALUES if type_name(v) != type_name(old)]
        if isinstance(old, str):
            choices += ["", "x" * 3, "<eos>", "[", "(?", "\\"]
        new = copy.deepcopy(rng.choice(choices))
        set_path(doc, path, new)
        desc = f"{path_str(path)}: {short(old)} -> {short(new)}"
    return TOKENIZER, dump_json(doc), desc


def _small_json_mut(rng, model, name):
    if rng.random() < 0.6:
        data, desc = field_edit(rng, read(model, name))
    else:
        data, _, desc = char_edit(rng, read(model, name))
    return name, data, desc


def m_tokcfg_mut(rng, model):
    return _small_json_mut(rng, model, TOKCFG)


def m_gencfg_mut(rng, model):
    return _small_json_mut(rng, model, GENCFG)


def m_remove_file(rng, model):
    names = sorted(p.name for p in model.iterdir() if p.is_file())
    name = rng.choice(names)
    return name, None, f"{name} removed"


MUTATORS = {name: globals()["m_" + name] for name, _ in KIND_WEIGHTS}


def draw_case(seed: int, index: int, model: Path, only_kinds=None):
    """The deterministic mutation of case `index` for `seed`: (kind, file, bytes|None, desc).
    `only_kinds` restricts the draw to those kinds (same weights among them)."""
    rng = random.Random(f"{seed}:{index}")
    table = [(k, w) for k, w in KIND_WEIGHTS if not only_kinds or k in only_kinds]
    kinds = [k for k, _ in table]
    weights = [w for _, w in table]
    kind = rng.choices(kinds, weights)[0]
    name, data, desc = MUTATORS[kind](rng, model)
    return kind, name, data, desc


# --------------------------------------------------------------------------------------------
# Exhaustive sweeps (--sweep): the same mutation families, enumerated instead of drawn, so rare
# (field, value) pairs are not left to chance. Case `index` of a sweep is always the same edit.
# --------------------------------------------------------------------------------------------


def sweep_config(model):
    """Every config.json path (nested ones too) x every odd value (and deletion)."""
    base = read(model, CONFIG)
    doc = json.loads(base)
    for path in json_paths(doc):
        old = get_parent(doc, path)[path[-1]]
        for value in [v for v in ODD_VALUES if not same_json(v, old)] + [DELETE]:
            def make(path=path, value=value, old=old):
                d = json.loads(base)
                set_path(d, path, copy.deepcopy(value))
                what = "deleted" if value is DELETE else f"{short(old)} -> {short(value)}"
                return "config_field", CONFIG, dump_json(d), f"{path_str(path)}: {what}"
            yield make


def sweep_tok_struct(model):
    """Every tokenizer.json path outside the vocab / merge entries x (removal, each other type)."""
    base = read(model, TOKENIZER)
    doc = json.loads(base)
    for path in json_paths(doc):
        if len(path) >= 3 and path[0] == "model" and path[1] in ("vocab", "merges"):
            continue
        old = get_parent(doc, path)[path[-1]]
        for value in [DELETE] + [v for v in ODD_VALUES if type_name(v) != type_name(old)]:
            def make(path=path, value=value, old=old):
                d = json.loads(base)
                set_path(d, path, copy.deepcopy(value))
                what = (f"removed (was {short(old)})" if value is DELETE
                        else f"{short(old)} -> {short(value)}")
                return "tok_struct", TOKENIZER, dump_json(d), f"{path_str(path)}: {what}"
            yield make


def sweep_tok_chars(model):
    """Every character of tokenizer.json replaced by 'x'; before the vocabulary also by '"',
    '}' and ' ' (the pre-tokenizer / decoder / added-token sections)."""
    base = read(model, TOKENIZER)
    text = base.decode("utf-8")
    vocab_at = text.find('"vocab"')
    for pos, ch in enumerate(text):
        subs = ["x"] + (['"', "}", " "] if pos < vocab_at else [])
        for sub in subs:
            if sub == ch:
                continue
            def make(pos=pos, sub=sub, ch=ch):
                new = (text[:pos] + sub + text[pos + 1 :]).encode("utf-8")
                ctx = text[max(0, pos - 15) : pos + 15]
                return ("tok_char", TOKENIZER, new,
                        f"char {pos}: {ch!r} -> {sub!r} (near {ctx!r})")
            yield make


SWEEPS = {"config": sweep_config, "tok-struct": sweep_tok_struct, "tok-chars": sweep_tok_chars}


# --------------------------------------------------------------------------------------------
# Running and classifying
# --------------------------------------------------------------------------------------------


def limit_child(mem_mb):
    def fn():
        os.setsid()
        if mem_mb:
            lim = mem_mb * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
        # No core dumps for crashing children.
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return fn


def run_cli(args, model_dir: Path):
    """Run the CLI on `model_dir`; returns a result dict (rc, wall, cpu, stdout, stderr, ...)."""
    cmd = [
        str(args.bin), "generate", "--model", str(model_dir), "--prompt", args.prompt,
        "--max-tokens", str(args.max_tokens), "--json", "--threads", str(args.threads),
    ]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                preexec_fn=limit_child(args.mem_limit_mb))
        box = {}

        def waiter():
            _, status, ru = os.wait4(proc.pid, 0)
            box["status"], box["ru"] = status, ru
            box["wall"] = time.monotonic() - t0

        th = threading.Thread(target=waiter, daemon=True)
        th.start()
        th.join(args.timeout)
        timed_out = th.is_alive()
        if timed_out:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            th.join()
        proc.returncode = os.waitstatus_to_exitcode(box["status"])  # reaped by wait4 above
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode("utf-8", "replace")
        stderr = err.read().decode("utf-8", "replace")
    ru = box["ru"]
    return {
        "cmd": cmd,
        "rc": proc.returncode,
        "timed_out": timed_out,
        "wall_s": round(box["wall"], 4),
        "cpu_s": round(ru.ru_utime + ru.ru_stime, 4),
        "max_rss_mb": round(ru.ru_maxrss / 1024, 1),
        "stdout": stdout,
        "stderr": stderr,
    }


def finish_reason(res):
    """`finish_reason` of the first JSON line of stdout, or None."""
    try:
        return json.loads(res["stdout"].splitlines()[0]).get("finish_reason")
    except (ValueError, IndexError, AttributeError):
        return None


def classify(res):
    rc, err = res["rc"], res["stderr"]
    if res["timed_out"]:
        return "TIMEOUT"
    if rc < 0:
        return "ABORT"
    if rc == 101 or ("panicked at" in err and not (rc == 1 and "specmla: error:" in err)):
        return "PANIC"
    if rc == 0:
        return "OK"
    if rc == 1 and "specmla: error:" in err:
        return "CLEAN_ERROR"
    return "UNCLEAN_EXIT"


def symptom(res, cls):
    """One line saying what happened (panic location + message, signal, error line)."""
    err = res["stderr"]
    if cls == "TIMEOUT":
        return f"killed after {res['wall_s']:.1f}s"
    if cls == "ABORT":
        sig = -res["rc"]
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        lines = [l for l in err.splitlines() if l.strip()]
        # The cause ("memory allocation of N bytes failed", a panic line, ...), not the
        # backtrace boilerplate that follows it.
        noise = ("stack backtrace", "note:", "skipping backtrace", " ")
        cause = [l for l in lines if not l.startswith(noise)]
        return f"{name}: {(cause or lines or ['(no stderr)'])[0][:200]}"
    if cls == "PANIC":
        lines = err.splitlines()
        for i, line in enumerate(lines):
            if "panicked at" in line:
                msg = lines[i + 1] if i + 1 < len(lines) else ""
                return f"{line.strip()} {msg.strip()}"[:300]
    if cls == "OK":
        try:
            obj = json.loads(res["stdout"].splitlines()[0])
            return f"ok: {obj.get('finish_reason')} {obj.get('text', '')[:30]!r}"
        except (ValueError, IndexError):
            return "ok, but stdout is not one JSON object"
    lines = [l for l in err.splitlines() if l.strip()]
    return (lines[-1] if lines else f"exit {res['rc']}, empty stderr")[:300]


def prepare_dir(base: Path, tmp_root, name: str, data, link=False):
    """Copy `base` to a new temp dir under `tmp_root` (None: the system temp dir), with `data`
    as its file `name` (None: `name` left out). With `link`, the other files are symlinks to
    the originals instead of copies (the mutated file is always a fresh regular file, so the
    originals are never written). Returns (temp dir, model dir)."""
    d = Path(tempfile.mkdtemp(prefix="mut-", dir=tmp_root))
    model = d / "model"
    model.mkdir()
    for src in sorted(base.iterdir()):
        if src.name == name or not src.is_file():
            continue
        if link:
            (model / src.name).symlink_to(src.resolve())
        else:
            shutil.copy2(src, model / src.name)
    if data is not None:
        (model / name).write_bytes(data)
    return d, model


def run_case(args, index, tmp_root, baseline, make=None):
    """Run case `index`: drawn from --seed, or built by `make()` (a sweep's case)."""
    if make is None:
        kind, name, data, desc = draw_case(args.seed, index, args.model, args.kinds)
    else:
        kind, name, data, desc = make()
    d, model = prepare_dir(args.model, None if args.keep_dir else tmp_root, name, data,
                           args.link)
    try:
        res = run_cli(args, model)
    finally:
        if not args.keep_dir:
            shutil.rmtree(d, ignore_errors=True)
        else:
            print(f"case {index}: kept {model}", file=sys.stderr)
    cls = classify(res)
    slow = is_slow(args, res, baseline)
    if slow:
        slow = confirm_slow(args, tmp_root, baseline, args.model, name, data)
    return {
        "seed": args.seed, "index": index, "kind": kind, "file": name,
        "description": desc, "class": cls, "slow": slow,
        "finish_error": cls == "OK" and finish_reason(res) == "error",
        "symptom": symptom(res, cls).replace(str(model), "$MODEL"), **res,
    }, data


def run_time(args, res):
    return res["cpu_s"] if args.slow_by == "cpu" else res["wall_s"]


def is_slow(args, res, baseline):
    """`baseline` is the median unmutated time in the --slow-by measure."""
    if res["timed_out"]:
        return False
    t = run_time(args, res)
    return t > args.slow_factor * baseline and t > baseline + args.slow_min_extra


def confirm_slow(args, tmp_root, baseline, base_model, name, data, reruns=2):
    """Re-run a SLOW case; it stays SLOW only if every re-run is slow too."""
    for _ in range(reruns):
        d, model = prepare_dir(base_model, tmp_root, name, data, args.link)
        try:
            res = run_cli(args, model)
        finally:
            shutil.rmtree(d, ignore_errors=True)
        if not (res["timed_out"] or is_slow(args, res, baseline)):
            return False
    return True


def save_case(out_dir: Path, case, data, args):
    tag = case_tag(case, "-")
    d = out_dir / f"{case['index']:05d}-{case['kind']}-{tag}"
    d.mkdir(parents=True, exist_ok=True)
    meta = {k: v for k, v in case.items() if k not in ("stdout", "stderr")}
    meta["model"] = str(args.model)
    meta["mem_limit_mb"] = args.mem_limit_mb
    meta["timeout_s"] = args.timeout
    meta["link"] = args.link
    (d / "case.json").write_text(json.dumps(meta, indent=2) + "\n")
    (d / "stderr.txt").write_text(case["stderr"])
    (d / "stdout.txt").write_text(case["stdout"])
    if data is None:
        (d / f"REMOVED-{case['file']}").write_text("")
    else:
        (d / case["file"]).write_bytes(data)


def measure_baseline(args, tmp_root, n=5):
    """Median time (in the --slow-by measure) of `n` unmutated runs."""
    times = []
    for _ in range(n):
        d, model = prepare_dir(args.model, tmp_root, CONFIG, read(args.model, CONFIG),
                               args.link)
        try:
            res = run_cli(args, model)
        finally:
            shutil.rmtree(d, ignore_errors=True)
        if classify(res) != "OK":
            sys.exit(f"baseline run failed ({classify(res)}): {res['stderr'][-2000:]}")
        times.append(run_time(args, res))
    return statistics.median(times), res


# --------------------------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------------------------


def is_bad(c):
    return c["class"] in BAD_CLASSES or c["slow"] or c["finish_error"]


def case_tag(c, sep):
    return (c["class"] + (sep + "SLOW" if c["slow"] else "")
            + (sep + "FINISH_ERROR" if c["finish_error"] else ""))



def print_summary(cases, baseline, elapsed, slow_by):
    by_class = collections.Counter(c["class"] for c in cases)
    n_slow = sum(c["slow"] for c in cases)
    print()
    print(f"cases: {len(cases)}   baseline ({slow_by} time): {baseline * 1000:.0f} ms   "
          f"elapsed: {elapsed:.0f} s")
    n_fin = sum(c["finish_error"] for c in cases)
    print("class counts: " + "  ".join(f"{k}={by_class.get(k, 0)}" for k in ALL_CLASSES)
          + f"  SLOW={n_slow}  (FINISH_ERROR={n_fin})")
    print()
    kinds = [k for k, _ in KIND_WEIGHTS]
    cols = ALL_CLASSES + ("SLOW", "FIN_ERR")
    head = f"{'kind':<16}{'n':>6}" + "".join(f"{c:>13}" for c in cols)
    print(head)
    print("-" * len(head))
    for k in kinds:
        ks = [c for c in cases if c["kind"] == k]
        if not ks:
            continue
        cnt = collections.Counter(c["class"] for c in ks)
        row = [cnt.get(c, 0) for c in ALL_CLASSES] + [sum(c["slow"] for c in ks),
                                                      sum(c["finish_error"] for c in ks)]
        print(f"{k:<16}{len(ks):>6}" + "".join(f"{v:>13}" for v in row))
    bad = [c for c in cases if is_bad(c)]
    if bad:
        print()
        print(f"bad cases ({len(bad)}):")
        for c in bad:
            tag = case_tag(c, "+")
            print(f"  #{c['index']:<5} {tag:<13} {c['wall_s']:>6.2f}s wall {c['cpu_s']:>6.2f}s cpu "
                  f"{c['max_rss_mb']:>7.0f} MB  {c['kind']:<15} "
                  f"{c['file']}: {c['description'][:110]}")
            print(f"         -> {c['symptom'][:220]}")


def run_experiment(args):
    args.out.mkdir(parents=True, exist_ok=True)
    tmp_root = tempfile.mkdtemp(prefix="specmla-mutate-")
    try:
        baseline, _ = measure_baseline(args, tmp_root)
        print(f"baseline (unmutated {args.model}): median {args.slow_by} time "
              f"{baseline * 1000:.1f} ms", flush=True)
        makers = list(SWEEPS[args.sweep](args.model)) if args.sweep else None
        if makers is not None:
            print(f"sweep {args.sweep}: {len(makers)} cases", flush=True)
            indices = args.only if args.only else list(range(len(makers)))
        else:
            indices = args.only if args.only else list(range(args.count))
        t0 = time.monotonic()
        cases = []
        results_path = args.out / "results.jsonl"
        with open(results_path, "w") as log, \
                concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
            # A bounded window of in-flight cases (each holds a mutated copy of a file).
            pending = collections.deque()
            todo = iter(indices)
            n = 0
            while True:
                while len(pending) < 2 * args.jobs:
                    i = next(todo, None)
                    if i is None:
                        break
                    make = makers[i] if makers is not None else None
                    pending.append(pool.submit(run_case, args, i, tmp_root, baseline, make))
                if not pending:
                    break
                case, data = pending.popleft().result()
                n += 1
                cases.append(case)
                log.write(json.dumps({k: v for k, v in case.items() if k != "stdout"}) + "\n")
                log.flush()
                if is_bad(case):
                    save_case(args.out, case, data, args)
                    print(f"[{n}/{len(indices)}] #{case['index']} {case_tag(case, '+')} "
                          f"{case['kind']}: "
                          f"{case['description'][:100]} -> {case['symptom'][:160]}", flush=True)
                elif n % 200 == 0:
                    print(f"[{n}/{len(indices)}] ...", flush=True)
                del data
                case["stdout"] = case["stdout"][:2000]
                case["stderr"] = case["stderr"][-4000:]
        print_summary(cases, baseline, time.monotonic() - t0, args.slow_by)
        summary = {
            "seed": args.seed, "sweep": args.sweep, "count": len(cases), "baseline_wall_s": baseline,
            "classes": collections.Counter(c["class"] for c in cases),
            "slow": sum(c["slow"] for c in cases),
            "finish_error": sum(c["finish_error"] for c in cases),
            "slow_by": args.slow_by,
            "by_kind": {k: collections.Counter(c["class"] for c in cases if c["kind"] == k)
                        for k, _ in KIND_WEIGHTS},
        }
        (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        print(f"\nresults: {results_path}; saved cases under {args.out}")
        return 1 if any(is_bad(c) for c in cases) else 0
    finally:
        shutil.rmtree(tmp_root, ignore_errors=True)


def replay(args):
    root = args.replay
    dirs = [root] if (root / "case.json").is_file() else sorted(
        p for p in root.iterdir() if (p / "case.json").is_file())
    if not dirs:
        sys.exit(f"no case.json under {root}")
    tmp_root = tempfile.mkdtemp(prefix="specmla-replay-")
    try:
        baseline, _ = measure_baseline(args, tmp_root)
        print(f"baseline: {baseline * 1000:.1f} ms; replaying {len(dirs)} case(s)")
        still_bad = 0
        for d in dirs:
            meta = json.loads((d / "case.json").read_text())
            name = meta["file"]
            data = None if (d / f"REMOVED-{name}").exists() else (d / name).read_bytes()
            tmp, model = prepare_dir(args.model, tmp_root, name, data,
                                     args.link or meta.get("link", False))
            try:
                res = run_cli(args, model)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            cls = classify(res)
            now = {"class": cls, "slow": is_slow(args, res, baseline),
                   "finish_error": cls == "OK" and finish_reason(res) == "error"}
            meta.setdefault("finish_error", False)
            still_bad += is_bad(now)
            print(f"{d.name}: was {case_tag(meta, '+')}, now {case_tag(now, '+')} "
                  f"({res['wall_s']:.2f}s wall, {res['cpu_s']:.2f}s cpu, "
                  f"{res['max_rss_mb']:.0f} MB) -> {symptom(res, cls)[:200]}")
            if args.verbose:
                print(res["stderr"])
        print(f"{still_bad} of {len(dirs)} still bad")
        return 1 if still_bad else 0
    finally:
        shutil.rmtree(tmp_root, ignore_errors=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", type=Path, default=REPO / "target/release/specmla",
                    help="the specmla CLI (default: target/release/specmla)")
    ap.add_argument("--model", type=Path, default=None,
                    help="unmutated model directory (default: models/draft; with --replay, "
                         "the model recorded in the cases)")
    ap.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    ap.add_argument("--count", type=int, default=2000, help="random cases (default 2000)")
    ap.add_argument("--only", type=int, nargs="+", metavar="INDEX",
                    help="run only these case indices of --seed")
    ap.add_argument("--kinds", type=lambda s: s.split(","), metavar="K1,K2",
                    help="draw only these mutation kinds (see the module docstring)")
    ap.add_argument("--sweep", choices=sorted(SWEEPS),
                    help="enumerate one mutation family exhaustively instead of drawing "
                         "--count random cases (--seed is then only recorded)")
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds per run (default 20)")
    ap.add_argument("--out", type=Path, default=Path("mutate-out"),
                    help="where bad cases are saved (default ./mutate-out)")
    ap.add_argument("--jobs", type=int, default=1, help="cases run in parallel (default 1)")
    ap.add_argument("--threads", type=int, default=1,
                    help="--threads passed to specmla (default 1; 0 = all cores)")
    ap.add_argument("--max-tokens", type=int, default=8, help="--max-tokens (default 8)")
    ap.add_argument("--prompt", default=None,
                    help="prompt text (default: first line of models/workload/prompts.txt)")
    ap.add_argument("--mem-limit-mb", type=int, default=4096,
                    help="address-space limit per run in MiB (default 4096; 0 = none)")
    ap.add_argument("--slow-factor", type=float, default=5.0,
                    help="SLOW when time > factor x baseline (default 5) ...")
    ap.add_argument("--slow-min-extra", type=float, default=1.0,
                    help="... and time > baseline + this many seconds (default 1.0)")
    ap.add_argument("--slow-by", choices=["cpu", "wall"], default="cpu",
                    help="time measure for SLOW: child CPU time (default) or wall time")
    ap.add_argument("--replay", type=Path, metavar="DIR",
                    help="re-run saved case(s): one case dir or an --out dir")
    ap.add_argument("--link", action="store_true",
                    help="symlink the unmutated files instead of copying them (big models)")
    ap.add_argument("--keep-dir", action="store_true",
                    help="keep each mutated model dir (prints its path)")
    ap.add_argument("--verbose", action="store_true", help="with --replay: print stderr")
    args = ap.parse_args(argv)
    args.bin = args.bin.resolve()
    if args.model is None and args.replay:
        recorded = {json.loads(p.read_text()).get("model")
                    for p in [args.replay / "case.json", *args.replay.glob("*/case.json")]
                    if p.is_file()}
        if len(recorded) > 1:
            sys.exit(f"--replay: cases come from several models {sorted(recorded)}; give --model")
        args.model = Path(recorded.pop()) if recorded else None
    args.model = (args.model or REPO / "models/draft").resolve()
    if not args.bin.is_file():
        sys.exit(f"--bin {args.bin}: not found (cargo build --release --bin specmla)")
    unknown = set(args.kinds or ()) - set(MUTATORS)
    if unknown:
        sys.exit(f"--kinds: unknown {sorted(unknown)}; known: {', '.join(MUTATORS)}")
    if args.prompt is None:
        args.prompt = (REPO / "models/workload/prompts.txt").read_text().splitlines()[0]
    if args.replay:
        return replay(args)
    return run_experiment(args)


if __name__ == "__main__":
    sys.exit(main())
