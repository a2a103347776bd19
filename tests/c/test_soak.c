/* Soak test: ONE engine driven from several threads through the C ABI for a bounded time.
 *
 *   3 submitter threads  mixed requests (greedy with/without thinking budget and log-probs, seeded
 *                        temperature/top-p sampling with and without speculation, long ignore-eos
 *                        requests that need the whole KV pool), some cancelled mid-flight, some
 *                        refused at submit (too large for the pool, bad params)
 *   1 stepping thread    steps, records every event per request id, step latencies, RSS
 *   1 reader thread      per-request counters and engine stats while the engine runs
 *   1 swapper thread     draft swaps every few steps: good drafts ($SPECMLA_DRAFT, $SPECMLA_DRAFT2,
 *                        a weights file), bad ones (nonexistent path, corrupted weights, corrupted
 *                        config, truncated file, bad n-gram range), NONE and NGRAM; sync and async,
 *                        polling specmla_engine_swap_status
 *
 * The target KV pool is small, so requests are preempted and recomputed. Assertions: every
 * submitted request ends exactly once; greedy requests (and unspeculated seeded sampling) give
 * their single-request reference output computed first on a fresh engine without a drafter, token
 * ids and log-probs bit for bit (cancelled ones: a prefix of it); refusals carry a reason; counters
 * read concurrently are consistent, and per-request counters sum to the engine totals; no KV block
 * is held at the end; RSS stays flat after warm-up; LeakSanitizer is active (checked in a forked
 * child) and finds nothing.
 *
 * Bounded by request count and wall time (defaults: 2400 requests or 30 s of submitting, whichever
 * comes first, then the drain); longer runs:
 *   SPECMLA_SOAK_SECONDS=600 build/c/test_soak      (or: build/c/test_soak 600)
 * (a time-only bound: requests are then limited by time, or SPECMLA_SOAK_REQUESTS). Other knobs:
 * SPECMLA_SOAK_RSS_MB (RSS growth bound, default 48), SPECMLA_SOAK_PROMPTS (a file of text prompts,
 * one a line, used with a tokenizer). The RSS bound assumes a small ASan quarantine
 * (ASAN_OPTIONS=quarantine_size_mb=16, as the Makefile runs it): with the default 256 MB quarantine
 * RSS swings by ~60 MB as freed blocks cycle through it. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"

/* LeakSanitizer interface (weak: the test also links without sanitizers). */
extern int __lsan_do_recoverable_leak_check(void) __attribute__((weak));

#define NSUB 3
#define INFLIGHT 4     /* outstanding requests per submitter */
#define MAXP 4         /* distinct prompts */
#define NBUDGET 4      /* greedy budget variants */
#define NSEED 2        /* seeds of the unspeculated sampled references */
#define K_DRAFT 4      /* num_draft_tokens */
#define BLOCK 8        /* KV block size */
#define MAX_REQ (1 << 17)

enum { K_GREEDY, K_SAMPLED_PLAIN, K_SAMPLED_SPEC, K_LONG };
static const char *KIND_NAME[] = {"greedy", "sampled-plain", "sampled-spec", "long"};
static const uint64_t SEEDS[NSEED] = {1234, 98765};

/* ---------------------------------------------------------------------------------------------
 * failures (thread-safe) */
static atomic_int g_fail = 0;
static pthread_mutex_t g_print_mu = PTHREAD_MUTEX_INITIALIZER;
static void failf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void failf(const char *fmt, ...) {
  int n = atomic_fetch_add(&g_fail, 1);
  if (n >= 40) return;
  pthread_mutex_lock(&g_print_mu);
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "test_soak: FAIL: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  pthread_mutex_unlock(&g_print_mu);
}
#define EXPECT(cond, ...)      \
  do {                         \
    if (!(cond)) failf(__VA_ARGS__); \
  } while (0)

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}
static void sleep_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}
static uint64_t rng_next(uint64_t *s) { /* xorshift64* */
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 0x2545F4914F6CDD1DULL;
}
static unsigned rnd(uint64_t *s, unsigned n) { return (unsigned)(rng_next(s) % n); }
static double rss_mb(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  if (!f) return 0;
  long size = 0, res = 0;
  if (fscanf(f, "%ld %ld", &size, &res) != 2) res = 0;
  fclose(f);
  return res * (double)sysconf(_SC_PAGESIZE) / (1024.0 * 1024.0);
}

/* ---------------------------------------------------------------------------------------------
 * settings, prompts, references */
static test_env g_env;
static specmla_engine *g_eng;
static int g_nprompt;
static uint32_t g_prompt[MAXP][256];
static size_t g_plen[MAXP];
static char *g_ptext[MAXP];      /* text of the prompt (tokenizer models), else NULL */
static uint32_t g_fit_max[MAXP]; /* largest max_tokens the pool accepts for this prompt */
static uint32_t g_pool_blocks;
static int64_t g_budgets[NBUDGET];

typedef struct {
  uint32_t *tok;
  float *lp;
  size_t n;
  specmla_finish_reason finish;
} ref_t;
static ref_t g_ref_greedy[MAXP][NBUDGET], g_ref_sampled[MAXP][NSEED];

static specmla_request_params base_params(int64_t budget) {
  specmla_request_params p = specmla_request_default_params();
  p.reasoning_budget = budget;
  if (g_env.has_think) {
    p.think_start = &g_env.think[0];
    p.n_think_start = 1;
    p.think_end = &g_env.think[1];
    p.n_think_end = 1;
  }
  return p;
}
static void sampled_params(specmla_request_params *p, uint64_t seed) {
  p->temperature = 0.8f;
  p->top_p = 0.9f;
  p->seed = seed;
}

/* One request alone on `eng` (no drafter): the reference. */
static int run_ref(specmla_engine *eng, int pi, specmla_request_params *p, ref_t *out) {
  memset(out, 0, sizeof *out);
  p->logprobs = true;
  p->max_tokens = g_fit_max[pi];
  uint64_t id = 0;
  if (specmla_engine_submit(eng, g_prompt[pi], g_plen[pi], NULL, p, &id) != SPECMLA_OK) return -1;
  out->tok = calloc(p->max_tokens + 1, sizeof *out->tok);
  out->lp = calloc(p->max_tokens + 1, sizeof *out->lp);
  for (int guard = 0; guard < 100000 && out->finish == SPECMLA_FINISH_NONE; guard++) {
    specmla_step_result *r = NULL;
    if (specmla_engine_step(eng, &r) != SPECMLA_OK) return -1;
    for (size_t i = 0; i < r->n_events; i++) {
      const specmla_event *ev = &r->events[i];
      if (ev->request_id != id) continue;
      for (size_t j = 0; j < ev->n_tokens && out->n < p->max_tokens; j++) {
        out->tok[out->n] = ev->tokens[j];
        out->lp[out->n++] = ev->logprobs ? ev->logprobs[j] : NAN;
      }
      if (ev->finish_reason != SPECMLA_FINISH_NONE) out->finish = ev->finish_reason;
    }
    specmla_step_result_free(r);
  }
  return out->finish == SPECMLA_FINISH_STOP || out->finish == SPECMLA_FINISH_LENGTH ? 0 : -1;
}

/* Text prompts (tokenizer models): $SPECMLA_PROMPT, then lines of $SPECMLA_SOAK_PROMPTS. Without a
 * tokenizer: the token-id prompt and variants of it (ids stay in the vocabulary). */
