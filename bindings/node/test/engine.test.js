'use strict';
// node --test suite for the Node bindings, on the models named by the environment (see the root
// Makefile's test-bindings).
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { Engine, version } = require('..');

const root = path.join(__dirname, '..', '..', '..');
const env = (k, d) => process.env[k] || d;
const ids = (s) => (s || '').split(',').filter((x) => x.trim() !== '').map(Number);
const S = {
  target: env('SPECMLA_TARGET', path.join(root, 'models/golden/v3_yarn')),
  draft: env('SPECMLA_DRAFT', path.join(root, 'models/golden/v3_bf16')),
  prompt: env('SPECMLA_PROMPT', ''),
  promptIds: ids(env('SPECMLA_PROMPT_IDS', '5,17,42,7,99,3,1')),
  think: ids(process.env.SPECMLA_THINK_IDS),
  maxTokens: Number(env('SPECMLA_MAX_TOKENS', '24')),
  budget: Number(env('SPECMLA_BUDGET', '6')),
};
S.draft2 = env('SPECMLA_DRAFT2', S.draft);
const prompt = () => (S.prompt ? S.prompt : S.promptIds);
const opts = (speculate, budget = -1) => {
  const o = { maxTokens: S.maxTokens, speculate, reasoningBudget: budget };
  if (S.think.length === 2) Object.assign(o, { thinkStart: [S.think[0]], thinkEnd: [S.think[1]] });
  return o;
};
const engine = () => new Engine(S.target, S.draft, { threads: 2, kvNumBlocks: 256, draftKvNumBlocks: 256 });

test('version', () => {
  assert.match(version(), /^\d+\.\d+\.\d+$/);
});

test('speculative greedy equals plain greedy and the Rust CLI', async () => {
  const e = engine();
  const a = await e.generate(prompt(), opts(true));
  const b = await e.generate(prompt(), opts(false));
  assert.ok(a.tokens.length > 0);
  assert.deepEqual(a.tokens, b.tokens);
  assert.equal(a.text, b.text);
  assert.ok(a.counters.draftedTokens > 0);
  assert.ok(a.counters.acceptedTokens <= a.counters.draftedTokens);
  const exp = process.env.SPECMLA_EXPECTED_JSON;
  if (exp) {
    const want = JSON.parse(fs.readFileSync(exp, 'utf8').split('\n')[0]);
    assert.deepEqual(a.tokens, want.token_ids);
    assert.equal(a.text, want.text);
  }
  e.close();
});

test('reasoning budget and counters', async () => {
  const e = engine();
  const c = await e.generate(prompt(), opts(true, S.budget));
  const d = await e.generate(prompt(), opts(false, S.budget));
  assert.deepEqual(c.tokens, d.tokens);
  const k = c.counters;
  assert.ok(k.reasoningTokens <= S.budget, `reasoning ${k.reasoningTokens} > budget ${S.budget}`);
  assert.ok(k.acceptedTokens <= k.draftedTokens);
  assert.equal(k.acceptedPerPosition.reduce((x, y) => x + y, 0), k.acceptedTokens);
  assert.deepEqual(e.counters(c.requestId), k);
  e.close();
});

test('draft swap mid-run keeps greedy output; bad weights are refused', async () => {
  const e = engine();
  const ref = await e.generate(prompt(), opts(true));
  const id = e.submit(prompt(), opts(true));
  const got = [];
  let done = false;
  const pump = async () => {
    for (const ev of await e.step()) {
      if (ev.requestId !== id) continue;
      got.push(...ev.tokens);
      done = done || ev.finishReason !== null;
    }
  };
  await pump();
  await pump();
  assert.throws(() => e.setDraftWeights('/nonexistent/draft.safetensors'), (err) => err.code !== 'SPECMLA_OK' && /nonexistent/.test(err.message));
  assert.throws(() => e.setDraftWeights(Buffer.from('not safetensors')), (err) => typeof err.status === 'number');
  const t = e.setDraftWeights(S.draft2);
  while (!done) await pump();
  assert.deepEqual(got, ref.tokens);
  assert.equal(e.swapStatus(t).state, 'applied');
  const t2 = e.setDraftWeights(S.draft, { wait: false });
  const t3 = e.setDraftWeights('/nonexistent/dir', { wait: false });
  for (let i = 0; i < 2000; i++) {
    if (e.swapStatus(t2).state !== 'pending' && e.swapStatus(t3).state !== 'pending') break;
    await e.step();
    await new Promise((r) => setTimeout(r, 5));
  }
  assert.equal(e.swapStatus(t2).state, 'applied');
  const f = e.swapStatus(t3);
  assert.equal(f.state, 'failed');
  assert.ok(f.reason.length > 0);
  assert.deepEqual((await e.generate(prompt(), opts(true))).tokens, ref.tokens);
  assert.ok(e.stats().draftGeneration >= 2);
  assert.deepStrictEqual(e.health(), {
    panicsContained: 0,
    kvBlocksReclaimed: 0,
    drafterPanics: 0,
    drafterDisabled: false,
  });
  await e.generate(prompt(), Object.assign(opts(true), { label: 'node-test', maxTokens: 4 }));
  const m = e.metrics();
  assert.ok(m.includes('label="node-test"'), m);
  assert.ok(m.includes('# TYPE specmla_spec_decode_num_accepted_tokens_total counter'), m);
  assert.ok(/specmla_draft_generation \d+/.test(m), m);
  e.close();
});

