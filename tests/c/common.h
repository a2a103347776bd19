/* Shared helpers of the C tests: test-model settings from the environment (set by the Makefile),
 * a greedy generate loop over the C ABI, and a tiny reader for the expected-output JSON line. */
#ifndef SPECMLA_TEST_COMMON_H
#define SPECMLA_TEST_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "specmla.h"

static int g_failures = 0;

#define CHECK(cond)                                                                    \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", __FILE__, __LINE__, \
              #cond, specmla_last_error());                                            \
      g_failures++;                                                                    \
    }                                                                                  \
  } while (0)

#define CHECK_STATUS(call, want)                                                          \
  do {                                                                                    \
    specmla_status got_ = (call);                                                         \
    if (got_ != (want)) {                                                                 \
      fprintf(stderr, "%s:%d: %s returned %s, want %s (last error: %s)\n", __FILE__,      \
              __LINE__, #call, specmla_status_name(got_), specmla_status_name(want),      \
              specmla_last_error());                                                      \
      g_failures++;                                                                       \
    }                                                                                     \
  } while (0)

#define CHECK_OK(call) CHECK_STATUS(call, SPECMLA_OK)

/* Settings of the test models (see the Makefile's test-bindings). */
typedef struct {
  const char *target, *draft, *draft2, *prompt, *expected_json;
  uint32_t prompt_ids[256];
  size_t n_prompt_ids;
  uint32_t think[2];
  int has_think; /* explicit markers (models without a tokenizer) */
  uint32_t max_tokens;
  int64_t budget;
} test_env;

static inline size_t parse_ids(const char *s, uint32_t *out, size_t cap) {
  size_t n = 0;
  while (s && *s && n < cap) {
    char *end;
    unsigned long v = strtoul(s, &end, 10);
    if (end == s) break;
    out[n++] = (uint32_t)v;
    s = end;
    while (*s == ',' || *s == ' ') s++;
  }
  return n;
}

static const char *env_or(const char *k, const char *d) {
  const char *v = getenv(k);
  return (v && *v) ? v : d;
}

static inline test_env load_env(void) {
  test_env e;
  memset(&e, 0, sizeof e);
  e.target = env_or("SPECMLA_TARGET", "models/golden/v3_yarn");
  e.draft = env_or("SPECMLA_DRAFT", "models/golden/v3_bf16");
  e.draft2 = env_or("SPECMLA_DRAFT2", e.draft);
  e.prompt = env_or("SPECMLA_PROMPT", NULL);
  e.expected_json = env_or("SPECMLA_EXPECTED_JSON", NULL);
  e.n_prompt_ids = parse_ids(env_or("SPECMLA_PROMPT_IDS", "5,17,42,7,99,3,1"), e.prompt_ids, 256);
  e.has_think = parse_ids(env_or("SPECMLA_THINK_IDS", ""), e.think, 2) == 2;
  e.max_tokens = (uint32_t)atoi(env_or("SPECMLA_MAX_TOKENS", "24"));
  e.budget = atoi(env_or("SPECMLA_BUDGET", "6"));
  return e;
}

/* Generated ids + text of one request. */
typedef struct {
  uint32_t ids[4096];
  size_t n;
  char text[65536];
  size_t text_len;
  specmla_finish_reason finish;
  int text_unreliable; /* expected text had \\u escapes (not decoded here) */
} gen_out;

static inline void append_event(gen_out *o, const specmla_event *ev) {
  for (size_t i = 0; i < ev->n_tokens && o->n < 4096; i++) o->ids[o->n++] = ev->tokens[i];
  if (o->text_len + ev->text_len < sizeof o->text) {
    memcpy(o->text + o->text_len, ev->text, ev->text_len);
    o->text_len += ev->text_len;
    o->text[o->text_len] = 0;
  }
  if (ev->finish_reason != SPECMLA_FINISH_NONE) o->finish = ev->finish_reason;
}

/* Step until request `id` finishes; returns 0 on success. */
static inline int run_until_done(specmla_engine *eng, uint64_t id, gen_out *o) {
  for (int guard = 0; guard < 100000; guard++) {
    specmla_step_result *r = NULL;
    if (specmla_engine_step(eng, &r) != SPECMLA_OK) return -1;
    int done = 0;
    for (size_t i = 0; i < r->n_events; i++) {
      if (r->events[i].request_id != id) continue;
      append_event(o, &r->events[i]);
      if (r->events[i].finish_reason != SPECMLA_FINISH_NONE) done = 1;
    }
    specmla_step_result_free(r);
    if (done) return 0;
  }
  return -1;
}

static inline specmla_request_params request_for(const test_env *e, int speculate, int64_t budget) {
  specmla_request_params p = specmla_request_default_params();
  p.max_tokens = e->max_tokens;
  p.speculate = speculate;
  p.reasoning_budget = budget;
  if (e->has_think) {
    p.think_start = &e->think[0];
    p.n_think_start = 1;
    p.think_end = &e->think[1];
    p.n_think_end = 1;
  }
  return p;
}

static inline specmla_status submit_prompt(specmla_engine *eng, const test_env *e, const specmla_request_params *p,
                                    uint64_t *id) {
  if (e->prompt) return specmla_engine_submit(eng, NULL, 0, e->prompt, p, id);
  return specmla_engine_submit(eng, e->prompt_ids, e->n_prompt_ids, NULL, p, id);
}

/* Reads `"token_ids": [..]` and `"text": ".."` (escapes \n \" \\ \t \uXXXX for ASCII) from the
 * first JSON line of `path`. Returns 0 on success. */
static inline int read_expected(const char *path, gen_out *o) {
  memset(o, 0, sizeof *o);
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  static char buf[1 << 20];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  char *nl = strchr(buf, '\n');
  if (nl) *nl = 0;
  char *t = strstr(buf, "\"token_ids\"");
  if (!t) return -1;
  t = strchr(t, '[');
  if (!t) return -1;
  o->n = parse_ids(t + 1, o->ids, 4096);
  char *s = strstr(buf, "\"text\"");
  if (!s) return 0;
  s = strchr(s + 6, '"');
  if (!s) return -1;
  s++;
  while (*s && *s != '"' && o->text_len + 1 < sizeof o->text) {
    char c = *s++;
    if (c == '\\') {
      char esc = *s++;
      if (esc == 'n') c = '\n';
      else if (esc == 't') c = '\t';
      else if (esc == 'r') c = '\r';
      else if (esc == 'u') { o->text_unreliable = 1; c = '?'; s += 4; }
      else c = esc;
    }
    o->text[o->text_len++] = c;
  }
  o->text[o->text_len] = 0;
  return 0;
}

#endif