static void load_prompts(specmla_engine *eng) {
  const char *texts[MAXP];
  int nt = 0;
  static char lines[MAXP][1024];
  if (g_env.prompt) texts[nt++] = g_env.prompt;
  const char *file = getenv("SPECMLA_SOAK_PROMPTS");
  FILE *f = (g_env.prompt && file && *file) ? fopen(file, "r") : NULL;
  while (f && nt < MAXP && fgets(lines[nt], sizeof lines[nt], f)) {
    lines[nt][strcspn(lines[nt], "\r\n")] = 0;
    if (!lines[nt][0] || (g_env.prompt && strcmp(lines[nt], g_env.prompt) == 0)) continue;
    texts[nt] = lines[nt];
    nt++;
  }
  if (f) fclose(f);
  for (int i = 0; i < nt; i++) {
    size_t n = 0;
    specmla_status st = specmla_tokenize(eng, texts[i], false, g_prompt[g_nprompt], 256, &n);
    if (st != SPECMLA_OK || n == 0) {
      failf("tokenize prompt %d: %s (%s)", i, specmla_status_name(st), specmla_last_error());
      continue;
    }
    g_plen[g_nprompt] = n;
    g_ptext[g_nprompt] = strdup(texts[i]);
    g_nprompt++;
  }
  if (g_nprompt > 0) return;
  const uint32_t *b = g_env.prompt_ids;
  size_t n = g_env.n_prompt_ids < 128 ? g_env.n_prompt_ids : 128;
  if (n == 0) return;
  /* the prompt; the prompt twice; its second half; the prompt rotated by one */
  memcpy(g_prompt[0], b, n * 4);
  g_plen[0] = n;
  memcpy(g_prompt[1], b, n * 4);
  memcpy(g_prompt[1] + n, b, n * 4);
  g_plen[1] = 2 * n;
  memcpy(g_prompt[2], b + n / 2, (n - n / 2) * 4);
  g_plen[2] = n - n / 2;
  for (size_t i = 0; i < n; i++) g_prompt[3][i] = b[(i + 1) % n];
  g_plen[3] = n;
  g_nprompt = 4;
}

/* ---------------------------------------------------------------------------------------------
 * per-request records (indexed by request id; ids are handed out 1, 2, ... by the engine) */
typedef struct {
  int submitted, sub, kind, prompt, bidx, sidx, logprobs, as_text, speculate;
  uint32_t max_tokens;
  int cancel; /* 0 none, 1 cancel returned OK, 2 cancel returned UNKNOWN_REQUEST, 3 cancel in progress */
  uint32_t *tok; /* committed tokens and log-probs; freed once the request is settled */
  float *lp;
  size_t n, cap;
  int n_finish, after_finish, bad_event, settled;
  specmla_finish_reason finish;
  char *err;
} rec_t;

static rec_t *g_rec;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER; /* guards g_rec */
static atomic_int g_outstanding[NSUB];
static atomic_ullong g_steps = 0, g_max_id = 0;
static atomic_int g_submitting = NSUB, g_swapping = 1, g_stop_reader = 0;
static atomic_long g_finished = 0;
static double g_submit_deadline, g_hard_deadline;
static long g_requests_per_sub;

typedef struct {
  long submitted, refused_kv, refused_invalid, cancels, cancels_unknown, text;
} sub_stats;
static sub_stats g_sub_stats[NSUB];

/* ---------------------------------------------------------------------------------------------
 * stepper */
typedef struct {
  double *lat;
  size_t n, cap;
  long busy_steps, idle_steps, events;
  /* RSS samples: (finished requests, MB) */
  long rss_fin[4096];
  double rss[4096];
  int n_rss;
} step_stats;
static step_stats g_ss;

/* ---------------------------------------------------------------------------------------------
 * checks of one finished request against its reference, done when it finishes (under g_mu); its
 * tokens are then freed so that the RSS check measures the engine, not this test's records */
static long g_by_finish[8], g_checked_ref;

static int same_prefix(const rec_t *r, const ref_t *ref, size_t n) {
  if (n > ref->n || n > r->n) return 0;
  if (n == 0) return 1;
  if (memcmp(r->tok, ref->tok, n * sizeof *r->tok) != 0) return 0;
  if (r->logprobs && memcmp(r->lp, ref->lp, n * sizeof *r->lp) != 0) return -1;
  return 1;
}

static void settle(uint64_t id, rec_t *r) {
  r->settled = 1;
  const char *kn = KIND_NAME[r->kind];
  g_by_finish[r->finish]++;
  if (r->finish == SPECMLA_FINISH_ERROR) {
    failf("request %llu (%s) failed in the engine: %s", (unsigned long long)id, kn, r->err);
    goto done;
  }
  EXPECT(r->finish != SPECMLA_FINISH_CANCELLED || r->cancel != 0,
         "request %llu: CANCELLED but it was never cancelled", (unsigned long long)id);
  EXPECT(r->n <= r->max_tokens, "request %llu: %zu tokens > max_tokens %u", (unsigned long long)id, r->n,
         r->max_tokens);
  for (size_t i = 0; r->logprobs && i < r->n; i++)
    EXPECT(r->lp[i] <= 0.0f && !isnan(r->lp[i]), "request %llu: log-prob %zu = %g", (unsigned long long)id, i,
           (double)r->lp[i]);
  if (r->kind == K_LONG && r->finish != SPECMLA_FINISH_CANCELLED)
    EXPECT(r->finish == SPECMLA_FINISH_LENGTH && r->n == r->max_tokens,
           "long request %llu: finish %d after %zu of %u tokens (ignore_eos)", (unsigned long long)id,
           (int)r->finish, r->n, r->max_tokens);
  const ref_t *ref = r->kind == K_GREEDY          ? &g_ref_greedy[r->prompt][r->bidx]
                     : r->kind == K_SAMPLED_PLAIN ? &g_ref_sampled[r->prompt][r->sidx]
                                                  : NULL;
  if (!ref) goto done;
  /* expected: the reference cut at max_tokens (the reference ran to the pool's limit) */
  size_t want_n = ref->n;
  specmla_finish_reason want_f = ref->finish;
  if (!(ref->finish == SPECMLA_FINISH_STOP && ref->n <= r->max_tokens)) {
    want_n = r->max_tokens;
    want_f = SPECMLA_FINISH_LENGTH;
  }
  int ok;
  if (r->finish == SPECMLA_FINISH_CANCELLED) {
    ok = r->n <= want_n ? same_prefix(r, ref, r->n) : 0;
  } else {
    ok = r->finish == want_f && r->n == want_n ? same_prefix(r, ref, want_n) : 0;
  }
  g_checked_ref++;
  if (ok != 1) {
    size_t d = 0;
    while (d < r->n && d < ref->n && r->tok[d] == ref->tok[d] && (ok >= 0 || r->lp[d] == ref->lp[d])) d++;
    failf("request %llu (%s, prompt %d, budget %lld, seed %d, max_tokens %u, %s%s): %zu tokens finish %d, "
          "reference %zu tokens finish %d; %s at index %zu",
          (unsigned long long)id, kn, r->prompt, (long long)g_budgets[r->bidx], r->sidx, r->max_tokens,
          r->as_text ? "text prompt" : "id prompt", r->cancel ? ", cancel sent" : "", r->n, (int)r->finish, want_n,
          (int)want_f, ok < 0 ? "log-probs differ" : "tokens differ", d);
  }
done:
  free(r->tok);
  free(r->lp);
  r->tok = NULL;
  r->lp = NULL;
  r->cap = 0;
}

