/* Speculative generation with a reasoning budget over the specmla C ABI.
 *
 *   generate TARGET_DIR DRAFT_DIR PROMPT [MAX_TOKENS] [BUDGET]
 *
 * PROMPT is text (models with a tokenizer.json) or, when it starts with "ids:", comma-separated
 * token ids. Streams the generated text (or ids) and prints the request's counters. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "specmla.h"

static int fail(const char *what, specmla_status st) {
  fprintf(stderr, "%s failed: %s: %s\n", what, specmla_status_name(st), specmla_last_error());
  return 1;
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s TARGET_DIR DRAFT_DIR PROMPT [MAX_TOKENS] [BUDGET]\n", argv[0]);
    return 2;
  }
  printf("specmla %s (ABI %u)\n", specmla_version(), specmla_abi_version());

  specmla_engine_params ep = specmla_engine_default_params();
  ep.num_draft_tokens = 4;
  ep.kv_num_blocks = 512;
  specmla_engine *eng = NULL;
  specmla_status st = specmla_engine_create(argv[1], argv[2], &ep, &eng);
  if (st != SPECMLA_OK) return fail("specmla_engine_create", st);

  specmla_request_params rp = specmla_request_default_params();
  rp.max_tokens = argc > 4 ? (uint32_t)atoi(argv[4]) : 64;
  rp.reasoning_budget = argc > 5 ? atoll(argv[5]) : 32;

  uint64_t id = 0;
  if (strncmp(argv[3], "ids:", 4) == 0) {
    uint32_t ids[1024];
    size_t n = 0;
    for (char *s = argv[3] + 4; *s && n < 1024;) {
      char *end;
      ids[n++] = (uint32_t)strtoul(s, &end, 10);
      s = (*end == ',') ? end + 1 : end;
      if (end == s && *end != ',') break;
    }
    /* no tokenizer: think markers must be explicit for a budget (ids 1 and 2 by convention here) */
    uint32_t start = 1, end = 2;
    rp.think_start = &start;
    rp.n_think_start = 1;
    rp.think_end = &end;
    rp.n_think_end = 1;
    st = specmla_engine_submit(eng, ids, n, NULL, &rp, &id);
  } else {
    st = specmla_engine_submit(eng, NULL, 0, argv[3], &rp, &id);
  }
  if (st != SPECMLA_OK) {
    specmla_engine_free(eng);
    return fail("specmla_engine_submit", st);
  }

  int done = 0;
  size_t n_tokens = 0;
  while (!done) {
    specmla_step_result *r = NULL;
    st = specmla_engine_step(eng, &r);
    if (st != SPECMLA_OK) {
      specmla_engine_free(eng);
      return fail("specmla_engine_step", st);
    }
    for (size_t i = 0; i < r->n_events; i++) {
      const specmla_event *ev = &r->events[i];
      if (ev->text_len) fwrite(ev->text, 1, ev->text_len, stdout);
      else
        for (size_t j = 0; j < ev->n_tokens; j++) printf("[%u]", ev->tokens[j]);
      n_tokens += ev->n_tokens;
      if (ev->finish_reason != SPECMLA_FINISH_NONE) done = 1;
      if (ev->finish_reason == SPECMLA_FINISH_ERROR) fprintf(stderr, "\nerror: %s\n", ev->error);
    }
    fflush(stdout);
    specmla_step_result_free(r);
  }

  specmla_counters c;
  specmla_engine_request_counters(eng, id, &c);
  printf("\n--\ntokens %zu | reasoning %" PRIu64 " (budget %" PRId64 ") answer %" PRIu64 " forced_end %" PRIu64
         "\ndrafted %" PRIu64 " accepted %" PRIu64 " recovered %" PRIu64 " bonus %" PRIu64 " saved %" PRIu64
         " | mean acceptance length %.2f\naccepted per position:",
         n_tokens, c.reasoning_tokens, rp.reasoning_budget, c.answer_tokens, c.forced_end_of_think,
         c.drafted_tokens, c.accepted_tokens, c.recovered_tokens, c.bonus_tokens, c.draft_tokens_saved,
         c.mean_acceptance_length);
  for (uint32_t i = 0; i < c.n_positions; i++)
    printf(" %" PRIu64 "/%" PRIu64, c.accepted_per_position[i], c.drafted_per_position[i]);
  printf("\n");
  specmla_engine_free(eng);
  return 0;
}