test('concurrent steps and submits from the event loop', async () => {
  const e = engine();
  const ref = await e.generate(prompt(), opts(true));
  const idA = e.submit(prompt(), opts(true));
  const idB = e.submit(prompt(), opts(false));
  const out = { [idA]: [], [idB]: [] };
  const open = new Set([idA, idB]);
  while (open.size) {
    const [x, y] = await Promise.all([e.step(), e.step()]); // run in call order
    for (const ev of [...x, ...y]) {
      out[ev.requestId].push(...ev.tokens);
      if (ev.finishReason) open.delete(ev.requestId);
    }
  }
  assert.deepEqual(out[idA], ref.tokens);
  assert.deepEqual(out[idB], ref.tokens);
  e.close();
});

test('errors carry status codes; close is idempotent', async () => {
  assert.throws(() => new Engine('/nonexistent/model'), { code: 'SPECMLA_ERR_IO' });
  const e = engine();
  assert.throws(() => e.submit(prompt(), { reasoningBudget: -5 }), { code: 'SPECMLA_ERR_INVALID_ARGUMENT' });
  assert.throws(() => e.cancel(987654), { code: 'SPECMLA_ERR_UNKNOWN_REQUEST' });
  await assert.rejects(e.generate(prompt(), { maxTokens: 0 }), { code: 'SPECMLA_ERR_INVALID_REQUEST' });
  e.close();
  e.close();
  await assert.rejects(e.step(), { code: 'SPECMLA_ERR_INVALID_HANDLE' });
});

test('the MTP drafter (the target\'s own MTP layer) gives plain greedy output', async () => {
  const target = env('SPECMLA_MTP_TARGET', path.join(root, 'models/golden/v3_yarn'));
  const plain = new Engine(target, null, { threads: 2 });
  const ref = await plain.generate(prompt(), opts(false));
  const e = new Engine(target, null, { threads: 2, mtp: true });
  const got = await e.generate(prompt(), opts(true));
  assert.deepEqual(got.tokens, ref.tokens);
  assert.ok(got.counters.draftedTokens > 0);
  plain.setDraftMtp();
  assert.deepEqual((await plain.generate(prompt(), opts(true))).tokens, ref.tokens);
  // the drafters' confidence cut: same output; out of [0, 1] refused naming the field
  const cut = new Engine(target, null, { threads: 2, mtp: true, draftPMin: 0.5 });
  assert.deepEqual((await cut.generate(prompt(), opts(true))).tokens, ref.tokens);
  assert.throws(() => new Engine(target, null, { threads: 2, mtp: true, draftPMin: 1.5 }), (err) => /draft_p_min/.test(err.message));
  // weights read into huge pages: the same output
  const huge = new Engine(target, null, { threads: 2, mtp: true, hugePageWeights: true });
  assert.deepEqual((await huge.generate(prompt(), opts(true))).tokens, ref.tokens);
  huge.close();
  cut.close();
  e.close();
  plain.close();
});

test('the V4 sliding-window pool option reaches the engine', async () => {
  const target = env('SPECMLA_V4_TARGET', path.join(root, 'models/golden/v4_mixed'));
  // one block cannot hold a step's sliding window: refused naming the field
  assert.throws(() => new Engine(target, null, { threads: 2, kvWindowBlocks: 1 }), (err) => /kv_window_blocks/.test(err.message));
  const e = new Engine(target, null, { threads: 2, kvWindowBlocks: 64 });
  const out = await e.generate([1, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41], { maxTokens: 8, ignoreEos: true });
  assert.equal(out.tokens.length, 8);
  e.close();
});

test('a live A/B of two drafters keeps plain greedy output in both arms', async () => {
  const e = engine();
  const ref = await e.generate(prompt(), opts(false));
  e.setDraftAb(S.draft, 'ngram', { shareB: 0.5 });
  for (const draftArm of [0, 1]) {
    const got = await e.generate(prompt(), Object.assign(opts(true), { draftArm }));
    assert.deepEqual(got.tokens, ref.tokens, `arm ${draftArm}`);
  }
  const m = e.metrics();
  assert.ok(m.includes('arm="a"') && m.includes('arm="b"'), m);
  assert.throws(() => e.submit([1, 2, 3], { draftArm: 2 }), { code: 'SPECMLA_ERR_INVALID_ARGUMENT' });
  assert.throws(() => e.setDraftAb('mtp', 'none', { shareB: 1.5 }), { code: 'SPECMLA_ERR_INVALID_ARGUMENT' });
  e.close();
});

test('the second KV tier on disk outlives the engine', async () => {
  const dir = fs.mkdtempSync(path.join(require('node:os').tmpdir(), 'specmla-node-tier-'));
  const outs = [];
  for (let i = 0; i < 2; i++) {
    const e = new Engine(S.target, S.draft, { threads: 2, kvNumBlocks: 256, draftKvNumBlocks: 256, kvOffloadDir: dir });
    outs.push(await e.generate(prompt(), opts(true)));
    e.close();
  }
  assert.deepEqual(outs[1].tokens, outs[0].tokens);
  assert.ok(outs[1].counters.cachedPromptTokens > 0, JSON.stringify(outs[1].counters));
  fs.rmSync(dir, { recursive: true, force: true });
});

test('the device option reaches the engine', async () => {
  assert.throws(() => new Engine(S.target, S.draft, { threads: 2, device: 'tpu:0' }), /expected cpu, cuda or cuda:N/);
  if (!fs.existsSync('/proc/driver/nvidia')) {
    assert.throws(() => new Engine(S.target, S.draft, { threads: 2, device: 'cuda', kvDtype: 2 }), /CUDA/);
  }
  const e = new Engine(S.target, S.draft, { threads: 2, kvNumBlocks: 256, draftKvNumBlocks: 256, device: 'cpu' });
  const out = await e.generate(prompt(), opts(true));
  assert.ok(out.tokens.length > 0);
  e.close();
});