static void record_event(const specmla_event *ev) {
  uint64_t id = ev->request_id;
  if (id == 0 || id >= MAX_REQ) {
    failf("event for out-of-range request id %llu", (unsigned long long)id);
    return;
  }
  pthread_mutex_lock(&g_mu);
  rec_t *r = &g_rec[id];
  if (r->n_finish > 0) r->after_finish++;
  if ((ev->n_tokens > 0 && !ev->tokens) || !ev->text) r->bad_event++;
  if (r->n + ev->n_tokens > r->cap) {
    size_t cap = (r->n + ev->n_tokens) * 2 + 16;
    r->tok = realloc(r->tok, cap * sizeof *r->tok);
    r->lp = realloc(r->lp, cap * sizeof *r->lp);
    r->cap = cap;
  }
  for (size_t j = 0; j < ev->n_tokens; j++) {
    r->tok[r->n] = ev->tokens[j];
    r->lp[r->n++] = ev->logprobs ? ev->logprobs[j] : NAN;
  }
  if (ev->finish_reason != SPECMLA_FINISH_NONE) {
    r->n_finish++;
    r->finish = ev->finish_reason;
    if (ev->finish_reason == SPECMLA_FINISH_ERROR && !r->err)
      r->err = strdup(ev->error ? ev->error : "(NULL error message)");
    if (r->n_finish == 1) {
      if (r->submitted) atomic_fetch_sub(&g_outstanding[r->sub], 1);
      atomic_fetch_add(&g_finished, 1);
    }
  }
  if (r->submitted && r->n_finish > 0 && !r->settled) settle(id, r);
  pthread_mutex_unlock(&g_mu);
}

static void *stepper(void *arg) {
  (void)arg;
  unsigned long long rss_every = 20;
  for (;;) {
    bool work = false;
    if (specmla_engine_has_work(g_eng, &work) != SPECMLA_OK) failf("has_work: %s", specmla_last_error());
    if (!work && atomic_load(&g_submitting) == 0 && atomic_load(&g_swapping) == 0) {
      /* a submit may have landed between has_work and the flags: check once more */
      specmla_engine_has_work(g_eng, &work);
      if (!work) break;
    }
    if (now_s() > g_hard_deadline) {
      failf("requests still in flight %.0f s after submitting stopped (lost or stuck requests?)",
            g_hard_deadline - g_submit_deadline);
      break;
    }
    double t0 = now_s();
    specmla_step_result *r = NULL;
    specmla_status st = specmla_engine_step(g_eng, &r);
    double dt = now_s() - t0;
    if (st != SPECMLA_OK) {
      failf("step: %s (%s)", specmla_status_name(st), specmla_last_error());
      break;
    }
    for (size_t i = 0; i < r->n_events; i++) record_event(&r->events[i]);
    g_ss.events += (long)r->n_events;
    specmla_step_result_free(r);
    unsigned long long steps = atomic_fetch_add(&g_steps, 1) + 1;
    if (work) {
      g_ss.busy_steps++;
      if (g_ss.n == g_ss.cap) {
        g_ss.cap = g_ss.cap ? g_ss.cap * 2 : 4096;
        g_ss.lat = realloc(g_ss.lat, g_ss.cap * sizeof *g_ss.lat);
      }
      g_ss.lat[g_ss.n++] = dt;
    } else {
      g_ss.idle_steps++;
      sleep_us(500); /* idle steps still install finished draft loads */
    }
    if (steps % rss_every == 0) {
      if (g_ss.n_rss == 4096) { /* keep every other sample, sample half as often */
        for (int i = 0; i < 2048; i++) {
          g_ss.rss_fin[i] = g_ss.rss_fin[2 * i];
          g_ss.rss[i] = g_ss.rss[2 * i];
        }
        g_ss.n_rss = 2048;
        rss_every *= 2;
      }
      g_ss.rss_fin[g_ss.n_rss] = atomic_load(&g_finished);
      g_ss.rss[g_ss.n_rss++] = rss_mb();
    }
  }
  return NULL;
}

/* ---------------------------------------------------------------------------------------------
 * submitters */
typedef struct {
  uint64_t id, due_step;
} pending_cancel;

static void do_cancel(int si, uint64_t id) {
  pthread_mutex_lock(&g_mu);
  g_rec[id].cancel = 3; /* its CANCELLED event may be recorded before this call returns */
  pthread_mutex_unlock(&g_mu);
  specmla_status st = specmla_engine_cancel(g_eng, id);
  if (st != SPECMLA_OK && st != SPECMLA_ERR_UNKNOWN_REQUEST)
    failf("cancel %llu: %s (%s)", (unsigned long long)id, specmla_status_name(st), specmla_last_error());
  pthread_mutex_lock(&g_mu);
  g_rec[id].cancel = st == SPECMLA_OK ? 1 : 2;
  pthread_mutex_unlock(&g_mu);
  g_sub_stats[si].cancels++;
  if (st != SPECMLA_OK) g_sub_stats[si].cancels_unknown++;
}

