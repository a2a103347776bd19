/* C binding test: speculative greedy generation with a reasoning budget, counters, draft swaps
 * mid-run (good and bad weights), and equality with non-speculative generation and with the
 * Rust CLI's output (SPECMLA_EXPECTED_JSON). Built with sanitizers by `make test-c`. */
#include "common.h"

static gen_out g_a, g_b, g_c, g_d, g_swap, g_exp;

static void generate(specmla_engine *eng, const test_env *e, int speculate, int64_t budget, gen_out *o,
                     specmla_counters *counters) {
  memset(o, 0, sizeof *o);
  specmla_request_params p = request_for(e, speculate, budget);
  uint64_t id = 0;
  CHECK_OK(submit_prompt(eng, e, &p, &id));
  CHECK(run_until_done(eng, id, o) == 0);
  if (counters) CHECK_OK(specmla_engine_request_counters(eng, id, counters));
}

static int same_ids(const gen_out *x, const gen_out *y) {
  return x->n == y->n && memcmp(x->ids, y->ids, x->n * sizeof x->ids[0]) == 0;
}

int main(void) {
  test_env e = load_env();
  specmla_engine_params ep = specmla_engine_default_params();
  ep.num_draft_tokens = 4;
  ep.threads = 2;
  ep.kv_num_blocks = 256;
  ep.draft_kv_num_blocks = 256;
  specmla_engine *eng = NULL;
  CHECK_OK(specmla_engine_create(e.target, e.draft, &ep, &eng));
  if (!eng) return 1;

  /* speculative vs plain greedy, no budget */
  specmla_counters ca;
  generate(eng, &e, 1, -1, &g_a, &ca);
  generate(eng, &e, 0, -1, &g_b, NULL);
  CHECK(g_a.n > 0);
  CHECK(same_ids(&g_a, &g_b));
  CHECK(strcmp(g_a.text, g_b.text) == 0);
  CHECK(ca.drafted_tokens > 0);
  CHECK(ca.accepted_tokens <= ca.drafted_tokens);

  /* equal to the Rust CLI */
  if (e.expected_json) {
    CHECK(read_expected(e.expected_json, &g_exp) == 0);
    CHECK(same_ids(&g_a, &g_exp));
    if (!g_exp.text_unreliable) CHECK(strcmp(g_a.text, g_exp.text) == 0);
    printf("C: matches the CLI's %zu token ids\n", g_exp.n);
  }

  /* reasoning budget */
  specmla_counters cc;
  generate(eng, &e, 1, e.budget, &g_c, &cc);
  generate(eng, &e, 0, e.budget, &g_d, NULL);
  CHECK(same_ids(&g_c, &g_d));
  CHECK(cc.reasoning_tokens <= (uint64_t)e.budget);
  CHECK(cc.accepted_tokens <= cc.drafted_tokens);
  uint64_t acc = 0, dr = 0;
  for (uint32_t i = 0; i < cc.n_positions; i++) {
    acc += cc.accepted_per_position[i];
    dr += cc.drafted_per_position[i];
    CHECK(cc.accepted_per_position[i] <= cc.drafted_per_position[i]);
  }
  CHECK(acc == cc.accepted_tokens);
  CHECK(cc.n_positions <= 4);
  printf("C: budget %lld -> reasoning %llu answer %llu forced_end %llu drafted %llu accepted %llu mean_acc %.2f\n",
         (long long)e.budget, (unsigned long long)cc.reasoning_tokens, (unsigned long long)cc.answer_tokens,
         (unsigned long long)cc.forced_end_of_think, (unsigned long long)cc.drafted_tokens,
         (unsigned long long)cc.accepted_tokens, cc.mean_acceptance_length);

  /* swap mid-run: bad path fails, good weights land between steps, output unchanged */
  memset(&g_swap, 0, sizeof g_swap);
  specmla_request_params p = request_for(&e, 1, -1);
  uint64_t id = 0;
  CHECK_OK(submit_prompt(eng, &e, &p, &id));
  for (int i = 0; i < 2; i++) {
    specmla_step_result *r = NULL;
    CHECK_OK(specmla_engine_step(eng, &r));
    for (size_t j = 0; r && j < r->n_events; j++) append_event(&g_swap, &r->events[j]);
    specmla_step_result_free(r);
  }
  specmla_draft_source bad = specmla_draft_source_default();
  bad.kind = SPECMLA_DRAFT_PATH;
  bad.path = "/nonexistent/draft/weights.safetensors";
  uint64_t ticket = 0;
  specmla_status st = specmla_engine_set_draft_weights(eng, &bad, true, &ticket);
  CHECK(st != SPECMLA_OK);
  CHECK(strlen(specmla_last_error()) > 0);
  specmla_draft_source good = specmla_draft_source_default();
  good.kind = SPECMLA_DRAFT_PATH;
  good.path = e.draft2;
  CHECK_OK(specmla_engine_set_draft_weights(eng, &good, true, &ticket));
  CHECK(g_swap.finish == SPECMLA_FINISH_NONE);
  CHECK(run_until_done(eng, id, &g_swap) == 0);
  CHECK(same_ids(&g_swap, &g_a));
  specmla_swap_state state;
  uint64_t gen = 0;
  CHECK_OK(specmla_engine_swap_status(eng, ticket, &state, &gen));
  CHECK(state == SPECMLA_SWAP_APPLIED);
  CHECK(gen >= 1);

  /* async swap back, plus an async bad swap reporting why */
  good.path = e.draft;
  uint64_t t2 = 0, t3 = 0;
  CHECK_OK(specmla_engine_set_draft_weights(eng, &good, false, &t2));
  CHECK_OK(specmla_engine_set_draft_weights(eng, &bad, false, &t3));
  for (int i = 0; i < 2000; i++) {
    specmla_swap_state s2, s3;
    CHECK_OK(specmla_engine_swap_status(eng, t3, &s3, NULL));
    CHECK_OK(specmla_engine_swap_status(eng, t2, &s2, NULL));
    if (s2 != SPECMLA_SWAP_PENDING && s3 != SPECMLA_SWAP_PENDING) {
      CHECK(s2 == SPECMLA_SWAP_APPLIED);
      CHECK(s3 == SPECMLA_SWAP_FAILED);
      break;
    }
    specmla_step_result *r = NULL;
    CHECK_OK(specmla_engine_step(eng, &r)); /* an idle step installs ready drafters */
    specmla_step_result_free(r);
    struct timespec ts = {0, 5 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  generate(eng, &e, 1, -1, &g_b, NULL);
  CHECK(same_ids(&g_a, &g_b));

  specmla_stats stats;
  CHECK_OK(specmla_engine_stats(eng, &stats));
  CHECK(stats.draft_generation >= 2);
  CHECK(stats.has_drafter);
  CHECK(stats.totals.drafted_tokens >= ca.drafted_tokens);
  printf("C: %llu steps, draft generation %llu, mean acceptance length %.2f\n", (unsigned long long)stats.steps,
         (unsigned long long)stats.draft_generation, stats.totals.mean_acceptance_length);

  CHECK_OK(specmla_engine_free(eng));
  if (g_failures) {
    fprintf(stderr, "test_generate: %d failure(s)\n", g_failures);
    return 1;
  }
  printf("test_generate: ok (%zu tokens)\n", g_a.n);
  return 0;
}
