'use strict';
// specmla for Node: a thin class over the N-API addon (build/specmla.node, built by
// `make test-node` at the repository root). step() and generate() run off the event loop and
// return Promises; the other methods are synchronous and never wait for a running step
// (stats() excepted). Errors are Error objects with `code` (status name) and `status`.
const path = require('path');

const native = require(path.join(__dirname, 'build', 'specmla.node'));

class Engine {
  /**
   * @param {string} target model directory
   * @param {string|null} [draft] draft model directory
   * @param {object} [options] numDraftTokens, adaptive, kvNumBlocks, draftKvNumBlocks, blockSize, threads
   */
  constructor(target, draft = null, options = {}) {
    this._h = native.create(target, draft, options);
  }

  /** Queue a request; prompt is text or token ids. Returns the request id. */
  submit(prompt, options = {}) {
    return native.submit(this._h, prompt, options);
  }

  /**
   * Run one step off the event loop; resolves to its events. Steps run in call order: each
   * starts when the previous one has settled, so the events of steps asked for together arrive
   * in that order (the libuv pool alone does not promise it).
   */
  step() {
    const run = () => native.step(this._h);
    const p = (this._lastStep || Promise.resolve()).then(run, run);
    this._lastStep = p.catch(() => {});
    return p;
  }

  /** Submit and step (off the event loop) until this request finishes. */
  generate(prompt, options = {}) {
    return native.generate(this._h, prompt, options);
  }

  cancel(id) {
    native.cancel(this._h, id);
  }

  /**
   * Swap draft weights (a model directory or .safetensors path, or a Buffer of safetensors
   * bytes). wait=true validates now and throws on bad weights; wait=false returns at once.
   * Returns the swap ticket.
   */
  setDraftWeights(source, { wait = true } = {}) {
    return native.setDraftWeights(this._h, source, wait);
  }

  /** Swap in the target's own multi-token-prediction layer as the drafter. Returns the ticket. */
  setDraftMtp({ wait = true } = {}) {
    return native.setDraftMtp(this._h, wait);
  }

  /**
   * Swap in a live A/B of two drafters (each a draft model directory, 'mtp', 'ngram' or 'none'),
   * each with its own draft KV: a request goes to the arm its `draftArm` option names (0 = A,
   * 1 = B), else to B with probability `shareB`. Per-arm counters are in the metrics text
   * (label arm="a" / "b"). Returns the ticket.
   */
  setDraftAb(a, b, { shareB = 0.5, wait = true } = {}) {
    return native.setDraftAb(this._h, a, b, shareB, wait);
  }

  swapStatus(ticket) {
    return native.swapStatus(this._h, ticket);
  }

  counters(id) {
    return native.counters(this._h, id);
  }

  stats() {
    return native.stats(this._h);
  }

  // Failure containment: { panicsContained, kvBlocksReclaimed, drafterPanics, drafterDisabled }.
  metrics() {
    return native.metrics(this._h);
  }

  health() {
    return native.health(this._h);
  }

  tokenize(text, addSpecial = false) {
    return native.tokenize(this._h, text, addSpecial);
  }

  detokenize(ids, skipSpecial = false) {
    return native.detokenize(this._h, ids, skipSpecial);
  }

  /** Free the engine now (idempotent); later calls throw SPECMLA_ERR_INVALID_HANDLE. */
  close() {
    if (this._h) native.close(this._h);
  }
}

module.exports = { Engine, version: native.version };