static void *submitter(void *arg) {
  int si = (int)(intptr_t)arg;
  uint64_t seed = 0x9E3779B97F4A7C15ULL * (uint64_t)(si + 1);
  sub_stats *ss = &g_sub_stats[si];
  pending_cancel pc[64];
  int npc = 0;
  long attempts = 0;
  while (ss->submitted < g_requests_per_sub && now_s() < g_submit_deadline) {
    unsigned long long steps = atomic_load(&g_steps);
    for (int i = 0; i < npc;) {
      if (steps >= pc[i].due_step) {
        do_cancel(si, pc[i].id);
        pc[i] = pc[--npc];
      } else {
        i++;
      }
    }
    if (atomic_load(&g_outstanding[si]) >= INFLIGHT) {
      sleep_us(1000);
      continue;
    }
    attempts++;
    int pi = (int)rnd(&seed, (unsigned)g_nprompt);
    unsigned roll = rnd(&seed, 100);
    specmla_request_params p = base_params(-1);
    int kind = K_GREEDY, bidx = 0, sidx = -1;
    static const uint32_t lens[] = {1, 8, 16, 24, 32, 48};
    p.max_tokens = lens[rnd(&seed, 6)];
    if (p.max_tokens > g_fit_max[pi]) p.max_tokens = g_fit_max[pi];
    if (roll < 5) { /* too large for the pool: refused with a reason */
      p.max_tokens = g_fit_max[pi] + 1 + rnd(&seed, 64);
      uint64_t id = 0;
      specmla_status st = specmla_engine_submit(g_eng, g_prompt[pi], g_plen[pi], NULL, &p, &id);
      EXPECT(st == SPECMLA_ERR_KV_EXHAUSTED && strstr(specmla_last_error(), "blocks"),
             "oversized request (max_tokens %u, fit %u): %s '%s'", p.max_tokens, g_fit_max[pi],
             specmla_status_name(st), specmla_last_error());
      ss->refused_kv++;
      continue;
    }
    if (roll < 8) { /* invalid params: refused with a reason */
      if (roll & 1) p.reasoning_budget = -2;
      else p.top_p = 0.0f;
      uint64_t id = 0;
      specmla_status st = specmla_engine_submit(g_eng, g_prompt[pi], g_plen[pi], NULL, &p, &id);
      EXPECT((st == SPECMLA_ERR_INVALID_ARGUMENT || st == SPECMLA_ERR_INVALID_REQUEST) &&
                 strlen(specmla_last_error()) > 0,
             "invalid request accepted or refused without a reason: %s '%s'", specmla_status_name(st),
             specmla_last_error());
      ss->refused_invalid++;
      continue;
    }
    if (roll < 12) { /* long: ignore EOS, needs every block of the pool */
      kind = K_LONG;
      p.max_tokens = g_fit_max[pi];
      p.ignore_eos = true;
      p.temperature = 1.0f;
      p.seed = rng_next(&seed);
    } else if (roll < 62) {
      kind = K_GREEDY;
      bidx = (int)rnd(&seed, NBUDGET);
      p.reasoning_budget = g_budgets[bidx];
      p.speculate = rnd(&seed, 8) != 0;
      p.logprobs = rnd(&seed, 2);
      if (roll % 10 == 0) p.max_tokens = g_fit_max[pi]; /* greedy to the end */
    } else if (roll < 80) {
      kind = K_SAMPLED_PLAIN;
      sidx = (int)rnd(&seed, NSEED);
      sampled_params(&p, SEEDS[sidx]);
      p.speculate = false;
      p.logprobs = rnd(&seed, 2);
    } else {
      kind = K_SAMPLED_SPEC;
      static const float temps[] = {0.5f, 1.0f};
      static const float tops[] = {0.9f, 1.0f};
      p.temperature = temps[rnd(&seed, 2)];
      p.top_p = tops[rnd(&seed, 2)];
      p.top_k = rnd(&seed, 2) ? 0 : 20;
      p.seed = rng_next(&seed);
      p.reasoning_budget = rnd(&seed, 2) ? -1 : g_budgets[2];
    }
    int as_text = kind == K_GREEDY && g_ptext[pi] && rnd(&seed, 3) == 0;
    atomic_fetch_add(&g_outstanding[si], 1);
    uint64_t id = 0;
    specmla_status st = as_text ? specmla_engine_submit(g_eng, NULL, 0, g_ptext[pi], &p, &id)
                                : specmla_engine_submit(g_eng, g_prompt[pi], g_plen[pi], NULL, &p, &id);
    if (st != SPECMLA_OK) {
      atomic_fetch_sub(&g_outstanding[si], 1);
      failf("submit (%s, max_tokens %u): %s (%s)", KIND_NAME[kind], p.max_tokens, specmla_status_name(st),
            specmla_last_error());
      break;
    }
    if (id == 0 || id >= MAX_REQ) {
      failf("request id %llu out of range", (unsigned long long)id);
      break;
    }
    pthread_mutex_lock(&g_mu);
    rec_t *r = &g_rec[id];
    if (r->submitted) failf("request id %llu handed out twice", (unsigned long long)id);
    r->submitted = 1;
    r->sub = si;
    r->kind = kind;
    r->prompt = pi;
    r->bidx = bidx;
    r->sidx = sidx;
    r->logprobs = p.logprobs;
    r->as_text = as_text;
    r->speculate = p.speculate;
    r->max_tokens = p.max_tokens;
    if (r->n_finish > 0) { /* finished before we got here */
      atomic_fetch_sub(&g_outstanding[si], 1);
      settle(id, r);
    }
    pthread_mutex_unlock(&g_mu);
    unsigned long long m = atomic_load(&g_max_id);
    while (id > m && !atomic_compare_exchange_weak(&g_max_id, &m, id)) {
    }
    ss->submitted++;
    ss->text += as_text;
    if (rnd(&seed, 100) < 12) {
      if (npc < 64) pc[npc++] = (pending_cancel){id, atomic_load(&g_steps) + rnd(&seed, 12)};
      else do_cancel(si, id);
    }
    if (rnd(&seed, 4) == 0) sleep_us(rnd(&seed, 3000));
  }
  for (int i = 0; i < npc; i++) do_cancel(si, pc[i].id);
  atomic_fetch_sub(&g_submitting, 1);
  return NULL;
}

/* ---------------------------------------------------------------------------------------------
 * counters / stats reader */
typedef struct {
  long counter_reads, counter_unknown, stats_reads;
} reader_stats;
static reader_stats g_rs;

static void check_counters(const specmla_counters *c, const char *what, unsigned long long id) {
  uint64_t acc = 0, dr = 0;
  EXPECT(c->n_positions <= SPECMLA_MAX_DRAFT_POSITIONS, "%s %llu: n_positions %u", what, id, c->n_positions);
  for (uint32_t i = 0; i < c->n_positions && i < SPECMLA_MAX_DRAFT_POSITIONS; i++) {
    EXPECT(c->accepted_per_position[i] <= c->drafted_per_position[i], "%s %llu: position %u accepted > drafted",
           what, id, i);
    acc += c->accepted_per_position[i];
    dr += c->drafted_per_position[i];
  }
  EXPECT(c->accepted_tokens <= c->drafted_tokens, "%s %llu: accepted %llu > drafted %llu", what, id,
         (unsigned long long)c->accepted_tokens, (unsigned long long)c->drafted_tokens);
  EXPECT(acc == c->accepted_tokens && dr == c->drafted_tokens,
         "%s %llu: per-position sums %llu/%llu != accepted/drafted %llu/%llu", what, id, (unsigned long long)acc,
         (unsigned long long)dr, (unsigned long long)c->accepted_tokens, (unsigned long long)c->drafted_tokens);
  EXPECT(c->cached_prompt_tokens <= c->prompt_tokens, "%s %llu: cached prompt > prompt", what, id);
}

static void *reader(void *arg) {
  (void)arg;
  uint64_t seed = 77;
  uint64_t last_steps = 0, last_gen = 0;
  while (!atomic_load(&g_stop_reader)) {
    unsigned long long max_id = atomic_load(&g_max_id);
    if (max_id > 0) {
      uint64_t id = 1 + rng_next(&seed) % max_id;
      specmla_counters c;
      specmla_status st = specmla_engine_request_counters(g_eng, id, &c);
      if (st == SPECMLA_OK) check_counters(&c, "request", (unsigned long long)id);
      else if (st == SPECMLA_ERR_UNKNOWN_REQUEST) g_rs.counter_unknown++; /* not stepped yet */
      else failf("request_counters: %s (%s)", specmla_status_name(st), specmla_last_error());
      g_rs.counter_reads++;
    }
    if (g_rs.counter_reads % 16 == 0) {
      specmla_stats s;
      specmla_status st = specmla_engine_stats(g_eng, &s);
      if (st != SPECMLA_OK) {
        failf("stats: %s (%s)", specmla_status_name(st), specmla_last_error());
      } else {
        EXPECT(s.steps >= last_steps, "stats.steps went back %llu -> %llu", (unsigned long long)last_steps,
               (unsigned long long)s.steps);
        EXPECT(s.draft_generation >= last_gen, "draft generation went back");
        EXPECT(s.kv_used_blocks + s.kv_free_blocks + s.kv_cached_blocks == s.kv_num_blocks,
               "kv blocks: used %llu + free %llu + cached %llu != %llu", (unsigned long long)s.kv_used_blocks,
               (unsigned long long)s.kv_free_blocks, (unsigned long long)s.kv_cached_blocks,
               (unsigned long long)s.kv_num_blocks);
        EXPECT(s.running <= 64, "running %llu", (unsigned long long)s.running);
        check_counters(&s.totals, "totals", 0);
        last_steps = s.steps;
        last_gen = s.draft_generation;
      }
      g_rs.stats_reads++;
    }
    bool w;
    specmla_engine_has_work(g_eng, &w);
    sleep_us(300);
  }
  return NULL;
}

/* ---------------------------------------------------------------------------------------------
 * swapper */
static char g_tmp[64], g_bad_weights_dir[128], g_bad_config_dir[128], g_trunc_file[160];
static char g_file_draft[1024], g_file_draft2[1024];
static int g_same_arch; /* the two drafts' config.json are identical */

