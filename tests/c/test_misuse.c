/* C ABI misuse suite: NULL pointers, freed and foreign handles, too-small buffers, invalid UTF-8,
 * bad params, unknown request ids, bad draft weights. Every call must fail cleanly with the
 * documented status (no crash, no leak) — run under AddressSanitizer/LeakSanitizer. */
#include <stddef.h>
#include "common.h"

static int g_log_lines = 0;
static void on_log(uint32_t level, const char *msg, void *user) {
  (void)level;
  (void)msg;
  (*(int *)user)++;
}

int main(void) {
  test_env e = load_env();
  CHECK(specmla_abi_version() == SPECMLA_ABI_VERSION);
  CHECK(strlen(specmla_version()) > 0);
  CHECK(strcmp(specmla_status_name(SPECMLA_ERR_BUFFER_TOO_SMALL), "SPECMLA_ERR_BUFFER_TOO_SMALL") == 0);
  CHECK(strcmp(specmla_status_name(12345), "unknown") == 0);
  CHECK_OK(specmla_set_log_callback(on_log, &g_log_lines, SPECMLA_LOG_DEBUG));

  /* create: NULL args, missing dirs, bad params */
  specmla_engine *eng = (specmla_engine *)0x1;
  specmla_engine_params ep = specmla_engine_default_params();
  CHECK(ep.struct_size == sizeof ep);
  CHECK_STATUS(specmla_engine_create(e.target, NULL, &ep, NULL), SPECMLA_ERR_NULL_POINTER);
  CHECK_STATUS(specmla_engine_create(NULL, NULL, &ep, &eng), SPECMLA_ERR_NULL_POINTER);
  CHECK(eng == NULL); /* out-param cleared on failure */
  CHECK_STATUS(specmla_engine_create("/nonexistent/model", NULL, &ep, &eng), SPECMLA_ERR_IO);
  CHECK(strstr(specmla_last_error(), "nonexistent") != NULL);
  CHECK_STATUS(specmla_engine_create("\xff\xfe", NULL, &ep, &eng), SPECMLA_ERR_INVALID_UTF8);
  specmla_engine_params bad = ep;
  bad.num_draft_tokens = 0;
  CHECK_STATUS(specmla_engine_create(e.target, NULL, &bad, &eng), SPECMLA_ERR_INVALID_ARGUMENT);
  bad = ep;
  bad.num_draft_tokens = SPECMLA_MAX_DRAFT_POSITIONS + 1;
  CHECK_STATUS(specmla_engine_create(e.target, NULL, &bad, &eng), SPECMLA_ERR_INVALID_ARGUMENT);
  bad = ep;
  bad.kv_dtype = 99;
  CHECK_STATUS(specmla_engine_create(e.target, NULL, &bad, &eng), SPECMLA_ERR_INVALID_ARGUMENT);
  bad = ep;
  bad.struct_size = 0;
  CHECK_STATUS(specmla_engine_create(e.target, NULL, &bad, &eng), SPECMLA_ERR_INVALID_ARGUMENT);
  /* an old caller's shorter struct: missing fields take defaults */
  bad = ep;
  bad.struct_size = offsetof(specmla_engine_params, adaptive);
  bad.threads = 12345; /* beyond struct_size: must be ignored */
  CHECK_OK(specmla_engine_create(e.target, NULL, &bad, &eng));
  CHECK_OK(specmla_engine_free(eng));

  ep.threads = 2;
  ep.kv_num_blocks = 64;
  CHECK_OK(specmla_engine_create(e.target, e.draft, &ep, &eng));
  CHECK(g_log_lines > 0);

  /* foreign and NULL handles */
  int foreign_storage[16] = {0};
  specmla_engine *foreign = (specmla_engine *)foreign_storage;
  uint64_t id = 0;
  specmla_step_result *res = NULL;
  specmla_counters cnt;
  specmla_stats stats;
  CHECK_STATUS(specmla_engine_submit(NULL, e.prompt_ids, e.n_prompt_ids, NULL, NULL, &id), SPECMLA_ERR_INVALID_HANDLE);
  CHECK_STATUS(specmla_engine_submit(foreign, e.prompt_ids, e.n_prompt_ids, NULL, NULL, &id), SPECMLA_ERR_INVALID_HANDLE);
  CHECK_STATUS(specmla_engine_step(foreign, &res), SPECMLA_ERR_INVALID_HANDLE);
  CHECK(res == NULL);
  CHECK_STATUS(specmla_engine_stats(foreign, &stats), SPECMLA_ERR_INVALID_HANDLE);
  CHECK_STATUS(specmla_engine_cancel(foreign, 1), SPECMLA_ERR_INVALID_HANDLE);
  CHECK_STATUS(specmla_engine_free(foreign), SPECMLA_ERR_INVALID_HANDLE);
  CHECK_OK(specmla_engine_free(NULL));
  CHECK_OK(specmla_step_result_free(NULL));
  CHECK_STATUS(specmla_step_result_free((specmla_step_result *)foreign_storage), SPECMLA_ERR_INVALID_HANDLE);

  /* NULL out-params and arrays */
  CHECK_STATUS(specmla_engine_submit(eng, e.prompt_ids, e.n_prompt_ids, NULL, NULL, NULL), SPECMLA_ERR_NULL_POINTER);
  CHECK_STATUS(specmla_engine_submit(eng, NULL, 3, NULL, NULL, &id), SPECMLA_ERR_NULL_POINTER);
  CHECK_STATUS(specmla_engine_submit(eng, NULL, 0, NULL, NULL, &id), SPECMLA_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(specmla_engine_submit(eng, e.prompt_ids, e.n_prompt_ids, "both", NULL, &id), SPECMLA_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(specmla_engine_step(eng, NULL), SPECMLA_ERR_NULL_POINTER);
  CHECK_STATUS(specmla_engine_stats(eng, NULL), SPECMLA_ERR_NULL_POINTER);
  CHECK_STATUS(specmla_engine_health(eng, NULL), SPECMLA_ERR_NULL_POINTER);
  {
    /* health: versioned by struct_size; a too-small size is refused, an older (shorter) struct
       gets only its own fields written, a full one gets zeros on a healthy engine */
    specmla_health h;
    memset(&h, 0xAB, sizeof h);
    h.struct_size = 1;
    CHECK_STATUS(specmla_engine_health(eng, &h), SPECMLA_ERR_INVALID_ARGUMENT);
    memset(&h, 0xAB, sizeof h);
    h.struct_size = offsetof(specmla_health, kv_blocks_reclaimed);
    CHECK_OK(specmla_engine_health(eng, &h));
    CHECK(h.panics_contained == 0);
    CHECK(h.kv_blocks_reclaimed == 0xABABABABABABABABull); /* past its struct_size: untouched */
    h.struct_size = sizeof h;
    CHECK_OK(specmla_engine_health(eng, &h));
    CHECK(h.struct_size == sizeof h && h.panics_contained == 0 && h.kv_blocks_reclaimed == 0 &&
          h.drafter_panics == 0 && !h.drafter_disabled);
    CHECK_STATUS(specmla_engine_health(foreign, &h), SPECMLA_ERR_INVALID_HANDLE);
  }
  {
    /* metrics: the needed size comes back with BUFFER_TOO_SMALL, a big enough buffer gets the
       NUL-terminated Prometheus text */
    size_t need = 0;
    CHECK_STATUS(specmla_engine_metrics(eng, NULL, 0, NULL), SPECMLA_ERR_NULL_POINTER);
    CHECK_STATUS(specmla_engine_metrics(eng, NULL, 0, &need), SPECMLA_ERR_BUFFER_TOO_SMALL);
    CHECK(need > 1);
    char *text = malloc(need);
    CHECK(text != NULL);
    CHECK_STATUS(specmla_engine_metrics(eng, text, need - 1, &need), SPECMLA_ERR_BUFFER_TOO_SMALL);
    CHECK_OK(specmla_engine_metrics(eng, text, need, &need));
    CHECK(strlen(text) == need - 1);
    CHECK(strstr(text, "# TYPE specmla_spec_decode_num_accepted_tokens_total counter") != NULL);
    free(text);
    CHECK_STATUS(specmla_engine_metrics(foreign, NULL, 0, &need), SPECMLA_ERR_INVALID_HANDLE);
    /* a label with a control character is refused */
    specmla_request_params lp = specmla_request_default_params();
    lp.label = "bad\tlabel";
    CHECK_STATUS(specmla_engine_submit(eng, e.prompt_ids, e.n_prompt_ids, NULL, &lp, &id), SPECMLA_ERR_INVALID_REQUEST);
  }
  CHECK_STATUS(specmla_engine_request_counters(eng, 1, NULL), SPECMLA_ERR_NULL_POINTER);
  CHECK_STATUS(specmla_engine_set_draft_weights(eng, NULL, true, NULL), SPECMLA_ERR_NULL_POINTER);
  {
    /* an acceptance guard whose threshold is no rate is refused */
    specmla_draft_source gs = specmla_draft_source_default();
    gs.kind = SPECMLA_DRAFT_NGRAM;
    gs.guard_min_drafts = 8;
    gs.guard_threshold = 1.5;
    CHECK_STATUS(specmla_engine_set_draft_weights(eng, &gs, true, NULL), SPECMLA_ERR_INVALID_ARGUMENT);
    CHECK(strstr(specmla_last_error(), "guard") != NULL);
  }
  CHECK_STATUS(specmla_engine_swap_status(eng, 1, NULL, NULL), SPECMLA_ERR_NULL_POINTER);

  /* bad request params */
  specmla_request_params rp = specmla_request_default_params();
  rp.reasoning_budget = -2;
  CHECK_STATUS(specmla_engine_submit(eng, e.prompt_ids, e.n_prompt_ids, NULL, &rp, &id), SPECMLA_ERR_INVALID_ARGUMENT);
  rp = specmla_request_default_params();
  rp.top_p = 0.0f;
  CHECK_STATUS(specmla_engine_submit(eng, e.prompt_ids, e.n_prompt_ids, NULL, &rp, &id), SPECMLA_ERR_INVALID_REQUEST);
  rp = specmla_request_default_params();
  rp.max_tokens = 0;
  CHECK_STATUS(specmla_engine_submit(eng, e.prompt_ids, e.n_prompt_ids, NULL, &rp, &id), SPECMLA_ERR_INVALID_REQUEST);
  rp = specmla_request_default_params();
  const char *stops[] = {"ok", "\xc3\x28"};
  rp.stop_strings = stops;
  rp.n_stop_strings = 2;
  CHECK_STATUS(specmla_engine_submit(eng, e.prompt_ids, e.n_prompt_ids, NULL, &rp, &id), SPECMLA_ERR_INVALID_UTF8);
  rp = specmla_request_default_params();
  rp.n_stop_token_ids = 2; /* pointer left NULL */
  CHECK_STATUS(specmla_engine_submit(eng, e.prompt_ids, e.n_prompt_ids, NULL, &rp, &id), SPECMLA_ERR_NULL_POINTER);
  uint32_t huge[2] = {1, 0x7fffffff};
  CHECK_STATUS(specmla_engine_submit(eng, huge, 2, NULL, NULL, &id), SPECMLA_ERR_UNKNOWN_TOKEN);
  rp = specmla_request_default_params();
  rp.max_tokens = 1000000;
  CHECK_STATUS(specmla_engine_submit(eng, e.prompt_ids, e.n_prompt_ids, NULL, &rp, &id), SPECMLA_ERR_KV_EXHAUSTED);

  /* text prompts: invalid UTF-8 always fails; valid text needs a tokenizer */
  CHECK_STATUS(specmla_engine_submit(eng, NULL, 0, "bad \xff utf8", NULL, &id), SPECMLA_ERR_INVALID_UTF8);

  /* tokenizer buffers */
  size_t n = 0;
  uint32_t ids[4];
  specmla_status st = specmla_tokenize(eng, "hello", false, ids, 4, &n);
  if (st == SPECMLA_ERR_NO_TOKENIZER) {
    printf("misuse: model has no tokenizer; text checks limited\n");
    CHECK_STATUS(specmla_engine_submit(eng, NULL, 0, "hello", NULL, &id), SPECMLA_ERR_NO_TOKENIZER);
  } else {
    CHECK_OK(st);
    const char *long_text = "one two three four five six seven eight nine ten";
    n = 0;
    CHECK_STATUS(specmla_tokenize(eng, long_text, false, ids, 1, &n), SPECMLA_ERR_BUFFER_TOO_SMALL);
    CHECK(n > 1);
    uint32_t *big = malloc(n * sizeof *big);
    size_t n2 = 0;
    CHECK_OK(specmla_tokenize(eng, long_text, false, big, n, &n2));
    CHECK(n2 == n);
    char small[4];
    size_t len = 0;
    CHECK_STATUS(specmla_detokenize(eng, big, n2, false, small, sizeof small, &len), SPECMLA_ERR_BUFFER_TOO_SMALL);
    CHECK(len + 1 > sizeof small);
    char *txt = malloc(len + 1);
    size_t len2 = 0;
    CHECK_OK(specmla_detokenize(eng, big, n2, false, txt, len + 1, &len2));
    CHECK(len2 == len && txt[len] == 0);
    CHECK(strstr(txt, "three") != NULL);
    /* exactly len bytes is one too few (no room for the NUL) */
    CHECK_STATUS(specmla_detokenize(eng, big, n2, false, txt, len, &len2), SPECMLA_ERR_BUFFER_TOO_SMALL);
    free(txt);
    free(big);
    CHECK_STATUS(specmla_tokenize(eng, "bad \xff", false, ids, 4, &n), SPECMLA_ERR_INVALID_UTF8);
    uint32_t unknown = 0x7fffffff;
    CHECK_STATUS(specmla_detokenize(eng, &unknown, 1, false, small, sizeof small, &len), SPECMLA_ERR_UNKNOWN_TOKEN);
  }
  CHECK_STATUS(specmla_tokenize(eng, "x", false, ids, 4, NULL), SPECMLA_ERR_NULL_POINTER);

  /* unknown request ids */
  CHECK_STATUS(specmla_engine_cancel(eng, 987654), SPECMLA_ERR_UNKNOWN_REQUEST);
  CHECK_STATUS(specmla_engine_request_counters(eng, 987654, &cnt), SPECMLA_ERR_UNKNOWN_REQUEST);
  specmla_swap_state ss;
  CHECK_OK(specmla_engine_swap_status(eng, 987654, &ss, NULL));
  CHECK(ss == SPECMLA_SWAP_UNKNOWN);

  /* bad draft weights: missing file, garbage bytes, unknown kind, bad n-gram range */
  specmla_draft_source src = specmla_draft_source_default();
  src.kind = SPECMLA_DRAFT_PATH;
  src.path = "/nonexistent/draft.safetensors";
  CHECK(specmla_engine_set_draft_weights(eng, &src, true, NULL) != SPECMLA_OK);
  unsigned char garbage[64];
  for (int i = 0; i < 64; i++) garbage[i] = (unsigned char)(i * 37 + 11);
  src = specmla_draft_source_default();
  src.kind = SPECMLA_DRAFT_BYTES;
  src.bytes = garbage;
  src.n_bytes = sizeof garbage;
  specmla_status gs = specmla_engine_set_draft_weights(eng, &src, true, NULL);
  CHECK(gs == SPECMLA_ERR_MODEL || gs == SPECMLA_ERR_DRAFT || gs == SPECMLA_ERR_IO);
  src.n_bytes = 0;
  CHECK_STATUS(specmla_engine_set_draft_weights(eng, &src, true, NULL), SPECMLA_ERR_INVALID_ARGUMENT);
  src.kind = 77;
  CHECK_STATUS(specmla_engine_set_draft_weights(eng, &src, true, NULL), SPECMLA_ERR_INVALID_ARGUMENT);
  src = specmla_draft_source_default();
  src.kind = SPECMLA_DRAFT_NGRAM;
  src.ngram_min_n = 3;
  src.ngram_max_n = 1;
  CHECK_STATUS(specmla_engine_set_draft_weights(eng, &src, true, NULL), SPECMLA_ERR_DRAFT);
  src.kind = SPECMLA_DRAFT_PATH;
  src.path = "\xff";
  CHECK_STATUS(specmla_engine_set_draft_weights(eng, &src, true, NULL), SPECMLA_ERR_INVALID_UTF8);

  /* the engine still serves after all that; cancel works; counters of a cancelled request */
  rp = specmla_request_default_params();
  rp.max_tokens = 4;
  CHECK_OK(specmla_engine_submit(eng, e.prompt_ids, e.n_prompt_ids, NULL, &rp, &id));
  uint64_t id2 = 0;
  CHECK_OK(specmla_engine_submit(eng, e.prompt_ids, e.n_prompt_ids, NULL, &rp, &id2));
  CHECK_OK(specmla_engine_cancel(eng, id2));
  gen_out *o = calloc(1, sizeof *o);
  CHECK(run_until_done(eng, id, o) == 0);
  CHECK(o->n == 4 && o->finish == SPECMLA_FINISH_LENGTH);
  free(o);
  CHECK_STATUS(specmla_engine_cancel(eng, id), SPECMLA_ERR_UNKNOWN_REQUEST);
  CHECK_OK(specmla_engine_request_counters(eng, id, &cnt));
  CHECK(cnt.prompt_tokens == e.n_prompt_ids);
  bool work = true;
  CHECK_OK(specmla_engine_has_work(eng, &work));
  CHECK(!work);

  /* double free and use after free are detected (the handle is not dereferenced) */
  specmla_step_result *r = NULL;
  CHECK_OK(specmla_engine_step(eng, &r));
  CHECK_OK(specmla_step_result_free(r));
  CHECK_STATUS(specmla_step_result_free(r), SPECMLA_ERR_INVALID_HANDLE);
  CHECK_OK(specmla_engine_free(eng));
  CHECK_STATUS(specmla_engine_free(eng), SPECMLA_ERR_INVALID_HANDLE);
  CHECK_STATUS(specmla_engine_submit(eng, e.prompt_ids, e.n_prompt_ids, NULL, NULL, &id), SPECMLA_ERR_INVALID_HANDLE);
  CHECK_STATUS(specmla_engine_step(eng, &r), SPECMLA_ERR_INVALID_HANDLE);

  CHECK_OK(specmla_set_log_callback(NULL, NULL, 0));
  if (g_failures) {
    fprintf(stderr, "test_misuse: %d failure(s)\n", g_failures);
    return 1;
  }
  printf("test_misuse: ok (%d log lines)\n", g_log_lines);
  return 0;
}
