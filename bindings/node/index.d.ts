// TypeScript declarations for the specmla Node bindings.

export type FinishReason = 'stop' | 'stop_string' | 'length' | 'cancelled' | 'error';

export interface EngineOptions {
  numDraftTokens?: number;
  adaptive?: boolean;
  kvNumBlocks?: number;
  draftKvNumBlocks?: number;
  blockSize?: number;
  threads?: number;
  /** With no draft directory: draft with the target's own MTP layer. */
  mtp?: boolean;
  /** Kernel instruction set: 0 auto (default: the fastest, avx512bf16 where present), 1 portable, 2 avx2, 3 avx512, 4 amx (opt-in), 5 avx512bf16 (bf16-rounded activations in bf16 matmuls), 6 exact (best level bitwise equal to portable). */
  isa?: number;
  /** DeepSeek-V4 sliding-window pool blocks (0 = default; ignored for other models). */
  kvWindowBlocks?: number;
  /** Second KV tier: a directory whose file keeps prompt blocks across engines (and processes). */
  kvOffloadDir?: string;
  /** Target KV cache dtype: SPECMLA_KV_* value (0 auto = f32; bf16 for a CUDA device). */
  kvDtype?: number;
  /** The target's forward: "cpu" (default), "cuda" or "cuda:N". */
  device?: string;
  /** Second KV tier: host-memory budget in bytes for evicted prefix blocks (default 0). */
  kvOffloadMemBytes?: number;
  /** Drafters' confidence cut in [0, 1]: a request stops drafting for the step after a token its draft model / MTP layer gave a probability below it (outputs unchanged; 0 = off, default). */
  draftPMin?: number;
  /** Read this engine's weight files into huge pages instead of mapping them: a memory-bound model decodes faster, the load copies every file and every weight stays resident; outputs are the same (default false). */
  hugePageWeights?: boolean;
}

export interface RequestOptions {
  maxTokens?: number;
  temperature?: number;
  topK?: number;
  topP?: number;
  seed?: number;
  ignoreEos?: boolean;
  speculate?: boolean;
  /** Most committed reasoning tokens; -1 (default) = unlimited. */
  reasoningBudget?: number;
  stopTokenIds?: number[];
  stopStrings?: string[];
  thinkStart?: number[];
  thinkEnd?: number[];
  /** Workload label for the metrics (at most 64 bytes). */
  label?: string;
  /** Under an A/B drafter (setDraftAb): 0 = arm A, 1 = arm B; default (-1) = by its share. */
  draftArm?: number;
}

export interface Event {
  requestId: number;
  tokens: number[];
  text: string;
  finishReason: FinishReason | null;
  error?: string;
}

export interface Counters {
  promptTokens: number;
  cachedPromptTokens: number;
  reasoningTokens: number;
  answerTokens: number;
  draftedTokens: number;
  acceptedTokens: number;
  recoveredTokens: number;
  bonusTokens: number;
  forcedEndOfThink: number;
  forcedTokens: number;
  draftSteps: number;
  draftTokensSaved: number;
  preemptions: number;
  meanAcceptanceLength: number;
  acceptedPerPosition: number[];
  draftedPerPosition: number[];
}

export interface Output {
  requestId: number;
  tokens: number[];
  text: string;
  finishReason: FinishReason;
  counters: Counters;
}

export interface SwapStatus {
  state: 'pending' | 'applied' | 'failed' | 'unknown';
  generation: number;
  reason?: string;
}

export interface Stats {
  steps: number;
  running: number;
  waiting: number;
  draftGeneration: number;
  hasDrafter: boolean;
  kvNumBlocks: number;
  kvUsedBlocks: number;
  timeTargetForwardS: number;
  timeDraftS: number;
  totals: Counters;
}

/** Errors thrown / rejected by the bindings. */
export interface SpecmlaError extends Error {
  /** Status name, e.g. "SPECMLA_ERR_DRAFT". */
  code: string;
  status: number;
}

export declare class Engine {
  constructor(target: string, draft?: string | null, options?: EngineOptions);
  submit(prompt: string | number[] | Uint32Array, options?: RequestOptions): number;
  step(): Promise<Event[]>;
  generate(prompt: string | number[] | Uint32Array, options?: RequestOptions): Promise<Output>;
  cancel(id: number): void;
  setDraftWeights(source: string | Buffer, options?: { wait?: boolean }): number;
  /** Swap in the target's own multi-token-prediction layer (DeepSeek-V3 MTP) as the drafter. */
  setDraftMtp(options?: { wait?: boolean }): number;
  /** A live A/B of two drafters: each a draft model directory, 'mtp', 'ngram' or 'none'. */
  setDraftAb(a: string, b: string, options?: { shareB?: number; wait?: boolean }): number;
  swapStatus(ticket: number): SwapStatus;
  counters(id: number): Counters;
  stats(): Stats;
  /** Failure containment counters; drafterDisabled: drafting is off after a drafter panic. */
  health(): {
    panicsContained: number;
    kvBlocksReclaimed: number;
    drafterPanics: number;
    drafterDisabled: boolean;
  };
  /** Metrics in the Prometheus text format (counters per label and draft generation, ...). */
  metrics(): string;
  tokenize(text: string, addSpecial?: boolean): number[];
  detokenize(ids: number[] | Uint32Array, skipSpecial?: boolean): string;
  close(): void;
}

export declare function version(): string;