typedef struct {
  const char *name;
  uint32_t kind;
  const char *path;
  uint32_t ng_min, ng_max;
  int wait;
  int file_of; /* 0 dir/other, 1 a weights file of draft, 2 of draft2 (needs that architecture current) */
  int good;    /* 1 must apply, 0 must fail, -1 weights file: decided by the current architecture */
} swap_op;

typedef struct {
  long applied, failed_sync, failed_async, by_kind[5];
  uint64_t last_gen;
} swap_stats;
static swap_stats g_sws;

static int copy_file(const char *from, const char *to, size_t limit) {
  FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
  if (!a || !b) {
    if (a) fclose(a);
    if (b) fclose(b);
    return -1;
  }
  char buf[65536];
  size_t n, total = 0;
  while (total < limit && (n = fread(buf, 1, sizeof buf, a)) > 0) {
    if (n > limit - total) n = limit - total;
    fwrite(buf, 1, n, b);
    total += n;
  }
  fclose(a);
  fclose(b);
  return 0;
}
static int same_file(const char *a, const char *b) {
  FILE *x = fopen(a, "rb"), *y = fopen(b, "rb");
  int same = x && y;
  while (same) {
    int c = fgetc(x), d = fgetc(y);
    if (c != d) same = 0;
    if (c == EOF || d == EOF) break;
  }
  if (x) fclose(x);
  if (y) fclose(y);
  return same;
}
static int write_file(const char *path, const char *s) {
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  fputs(s, f);
  fclose(f);
  return 0;
}

/* Temp dir: a draft dir whose weights are garbage, one whose config.json is corrupt, and a
 * truncated safetensors file. */
static int make_bad_drafts(void) {
  snprintf(g_tmp, sizeof g_tmp, "/tmp/specmla_soak_XXXXXX");
  if (!mkdtemp(g_tmp)) return -1;
  char p[256];
  snprintf(g_bad_weights_dir, sizeof g_bad_weights_dir, "%s/bad_weights", g_tmp);
  snprintf(g_bad_config_dir, sizeof g_bad_config_dir, "%s/bad_config", g_tmp);
  snprintf(g_trunc_file, sizeof g_trunc_file, "%s/truncated.safetensors", g_tmp);
  if (mkdir(g_bad_weights_dir, 0700) || mkdir(g_bad_config_dir, 0700)) return -1;
  snprintf(p, sizeof p, "%s/config.json", g_env.draft);
  char q[256];
  snprintf(q, sizeof q, "%s/config.json", g_bad_weights_dir);
  if (copy_file(p, q, (size_t)-1)) return -1;
  snprintf(q, sizeof q, "%s/model.safetensors", g_bad_weights_dir);
  if (write_file(q, "\x20\x00\x00\x00\x00\x00\x00\x00{\"garbage\": this is not safetensors")) return -1;
  snprintf(q, sizeof q, "%s/config.json", g_bad_config_dir);
  if (write_file(q, "{\"model_type\": \"deepseek_v3\", \"hidden_size\": ")) return -1;
  snprintf(p, sizeof p, "%s/model.safetensors", g_env.draft);
  if (copy_file(p, g_trunc_file, 4096)) return -1;
  snprintf(g_file_draft, sizeof g_file_draft, "%s/model.safetensors", g_env.draft);
  snprintf(g_file_draft2, sizeof g_file_draft2, "%s/model.safetensors", g_env.draft2);
  snprintf(q, sizeof q, "%s/config.json", g_env.draft2);
  snprintf(p, sizeof p, "%s/config.json", g_env.draft);
  g_same_arch = same_file(p, q);
  return 0;
}
static void remove_bad_drafts(void) {
  char p[256];
  const char *files[][2] = {{g_bad_weights_dir, "config.json"}, {g_bad_weights_dir, "model.safetensors"},
                            {g_bad_config_dir, "config.json"}};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    snprintf(p, sizeof p, "%s/%s", files[i][0], files[i][1]);
    unlink(p);
  }
  unlink(g_trunc_file);
  rmdir(g_bad_weights_dir);
  rmdir(g_bad_config_dir);
  rmdir(g_tmp);
}

static void *swapper(void *arg) {
  (void)arg;
  const swap_op ops[] = {
      {"draft2 (async)", SPECMLA_DRAFT_PATH, g_env.draft2, 0, 0, 0, 0, 1},
      {"nonexistent (sync)", SPECMLA_DRAFT_PATH, "/nonexistent/specmla/draft", 0, 0, 1, 0, 0},
      {"ngram 1..3 (async)", SPECMLA_DRAFT_NGRAM, NULL, 1, 3, 0, 0, 1},
      {"garbage weights dir (async)", SPECMLA_DRAFT_PATH, g_bad_weights_dir, 0, 0, 0, 0, 0},
      {"none (async)", SPECMLA_DRAFT_NONE, NULL, 0, 0, 0, 0, 1},
      {"weights file of draft, no architecture (async)", SPECMLA_DRAFT_PATH, g_file_draft, 0, 0, 0, 1, -1},
      {"draft (sync)", SPECMLA_DRAFT_PATH, g_env.draft, 0, 0, 1, 0, 1},
      {"corrupt config dir (sync)", SPECMLA_DRAFT_PATH, g_bad_config_dir, 0, 0, 1, 0, 0},
      {"weights file of draft (async)", SPECMLA_DRAFT_PATH, g_file_draft, 0, 0, 0, 1, -1},
      {"truncated weights file (sync)", SPECMLA_DRAFT_PATH, g_trunc_file, 0, 0, 1, 0, 0},
      {"bad ngram range (async)", SPECMLA_DRAFT_NGRAM, NULL, 3, 1, 0, 0, 0},
      {"ngram 2..4 (sync)", SPECMLA_DRAFT_NGRAM, NULL, 2, 4, 1, 0, 1},
      {"draft2 (sync)", SPECMLA_DRAFT_PATH, g_env.draft2, 0, 0, 1, 0, 1},
      {"weights file of draft2 (sync)", SPECMLA_DRAFT_PATH, g_file_draft2, 0, 0, 1, 2, -1},
      {"garbage weights dir (sync)", SPECMLA_DRAFT_PATH, g_bad_weights_dir, 0, 0, 1, 0, 0},
      {"draft (async)", SPECMLA_DRAFT_PATH, g_env.draft, 0, 0, 0, 0, 1},
  };
  const int nops = (int)(sizeof ops / sizeof ops[0]);
  int cur_arch = 1; /* architecture of the current draft model: 1 draft's, 2 draft2's, 0 none */
  uint64_t seed = 4242;
  int i = 0;
  uint64_t next_step = 3;
  while (atomic_load(&g_submitting) > 0) {
    if (atomic_load(&g_steps) < next_step) {
      sleep_us(500);
      continue;
    }
    const swap_op *op = &ops[i++ % nops];
    /* the two drafts may have different architectures (golden fixtures): a weights file only
     * loads into the architecture it was saved from */
    int good = op->good; /* 2: either outcome is right */
    if (good < 0) good = cur_arch == 0 ? 0 : (cur_arch == op->file_of || g_same_arch) ? 1 : 2;
    specmla_draft_source src = specmla_draft_source_default();
    src.kind = op->kind;
    src.path = op->path;
    if (op->kind == SPECMLA_DRAFT_NGRAM) {
      src.ngram_min_n = op->ng_min;
      src.ngram_max_n = op->ng_max;
    }
    uint64_t ticket = 0;
    specmla_status st = specmla_engine_set_draft_weights(g_eng, &src, op->wait, &ticket);
    if (op->wait && op->kind != SPECMLA_DRAFT_NONE && st != SPECMLA_OK && good != 1) {
      EXPECT(strlen(specmla_last_error()) > 0, "swap %s: refused without a reason", op->name);
      g_sws.failed_sync++;
    } else if (op->wait && op->kind != SPECMLA_DRAFT_NONE && good == 0) {
      failf("swap %s: accepted (%s), want an error", op->name, specmla_status_name(st));
    } else if (st != SPECMLA_OK) {
      failf("swap %s: %s (%s)", op->name, specmla_status_name(st), specmla_last_error());
    } else {
      specmla_swap_state s = SPECMLA_SWAP_PENDING;
      uint64_t gen = 0;
      double t0 = now_s();
      while (s == SPECMLA_SWAP_PENDING && now_s() - t0 < 60) {
        if (specmla_engine_swap_status(g_eng, ticket, &s, &gen) != SPECMLA_OK)
          failf("swap_status: %s", specmla_last_error());
        if (s == SPECMLA_SWAP_PENDING) sleep_us(1000);
      }
      if (good == 2 && s == SPECMLA_SWAP_FAILED) {
        EXPECT(strlen(specmla_last_error()) > 0, "swap %s: FAILED without a reason", op->name);
        g_sws.failed_async++;
      } else if (good) {
        EXPECT(s == SPECMLA_SWAP_APPLIED, "swap %s: state %d, want APPLIED (%s)", op->name, (int)s,
               s == SPECMLA_SWAP_FAILED ? specmla_last_error() : "");
        if (s == SPECMLA_SWAP_APPLIED) {
          EXPECT(gen > g_sws.last_gen, "swap %s: generation %llu after %llu", op->name, (unsigned long long)gen,
                 (unsigned long long)g_sws.last_gen);
          g_sws.last_gen = gen;
          g_sws.applied++;
          g_sws.by_kind[op->kind]++;
          specmla_stats stt;
          if (specmla_engine_stats(g_eng, &stt) == SPECMLA_OK) {
            EXPECT(stt.has_drafter == (op->kind != SPECMLA_DRAFT_NONE), "swap %s: has_drafter %d", op->name,
                   (int)stt.has_drafter);
            EXPECT(stt.draft_generation == gen, "swap %s: stats generation %llu != ticket's %llu", op->name,
                   (unsigned long long)stt.draft_generation, (unsigned long long)gen);
          }
          if (op->kind == SPECMLA_DRAFT_NONE) cur_arch = 0;
          else if (op->kind == SPECMLA_DRAFT_PATH && op->file_of == 0)
            cur_arch = op->path == g_env.draft2 && strcmp(g_env.draft, g_env.draft2) != 0 ? 2 : 1;
        }
      } else {
        EXPECT(s == SPECMLA_SWAP_FAILED && strlen(specmla_last_error()) > 0,
               "swap %s: state %d, want FAILED with a reason", op->name, (int)s);
        g_sws.failed_async++;
      }
    }
    next_step = atomic_load(&g_steps) + 2 + rnd(&seed, 8);
  }
  atomic_store(&g_swapping, 0);
  return NULL;
}

