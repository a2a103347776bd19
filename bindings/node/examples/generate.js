'use strict';
// Speculative generation with a reasoning budget from Node.
//   node examples/generate.js [TARGET_DIR DRAFT_DIR [PROMPT]]
// Defaults come from SPECMLA_TARGET / SPECMLA_DRAFT / SPECMLA_PROMPT (token ids from
// SPECMLA_PROMPT_IDS and think markers from SPECMLA_THINK_IDS for models without a tokenizer).
const path = require('node:path');
const { Engine, version } = require('..');

async function main() {
  const root = path.join(__dirname, '..', '..', '..');
  const target = process.argv[2] || process.env.SPECMLA_TARGET || path.join(root, 'models/golden/v3_yarn');
  const draft = process.argv[3] || process.env.SPECMLA_DRAFT || path.join(root, 'models/golden/v3_bf16');
  const text = process.argv[4] || process.env.SPECMLA_PROMPT || '';
  const ids = (process.env.SPECMLA_PROMPT_IDS || '5,17,42,7,99,3,1').split(',').map(Number);
  const think = (process.env.SPECMLA_THINK_IDS || '').split(',').filter(Boolean).map(Number);
  const engine = new Engine(target, draft, { numDraftTokens: 4 });
  const options = { maxTokens: 32, reasoningBudget: 8 };
  if (think.length === 2) Object.assign(options, { thinkStart: [think[0]], thinkEnd: [think[1]] });
  const out = await engine.generate(text || ids, options);
  const c = out.counters;
  console.log(`specmla ${version()}\ntokens ${JSON.stringify(out.tokens)}\ntext ${JSON.stringify(out.text)}`);
  console.log(`reasoning ${c.reasoningTokens} answer ${c.answerTokens} forced_end ${c.forcedEndOfThink} | ` +
    `drafted ${c.draftedTokens} accepted ${c.acceptedTokens} mean acceptance length ${c.meanAcceptanceLength.toFixed(2)}`);
  engine.close();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
