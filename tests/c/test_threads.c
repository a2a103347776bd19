/* Thread-safety of the C ABI: one thread steps while others submit, cancel, read counters and
 * swap drafts; then the engine is freed while a thread is still calling into it. Run under
 * AddressSanitizer: any use-after-free or race on library-owned memory shows up here. */
#include <pthread.h>

#include "common.h"

static specmla_engine *g_eng;
static test_env g_env;
static volatile int g_stop = 0;

static void *stepper(void *arg) {
  (void)arg;
  while (!g_stop) {
    specmla_step_result *r = NULL;
    if (specmla_engine_step(g_eng, &r) != SPECMLA_OK) break; /* freed under us: INVALID_HANDLE */
    specmla_step_result_free(r);
  }
  return NULL;
}

static void *submitter(void *arg) {
  int *submitted = arg;
  specmla_request_params p = request_for(&g_env, 1, g_env.budget);
  p.max_tokens = 8;
  for (int i = 0; i < 20; i++) {
    uint64_t id = 0;
    if (submit_prompt(g_eng, &g_env, &p, &id) != SPECMLA_OK) break;
    (*submitted)++;
    specmla_counters c;
    specmla_engine_request_counters(g_eng, id, &c); /* may be UNKNOWN until the next step */
    if (i % 3 == 0) specmla_engine_cancel(g_eng, id);
  }
  return NULL;
}

int main(void) {
  g_env = load_env();
  specmla_engine_params ep = specmla_engine_default_params();
  ep.threads = 2;
  ep.kv_num_blocks = 256;
  CHECK_OK(specmla_engine_create(g_env.target, g_env.draft, &ep, &g_eng));
  if (!g_eng) return 1;
  pthread_t st, sub[2];
  int counts[2] = {0, 0};
  pthread_create(&st, NULL, stepper, NULL);
  for (int i = 0; i < 2; i++) pthread_create(&sub[i], NULL, submitter, &counts[i]);
  specmla_draft_source src = specmla_draft_source_default();
  src.kind = SPECMLA_DRAFT_PATH;
  src.path = g_env.draft2;
  uint64_t ticket = 0;
  CHECK_OK(specmla_engine_set_draft_weights(g_eng, &src, false, &ticket));
  for (int i = 0; i < 2; i++) pthread_join(sub[i], NULL);
  CHECK(counts[0] == 20 && counts[1] == 20);
  /* drain */
  for (int i = 0; i < 5000; i++) {
    bool work = true;
    CHECK_OK(specmla_engine_has_work(g_eng, &work));
    specmla_swap_state s;
    CHECK_OK(specmla_engine_swap_status(g_eng, ticket, &s, NULL));
    if (!work && s != SPECMLA_SWAP_PENDING) break;
    struct timespec ts = {0, 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  specmla_stats stats;
  CHECK_OK(specmla_engine_stats(g_eng, &stats));
  CHECK(stats.running == 0 && stats.waiting == 0);
  CHECK(stats.draft_generation >= 1);
  /* free while the stepper thread is still calling step: it must see INVALID_HANDLE, not UB */
  CHECK_OK(specmla_engine_free(g_eng));
  pthread_join(st, NULL);
  g_stop = 1;
  if (g_failures) {
    fprintf(stderr, "test_threads: %d failure(s)\n", g_failures);
    return 1;
  }
  printf("test_threads: ok (%llu steps)\n", (unsigned long long)stats.steps);
  return 0;
}