/* ---------------------------------------------------------------------------------------------
 * LeakSanitizer must really run: a forked child that leaks must fail at exit. */
static int g_lsan_active;
static void lsan_selfcheck(void) {
  if (!__lsan_do_recoverable_leak_check) {
    failf("built without LeakSanitizer (build with -fsanitize=address, see the Makefile)");
    return;
  }
  int fds[2];
  if (pipe(fds) != 0) {
    failf("pipe: %s", strerror(errno));
    return;
  }
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    dup2(fds[1], 2);
    void *volatile leak = malloc(4321);
    leak = NULL;
    (void)leak;
    exit(0);
  }
  close(fds[1]);
  static char report[1 << 16];
  size_t got = 0;
  ssize_t k;
  while ((k = read(fds[0], report + got, sizeof report - 1 - got)) > 0) got += (size_t)k;
  report[got] = 0;
  close(fds[0]);
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) {
    failf("fork for the LeakSanitizer self-check failed");
    return;
  }
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  int active = g_lsan_active = code != 0 && strstr(report, "LeakSanitizer: detected memory leaks") && strstr(report, "4321 byte");
  printf("test_soak: LeakSanitizer %s (a child leaking 4321 bytes exited with %d%s)\n", active ? "active" : "NOT ACTIVE",
         code, active ? " and a leak report naming them" : "");
  if (!active && !getenv("SPECMLA_SOAK_ALLOW_NO_LSAN"))
    failf("LeakSanitizer does not run (set ASAN_OPTIONS=detect_leaks=1; SPECMLA_SOAK_ALLOW_NO_LSAN=1 to skip)");
}

/* ---------------------------------------------------------------------------------------------
 * final checks: exactly one finish per submitted request */
static void check_request(uint64_t id, rec_t *r) {
  if (!r->submitted) {
    EXPECT(r->n == 0 && r->n_finish == 0, "events for request %llu that no submit returned", (unsigned long long)id);
    return;
  }
  if (r->n_finish != 1) {
    failf("request %llu (%s): %d finish events (%s)", (unsigned long long)id, KIND_NAME[r->kind], r->n_finish,
          r->n_finish == 0 ? "lost" : "duplicated");
    return;
  }
  EXPECT(r->settled, "request %llu: finished but never checked", (unsigned long long)id);
  EXPECT(r->after_finish == 0, "request %llu: %d events after its finish", (unsigned long long)id, r->after_finish);
  EXPECT(r->bad_event == 0, "request %llu: malformed events", (unsigned long long)id);
  EXPECT(r->finish != SPECMLA_FINISH_CANCELLED || r->cancel == 1,
         "request %llu: CANCELLED but no cancel call succeeded for it (cancel state %d)", (unsigned long long)id,
         r->cancel);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  double t_start = now_s();
  setvbuf(stdout, NULL, _IOLBF, 0);
  lsan_selfcheck();
  g_env = load_env();
  double seconds = atof(env_or("SPECMLA_SOAK_SECONDS", "0"));
  if (argc > 1) seconds = atof(argv[1]);
  long requests = atol(env_or("SPECMLA_SOAK_REQUESTS", "0"));
  if (requests <= 0) requests = seconds > 0 ? MAX_REQ - 1024 : 2400;
  if (seconds <= 0) seconds = 30;
  g_requests_per_sub = (requests + NSUB - 1) / NSUB;
  double rss_bound = atof(env_or("SPECMLA_SOAK_RSS_MB", "48"));
  g_budgets[0] = -1;
  g_budgets[1] = 0;
  g_budgets[2] = g_env.budget;
  g_budgets[3] = 2 * g_env.budget;
  if (make_bad_drafts() != 0) {
    failf("cannot create the bad drafts in %s: %s", g_tmp, strerror(errno));
    return 1;
  }
  atexit(remove_bad_drafts);

  /* 1. references: a fresh engine without a drafter, one request at a time */
  specmla_engine_params rp = specmla_engine_default_params();
  rp.threads = 2;
  specmla_engine *ref = NULL;
  if (specmla_engine_create(g_env.target, NULL, &rp, &ref) != SPECMLA_OK) {
    failf("create reference engine: %s", specmla_last_error());
    return 1;
  }
  load_prompts(ref);
  if (g_nprompt == 0) {
    failf("no prompts");
    return 1;
  }
  size_t longest = 0, shortest = (size_t)-1;
  int li = 0;
  for (int i = 0; i < g_nprompt; i++) {
    if (g_plen[i] > longest) longest = g_plen[li = i];
    if (g_plen[i] < shortest) shortest = g_plen[i];
  }
  /* a pool for about two average requests: several running requests preempt each other */
  size_t pool_tokens = (size_t)(2.2 * (double)(longest + 48 + K_DRAFT + 1));
  g_pool_blocks = (uint32_t)((pool_tokens + BLOCK - 1) / BLOCK);
  for (int i = 0; i < g_nprompt; i++) g_fit_max[i] = g_pool_blocks * BLOCK - (uint32_t)g_plen[i] - K_DRAFT - 1;
  double t_ref = now_s();
  size_t ref_tokens = 0;
  for (int pi = 0; pi < g_nprompt; pi++) {
    for (int b = 0; b < NBUDGET; b++) {
      specmla_request_params p = base_params(g_budgets[b]);
      if (run_ref(ref, pi, &p, &g_ref_greedy[pi][b]) != 0) failf("greedy reference %d/%d: %s", pi, b, specmla_last_error());
      ref_tokens += g_ref_greedy[pi][b].n;
    }
    for (int s = 0; s < NSEED; s++) {
      specmla_request_params p = base_params(-1);
      sampled_params(&p, SEEDS[s]);
      if (run_ref(ref, pi, &p, &g_ref_sampled[pi][s]) != 0) failf("sampled reference %d/%d: %s", pi, s, specmla_last_error());
      ref_tokens += g_ref_sampled[pi][s].n;
    }
  }
  specmla_engine_free(ref);
  t_ref = now_s() - t_ref;
  printf("test_soak: %d prompts (%zu..%zu tokens), %d references (%zu tokens) in %.1f s; pool %u blocks of %d "
         "(fits max_tokens %u for the longest prompt)\n",
         g_nprompt, shortest, longest, g_nprompt * (NBUDGET + NSEED), ref_tokens, t_ref, g_pool_blocks, BLOCK,
         g_fit_max[li]);
  if (atomic_load(&g_fail)) return 1;

  /* 2. the soak: one engine, small KV pools, drafter from $SPECMLA_DRAFT */
  specmla_engine_params ep = specmla_engine_default_params();
  ep.threads = 2;
  ep.num_draft_tokens = K_DRAFT;
  ep.block_size = BLOCK;
  ep.kv_num_blocks = g_pool_blocks;
  ep.draft_kv_num_blocks = g_pool_blocks;
  ep.max_batch_tokens = 48; /* chunked prefill */
  ep.max_running = 16;
  if (specmla_engine_create(g_env.target, g_env.draft, &ep, &g_eng) != SPECMLA_OK) {
    failf("create engine: %s", specmla_last_error());
    return 1;
  }
  g_rec = calloc(MAX_REQ, sizeof *g_rec);
  /* the pool's exact limit: one token more than fit_max is refused (long requests ask for fit_max) */
  {
    specmla_request_params p = base_params(-1);
    p.max_tokens = g_fit_max[0] + 1;
    uint64_t id = 0;
    CHECK_STATUS(specmla_engine_submit(g_eng, g_prompt[0], g_plen[0], NULL, &p, &id), SPECMLA_ERR_KV_EXHAUSTED);
  }
  double rss_start = rss_mb();
  double t_soak = now_s();
  g_submit_deadline = t_soak + seconds;
  g_hard_deadline = g_submit_deadline + 90;
  pthread_t th_step, th_read, th_swap, th_sub[NSUB];
  pthread_create(&th_step, NULL, stepper, NULL);
  pthread_create(&th_read, NULL, reader, NULL);
  pthread_create(&th_swap, NULL, swapper, NULL);
  for (int i = 0; i < NSUB; i++) pthread_create(&th_sub[i], NULL, submitter, (void *)(intptr_t)i);
  for (int i = 0; i < NSUB; i++) pthread_join(th_sub[i], NULL);
  double t_submitted = now_s() - t_soak;
  pthread_join(th_swap, NULL);
  pthread_join(th_step, NULL);
  atomic_store(&g_stop_reader, 1);
  pthread_join(th_read, NULL);
  t_soak = now_s() - t_soak;
  double rss_end = rss_mb();

  /* 3. checks */
  specmla_stats st;
  CHECK_OK(specmla_engine_stats(g_eng, &st));
  EXPECT(st.running == 0 && st.waiting == 0, "after draining: %llu running, %llu waiting",
         (unsigned long long)st.running, (unsigned long long)st.waiting);
  EXPECT(st.kv_used_blocks == 0, "after draining: %llu KV blocks still held (free %llu, cached %llu of %llu)",
         (unsigned long long)st.kv_used_blocks, (unsigned long long)st.kv_free_blocks,
         (unsigned long long)st.kv_cached_blocks, (unsigned long long)st.kv_num_blocks);
  long total_sub = 0, refused_kv = 0, refused_inv = 0, cancels = 0, cancels_unknown = 0, texts = 0;
  for (int i = 0; i < NSUB; i++) {
    total_sub += g_sub_stats[i].submitted;
    refused_kv += g_sub_stats[i].refused_kv;
    refused_inv += g_sub_stats[i].refused_invalid;
    cancels += g_sub_stats[i].cancels;
    cancels_unknown += g_sub_stats[i].cancels_unknown;
    texts += g_sub_stats[i].text;
  }
  unsigned long long max_id = atomic_load(&g_max_id);
  EXPECT(max_id == (unsigned long long)total_sub, "ids: highest %llu, %ld submitted", max_id, total_sub);
  long *by_finish = g_by_finish, by_kind[4] = {0}, checked_ref = g_checked_ref;
  specmla_counters sum;
  memset(&sum, 0, sizeof sum);
  pthread_mutex_lock(&g_mu);
  for (uint64_t id = 1; id < MAX_REQ && (id <= max_id || g_rec[id].n || g_rec[id].n_finish); id++) {
    rec_t *r = &g_rec[id];
    check_request(id, r);
    if (!r->submitted) continue;
    by_kind[r->kind]++;
    specmla_counters c;
    specmla_status s = specmla_engine_request_counters(g_eng, id, &c);
    if (s != SPECMLA_OK) {
      failf("counters of finished request %llu: %s", (unsigned long long)id, specmla_status_name(s));
      continue;
    }
    check_counters(&c, "final", id);
    EXPECT(c.prompt_tokens == g_plen[r->prompt], "request %llu: prompt_tokens %llu != %zu", (unsigned long long)id,
           (unsigned long long)c.prompt_tokens, g_plen[r->prompt]);
    EXPECT(c.reasoning_tokens + c.answer_tokens + c.forced_tokens == r->n,
           "request %llu: reasoning %llu + answer %llu + forced %llu != %zu committed", (unsigned long long)id,
           (unsigned long long)c.reasoning_tokens, (unsigned long long)c.answer_tokens,
           (unsigned long long)c.forced_tokens, r->n);
    if (r->kind == K_GREEDY && g_budgets[r->bidx] >= 0)
      EXPECT(c.reasoning_tokens <= (uint64_t)g_budgets[r->bidx], "request %llu: reasoning %llu over budget %lld",
             (unsigned long long)id, (unsigned long long)c.reasoning_tokens, (long long)g_budgets[r->bidx]);
    if (!r->speculate)
      EXPECT(c.drafted_tokens == 0, "request %llu: speculate=false but %llu drafted", (unsigned long long)id,
             (unsigned long long)c.drafted_tokens);
    sum.prompt_tokens += c.prompt_tokens;
    sum.drafted_tokens += c.drafted_tokens;
    sum.accepted_tokens += c.accepted_tokens;
    sum.reasoning_tokens += c.reasoning_tokens;
    sum.answer_tokens += c.answer_tokens;
    sum.preemptions += c.preemptions;
  }
  pthread_mutex_unlock(&g_mu);
  EXPECT(sum.prompt_tokens == st.totals.prompt_tokens && sum.drafted_tokens == st.totals.drafted_tokens &&
             sum.accepted_tokens == st.totals.accepted_tokens && sum.reasoning_tokens == st.totals.reasoning_tokens &&
             sum.answer_tokens == st.totals.answer_tokens && sum.preemptions == st.totals.preemptions,
         "per-request counters do not sum to the engine totals: prompt %llu/%llu drafted %llu/%llu accepted "
         "%llu/%llu reasoning %llu/%llu answer %llu/%llu preemptions %llu/%llu",
         (unsigned long long)sum.prompt_tokens, (unsigned long long)st.totals.prompt_tokens,
         (unsigned long long)sum.drafted_tokens, (unsigned long long)st.totals.drafted_tokens,
         (unsigned long long)sum.accepted_tokens, (unsigned long long)st.totals.accepted_tokens,
         (unsigned long long)sum.reasoning_tokens, (unsigned long long)st.totals.reasoning_tokens,
         (unsigned long long)sum.answer_tokens, (unsigned long long)st.totals.answer_tokens,
         (unsigned long long)sum.preemptions, (unsigned long long)st.totals.preemptions);
  /* the workload must have exercised what it is for */
  EXPECT(st.totals.preemptions > 0, "no preemption: the KV pool is not small enough to test it");
  EXPECT(by_finish[SPECMLA_FINISH_CANCELLED] > 0, "no request was cancelled mid-flight");
  EXPECT(refused_kv > 0 && refused_inv > 0, "no refusal exercised");
  EXPECT(g_sws.applied >= 3 && g_sws.failed_sync + g_sws.failed_async >= 2, "too few swaps: %ld applied, %ld failed",
         g_sws.applied, g_sws.failed_sync + g_sws.failed_async);
  EXPECT(st.totals.drafted_tokens > 0 && st.totals.accepted_tokens > 0, "nothing drafted or accepted");
  EXPECT(checked_ref > 0, "no request compared with its reference");

  /* RSS: from the first sample after a third of the requests finished to the end */
  double rss_base = rss_start;
  long fin = atomic_load(&g_finished);
  for (int i = 0; i < g_ss.n_rss; i++)
    if (g_ss.rss_fin[i] >= fin / 3) {
      rss_base = g_ss.rss[i];
      break;
    }
  double growth = rss_end - rss_base;
  EXPECT(growth < rss_bound, "RSS grew %.1f MB after warm-up (%.1f -> %.1f MB; bound %.0f MB)", growth, rss_base,
         rss_end, rss_bound);

  qsort(g_ss.lat, g_ss.n, sizeof *g_ss.lat, cmp_double);
  double p50 = g_ss.n ? g_ss.lat[g_ss.n / 2] : 0, p99 = g_ss.n ? g_ss.lat[(size_t)(g_ss.n * 0.99)] : 0,
         pmax = g_ss.n ? g_ss.lat[g_ss.n - 1] : 0;
  printf("test_soak: %ld requests in %.1f s (submitting %.1f s): %ld greedy (%ld as text), %ld sampled-plain, "
         "%ld sampled-spec, %ld long; %ld compared with references\n",
         total_sub, t_soak, t_submitted, by_kind[K_GREEDY], texts, by_kind[K_SAMPLED_PLAIN], by_kind[K_SAMPLED_SPEC],
         by_kind[K_LONG], checked_ref);
  printf("test_soak: finished stop %ld, length %ld, stop-string %ld, cancelled %ld, error %ld; refused at submit: "
         "%ld too large for the pool, %ld invalid; %ld cancels sent (%ld after the request had finished)\n",
         by_finish[SPECMLA_FINISH_STOP], by_finish[SPECMLA_FINISH_LENGTH], by_finish[SPECMLA_FINISH_STOP_STRING],
         by_finish[SPECMLA_FINISH_CANCELLED], by_finish[SPECMLA_FINISH_ERROR], refused_kv, refused_inv, cancels,
         cancels_unknown);
  printf("test_soak: %llu steps (%ld busy, %ld idle), step latency p50 %.2f ms p99 %.2f ms max %.2f ms; "
         "preemptions %llu; drafted %llu accepted %llu (mean acceptance length %.2f)\n",
         (unsigned long long)st.steps, g_ss.busy_steps, g_ss.idle_steps, p50 * 1e3, p99 * 1e3, pmax * 1e3,
         (unsigned long long)st.totals.preemptions, (unsigned long long)st.totals.drafted_tokens,
         (unsigned long long)st.totals.accepted_tokens, st.totals.mean_acceptance_length);
  printf("test_soak: swaps: %ld applied (draft model %ld, ngram %ld, none %ld), %ld refused sync, %ld failed async; "
         "draft generation %llu; reader: %ld counter reads (%ld not yet published), %ld stats reads\n",
         g_sws.applied, g_sws.by_kind[SPECMLA_DRAFT_PATH], g_sws.by_kind[SPECMLA_DRAFT_NGRAM],
         g_sws.by_kind[SPECMLA_DRAFT_NONE], g_sws.failed_sync, g_sws.failed_async,
         (unsigned long long)st.draft_generation, g_rs.counter_reads, g_rs.counter_unknown, g_rs.stats_reads);
  printf("test_soak: RSS %.1f MB at start, %.1f MB after a third of the requests, %.1f MB at the end: growth "
         "%.1f MB (bound %.0f MB); by finished requests:",
         rss_start, rss_base, rss_end, growth, rss_bound);
  for (int k = 1, i = 0; k <= 6 && g_ss.n_rss > 0; k++) {
    while (i < g_ss.n_rss - 1 && g_ss.rss_fin[i] < fin * k / 6) i++;
    printf(" %ld:%.0f", g_ss.rss_fin[i], g_ss.rss[i]);
  }
  printf("\n");

  CHECK_OK(specmla_engine_free(g_eng));
  pthread_mutex_lock(&g_mu);
  for (uint64_t id = 0; id < MAX_REQ; id++) {
    free(g_rec[id].tok);
    free(g_rec[id].lp);
    free(g_rec[id].err);
  }
  pthread_mutex_unlock(&g_mu);
  free(g_rec);
  free(g_ss.lat);
  for (int pi = 0; pi < g_nprompt; pi++) {
    free(g_ptext[pi]);
    for (int b = 0; b < NBUDGET; b++) free(g_ref_greedy[pi][b].tok), free(g_ref_greedy[pi][b].lp);
    for (int s = 0; s < NSEED; s++) free(g_ref_sampled[pi][s].tok), free(g_ref_sampled[pi][s].lp);
  }
  if (__lsan_do_recoverable_leak_check && g_lsan_active) {
    int leaks = __lsan_do_recoverable_leak_check();
    EXPECT(leaks == 0, "LeakSanitizer found leaks (report above)");
    printf("test_soak: LeakSanitizer: %s\n", leaks ? "LEAKS" : "no leaks");
  }
  int fails = atomic_load(&g_fail) + g_failures;
  if (fails) {
    fprintf(stderr, "test_soak: %d failure(s)\n", fails);
    return 1;
  }
  printf("test_soak: ok (%.1f s in all)\n", now_s() - t_start);
  return 0;
}
