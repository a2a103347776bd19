/* N-API addon over the specmla C ABI. Exposes plain functions on an external engine box;
 * index.js wraps them in the Engine class. step() and generate() run on the libuv thread pool
 * (napi_create_async_work) and settle Promises; everything else is synchronous. Built with plain
 * gcc against the node headers next to the installed node binary (no header download). */
#include <node_api.h>
#include <stdlib.h>
#include <string.h>

#include "specmla.h"

#define NAPI_CALL(env, call)                                              \
  do {                                                                    \
    if ((call) != napi_ok) {                                              \
      napi_throw_error((env), "ESPECMLA_NAPI", "N-API call failed: " #call); \
      return NULL;                                                        \
    }                                                                     \
  } while (0)

typedef struct {
  specmla_engine *eng; /* NULL after close */
} engine_box;

/* ---- errors ---- */

static napi_value make_error(napi_env env, specmla_status st, const char *msg) {
  napi_value m, code, err, num;
  napi_create_string_utf8(env, msg, NAPI_AUTO_LENGTH, &m);
  napi_create_string_utf8(env, specmla_status_name(st), NAPI_AUTO_LENGTH, &code);
  napi_create_error(env, code, m, &err);
  napi_create_int32(env, (int32_t)st, &num);
  napi_set_named_property(env, err, "status", num);
  return err;
}

/* Throw for a failed call; returns 1 when it threw. */
static int fail(napi_env env, specmla_status st) {
  if (st == SPECMLA_OK) return 0;
  napi_throw(env, make_error(env, st, specmla_last_error()));
  return 1;
}

static void throw_type(napi_env env, const char *msg) { napi_throw_type_error(env, "ESPECMLA_ARG", msg); }

/* ---- argument helpers ---- */

static char *get_string(napi_env env, napi_value v) {
  size_t len = 0;
  if (napi_get_value_string_utf8(env, v, NULL, 0, &len) != napi_ok) return NULL;
  char *s = malloc(len + 1);
  napi_get_value_string_utf8(env, v, s, len + 1, &len);
  return s;
}

static engine_box *get_box(napi_env env, napi_value v) {
  void *p = NULL;
  if (napi_get_value_external(env, v, &p) != napi_ok || !p) {
    throw_type(env, "expected an engine handle");
    return NULL;
  }
  return (engine_box *)p;
}

static int has_prop(napi_env env, napi_value obj, const char *name, napi_value *out) {
  napi_valuetype t;
  if (napi_typeof(env, obj, &t) != napi_ok || t != napi_object) return 0;
  bool has = false;
  napi_has_named_property(env, obj, name, &has);
  if (!has) return 0;
  napi_get_named_property(env, obj, name, out);
  napi_typeof(env, *out, &t);
  return t != napi_undefined && t != napi_null;
}

static double num_prop(napi_env env, napi_value obj, const char *name, double def) {
  napi_value v;
  double d = def;
  if (has_prop(env, obj, name, &v)) napi_get_value_double(env, v, &d);
  return d;
}

static bool bool_prop(napi_env env, napi_value obj, const char *name, bool def) {
  napi_value v;
  bool b = def;
  if (has_prop(env, obj, name, &v)) napi_get_value_bool(env, v, &b);
  return b;
}

/* Reads an array of numbers (Array or Uint32Array) into a malloc'd buffer. */
static uint32_t *get_ids(napi_env env, napi_value v, size_t *n) {
  bool is_typed = false, is_array = false;
  napi_is_typedarray(env, v, &is_typed);
  napi_is_array(env, v, &is_array);
  *n = 0;
  if (is_typed) {
    napi_typedarray_type tt;
    size_t len;
    void *data;
    napi_get_typedarray_info(env, v, &tt, &len, &data, NULL, NULL);
    if (tt != napi_uint32_array) return NULL;
    uint32_t *out = malloc((len ? len : 1) * sizeof *out);
    memcpy(out, data, len * sizeof *out);
    *n = len;
    return out;
  }
  if (!is_array) return NULL;
  uint32_t len = 0;
  napi_get_array_length(env, v, &len);
  uint32_t *out = malloc((len ? len : 1) * sizeof *out);
  for (uint32_t i = 0; i < len; i++) {
    napi_value e;
    uint32_t x = 0;
    napi_get_element(env, v, i, &e);
    napi_get_value_uint32(env, e, &x);
    out[i] = x;
  }
  *n = len;
  return out;
}

/* Request params plus the C copies they point to. */
typedef struct {
  specmla_request_params p;
  uint32_t *stop_ids, *think_start, *think_end;
  char **stops;
  size_t n_stops;
  char *label;
} req_params;

static void req_params_free(req_params *r) {
  free(r->stop_ids);
  free(r->think_start);
  free(r->think_end);
  for (size_t i = 0; i < r->n_stops; i++) free(r->stops[i]);
  free(r->stops);
  free(r->label);
}

static void read_request(napi_env env, napi_value o, req_params *r) {
  memset(r, 0, sizeof *r);
  r->p = specmla_request_default_params();
  r->p.max_tokens = (uint32_t)num_prop(env, o, "maxTokens", r->p.max_tokens);
  r->p.temperature = (float)num_prop(env, o, "temperature", r->p.temperature);
  r->p.top_k = (uint32_t)num_prop(env, o, "topK", r->p.top_k);
  r->p.top_p = (float)num_prop(env, o, "topP", r->p.top_p);
  r->p.seed = (uint64_t)num_prop(env, o, "seed", 0);
  r->p.reasoning_budget = (int64_t)num_prop(env, o, "reasoningBudget", -1);
  r->p.ignore_eos = bool_prop(env, o, "ignoreEos", false);
  r->p.speculate = bool_prop(env, o, "speculate", true);
  napi_value v;
  size_t n = 0;
  if (has_prop(env, o, "stopTokenIds", &v) && (r->stop_ids = get_ids(env, v, &n))) {
    r->p.stop_token_ids = r->stop_ids;
    r->p.n_stop_token_ids = n;
  }
  if (has_prop(env, o, "thinkStart", &v) && (r->think_start = get_ids(env, v, &n))) {
    r->p.think_start = r->think_start;
    r->p.n_think_start = n;
  }
  if (has_prop(env, o, "thinkEnd", &v) && (r->think_end = get_ids(env, v, &n))) {
    r->p.think_end = r->think_end;
    r->p.n_think_end = n;
  }
  if (has_prop(env, o, "label", &v) && (r->label = get_string(env, v))) r->p.label = r->label;
  r->p.draft_arm = (int32_t)num_prop(env, o, "draftArm", -1);
  if (has_prop(env, o, "stopStrings", &v)) {
    uint32_t len = 0;
    napi_get_array_length(env, v, &len);
    r->stops = calloc(len ? len : 1, sizeof(char *));
    for (uint32_t i = 0; i < len; i++) {
      napi_value e;
      napi_get_element(env, v, i, &e);
      r->stops[i] = get_string(env, e);
      if (!r->stops[i]) r->stops[i] = calloc(1, 1);
    }
    r->n_stops = len;
    r->p.stop_strings = (const char *const *)r->stops;
    r->p.n_stop_strings = len;
  }
}

/* Submit prompt (string or ids) with options object; returns status. */
static specmla_status submit(napi_env env, specmla_engine *eng, napi_value prompt, napi_value opts, uint64_t *id) {
  req_params r;
  read_request(env, opts, &r);
  napi_valuetype t;
  napi_typeof(env, prompt, &t);
  specmla_status st;
  if (t == napi_string) {
    char *text = get_string(env, prompt);
    st = specmla_engine_submit(eng, NULL, 0, text, &r.p, id);
    free(text);
  } else {
    size_t n = 0;
    uint32_t *ids = get_ids(env, prompt, &n);
    st = ids ? specmla_engine_submit(eng, ids, n, NULL, &r.p, id) : SPECMLA_ERR_INVALID_ARGUMENT;
    free(ids);
  }
  req_params_free(&r);
  return st;
}

/* ---- plain-data -> JS ---- */

static void set_num(napi_env env, napi_value obj, const char *name, double x) {
  napi_value v;
  napi_create_double(env, x, &v);
  napi_set_named_property(env, obj, name, v);
}

static napi_value ids_to_js(napi_env env, const uint32_t *ids, size_t n) {
  napi_value arr;
  napi_create_array_with_length(env, n, &arr);
  for (size_t i = 0; i < n; i++) {
    napi_value v;
    napi_create_uint32(env, ids[i], &v);
    napi_set_element(env, arr, (uint32_t)i, v);
  }
  return arr;
}

static napi_value u64s_to_js(napi_env env, const uint64_t *xs, size_t n) {
  napi_value arr;
  napi_create_array_with_length(env, n, &arr);
  for (size_t i = 0; i < n; i++) {
    napi_value v;
    napi_create_double(env, (double)xs[i], &v);
    napi_set_element(env, arr, (uint32_t)i, v);
  }
  return arr;
}

static napi_value counters_to_js(napi_env env, const specmla_counters *c) {
  napi_value o;
  napi_create_object(env, &o);
  set_num(env, o, "promptTokens", (double)c->prompt_tokens);
  set_num(env, o, "cachedPromptTokens", (double)c->cached_prompt_tokens);
  set_num(env, o, "reasoningTokens", (double)c->reasoning_tokens);
  set_num(env, o, "answerTokens", (double)c->answer_tokens);
  set_num(env, o, "draftedTokens", (double)c->drafted_tokens);
  set_num(env, o, "acceptedTokens", (double)c->accepted_tokens);
  set_num(env, o, "recoveredTokens", (double)c->recovered_tokens);
  set_num(env, o, "bonusTokens", (double)c->bonus_tokens);
  set_num(env, o, "forcedEndOfThink", (double)c->forced_end_of_think);
  set_num(env, o, "forcedTokens", (double)c->forced_tokens);
  set_num(env, o, "draftSteps", (double)c->draft_steps);
  set_num(env, o, "draftTokensSaved", (double)c->draft_tokens_saved);
  set_num(env, o, "preemptions", (double)c->preemptions);
  set_num(env, o, "meanAcceptanceLength", c->mean_acceptance_length);
  napi_set_named_property(env, o, "acceptedPerPosition", u64s_to_js(env, c->accepted_per_position, c->n_positions));
  napi_set_named_property(env, o, "draftedPerPosition", u64s_to_js(env, c->drafted_per_position, c->n_positions));
  return o;
}

static const char *finish_name(specmla_finish_reason f) {
  switch (f) {
    case SPECMLA_FINISH_STOP: return "stop";
    case SPECMLA_FINISH_STOP_STRING: return "stop_string";
    case SPECMLA_FINISH_LENGTH: return "length";
    case SPECMLA_FINISH_CANCELLED: return "cancelled";
    case SPECMLA_FINISH_ERROR: return "error";
    default: return NULL;
  }
}

static napi_value finish_to_js(napi_env env, specmla_finish_reason f) {
  napi_value v;
  const char *name = finish_name(f);
  if (name) napi_create_string_utf8(env, name, NAPI_AUTO_LENGTH, &v);
  else napi_get_null(env, &v);
  return v;
}

/* ---- async step / generate (work on the libuv pool, settle a Promise) ---- */

typedef struct {
  napi_async_work work;
  napi_deferred deferred;
  napi_ref keep; /* keeps the engine box alive while the work runs */
  specmla_engine *eng;
  specmla_status st;
  char err[2048];
  int is_generate;
  specmla_step_result *result; /* step */
  uint64_t id;                 /* generate */
  uint32_t *tokens;
  size_t n_tokens, cap_tokens;
  char *text;
  size_t text_len, text_cap;
  specmla_finish_reason finish;
  specmla_counters counters;
} job;

static void job_fail(job *j, specmla_status st, const char *msg) {
  j->st = st;
  strncpy(j->err, msg ? msg : "", sizeof j->err - 1);
}

static void append_tokens(job *j, const specmla_event *ev) {
  if (j->n_tokens + ev->n_tokens > j->cap_tokens) {
    j->cap_tokens = (j->n_tokens + ev->n_tokens) * 2 + 16;
    j->tokens = realloc(j->tokens, j->cap_tokens * sizeof *j->tokens);
  }
  if (ev->n_tokens) memcpy(j->tokens + j->n_tokens, ev->tokens, ev->n_tokens * sizeof *j->tokens);
  j->n_tokens += ev->n_tokens;
  if (j->text_len + ev->text_len + 1 > j->text_cap) {
    j->text_cap = (j->text_len + ev->text_len + 1) * 2;
    j->text = realloc(j->text, j->text_cap);
  }
  memcpy(j->text + j->text_len, ev->text, ev->text_len);
  j->text_len += ev->text_len;
  j->text[j->text_len] = 0;
}

/* Worker thread: the last error is thread-local, so it is copied into the job here. */
static void job_execute(napi_env env, void *data) {
  (void)env;
  job *j = data;
  if (!j->is_generate) {
    j->st = specmla_engine_step(j->eng, &j->result);
    if (j->st != SPECMLA_OK) job_fail(j, j->st, specmla_last_error());
    return;
  }
  while (j->finish == SPECMLA_FINISH_NONE) {
    specmla_step_result *r = NULL;
    specmla_status st = specmla_engine_step(j->eng, &r);
    if (st != SPECMLA_OK) {
      job_fail(j, st, specmla_last_error());
      return;
    }
    for (size_t i = 0; i < r->n_events; i++) {
      const specmla_event *ev = &r->events[i];
      if (ev->request_id != j->id) continue;
      append_tokens(j, ev);
      if (ev->finish_reason == SPECMLA_FINISH_ERROR) job_fail(j, SPECMLA_ERR_ENGINE, ev->error);
      j->finish = ev->finish_reason;
    }
    specmla_step_result_free(r);
  }
  if (j->st == SPECMLA_OK) {
    specmla_status st = specmla_engine_request_counters(j->eng, j->id, &j->counters);
    if (st != SPECMLA_OK) job_fail(j, st, specmla_last_error());
  }
}

static napi_value events_to_js(napi_env env, const specmla_step_result *r) {
  napi_value arr;
  napi_create_array_with_length(env, r->n_events, &arr);
  for (size_t i = 0; i < r->n_events; i++) {
    const specmla_event *ev = &r->events[i];
    napi_value o, text;
    napi_create_object(env, &o);
    set_num(env, o, "requestId", (double)ev->request_id);
    napi_set_named_property(env, o, "tokens", ids_to_js(env, ev->tokens, ev->n_tokens));
    napi_create_string_utf8(env, ev->text, ev->text_len, &text);
    napi_set_named_property(env, o, "text", text);
    napi_set_named_property(env, o, "finishReason", finish_to_js(env, ev->finish_reason));
    if (ev->error) {
      napi_value e;
      napi_create_string_utf8(env, ev->error, NAPI_AUTO_LENGTH, &e);
      napi_set_named_property(env, o, "error", e);
    }
    napi_set_element(env, arr, (uint32_t)i, o);
  }
  return arr;
}

static void job_complete(napi_env env, napi_status status, void *data) {
  job *j = data;
  if (status != napi_ok && j->st == SPECMLA_OK) job_fail(j, SPECMLA_ERR_ENGINE, "async work was cancelled");
  if (j->st != SPECMLA_OK) {
    napi_reject_deferred(env, j->deferred, make_error(env, j->st, j->err));
  } else if (!j->is_generate) {
    napi_resolve_deferred(env, j->deferred, events_to_js(env, j->result));
  } else {
    napi_value o, text;
    napi_create_object(env, &o);
    set_num(env, o, "requestId", (double)j->id);
    napi_set_named_property(env, o, "tokens", ids_to_js(env, j->tokens, j->n_tokens));
    napi_create_string_utf8(env, j->text ? j->text : "", j->text_len, &text);
    napi_set_named_property(env, o, "text", text);
    napi_set_named_property(env, o, "finishReason", finish_to_js(env, j->finish));
    napi_set_named_property(env, o, "counters", counters_to_js(env, &j->counters));
    napi_resolve_deferred(env, j->deferred, o);
  }
  specmla_step_result_free(j->result);
  free(j->tokens);
  free(j->text);
  napi_delete_reference(env, j->keep);
  napi_delete_async_work(env, j->work);
  free(j);
}

static napi_value start_job(napi_env env, napi_value handle, job *j) {
  napi_value promise, name;
  napi_create_promise(env, &j->deferred, &promise);
  napi_create_reference(env, handle, 1, &j->keep);
  napi_create_string_utf8(env, j->is_generate ? "specmla.generate" : "specmla.step", NAPI_AUTO_LENGTH, &name);
  napi_create_async_work(env, NULL, name, job_execute, job_complete, j, &j->work);
  napi_queue_async_work(env, j->work);
  return promise;
}

/* step(handle) -> Promise<Event[]> */
static napi_value js_step(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1];
  NAPI_CALL(env, napi_get_cb_info(env, info, &argc, argv, NULL, NULL));
  engine_box *b = argc >= 1 ? get_box(env, argv[0]) : NULL;
  if (!b) return NULL;
  job *j = calloc(1, sizeof *j);
  j->eng = b->eng;
  return start_job(env, argv[0], j);
}

/* generate(handle, prompt, opts) -> Promise<Output>; submit errors reject too. */
static napi_value js_generate(napi_env env, napi_callback_info info) {
  size_t argc = 3;
  napi_value argv[3];
  NAPI_CALL(env, napi_get_cb_info(env, info, &argc, argv, NULL, NULL));
  engine_box *b = argc >= 2 ? get_box(env, argv[0]) : NULL;
  if (!b) return NULL;
  job *j = calloc(1, sizeof *j);
  j->eng = b->eng;
  j->is_generate = 1;
  napi_value opts;
  if (argc >= 3) opts = argv[2];
  else napi_get_undefined(env, &opts);
  specmla_status st = submit(env, b->eng, argv[1], opts, &j->id);
  if (st != SPECMLA_OK) {
    napi_value promise;
    napi_deferred d;
    napi_create_promise(env, &d, &promise);
    napi_reject_deferred(env, d, make_error(env, st, specmla_last_error()));
    free(j);
    return promise;
  }
  return start_job(env, argv[0], j);
}

/* ---- synchronous calls ---- */

static void box_finalize(napi_env env, void *data, void *hint) {
  (void)env;
  (void)hint;
  engine_box *b = data;
  specmla_engine_free(b->eng);
  free(b);
}

static napi_value js_version(napi_env env, napi_callback_info info) {
  (void)info;
  napi_value v;
  napi_create_string_utf8(env, specmla_version(), NAPI_AUTO_LENGTH, &v);
  return v;
}

/* create(target, draft|null, opts) -> handle */
static napi_value js_create(napi_env env, napi_callback_info info) {
  size_t argc = 3;
  napi_value argv[3];
  NAPI_CALL(env, napi_get_cb_info(env, info, &argc, argv, NULL, NULL));
  if (argc < 1) {
    throw_type(env, "create(target, draft, opts)");
    return NULL;
  }
  char *target = get_string(env, argv[0]);
  char *draft = NULL;
  napi_valuetype t = napi_undefined;
  if (argc >= 2) napi_typeof(env, argv[1], &t);
  if (t == napi_string) draft = get_string(env, argv[1]);
  specmla_engine_params p = specmla_engine_default_params();
  if (argc >= 3) {
    p.num_draft_tokens = (uint32_t)num_prop(env, argv[2], "numDraftTokens", p.num_draft_tokens);
    p.adaptive = bool_prop(env, argv[2], "adaptive", p.adaptive);
    p.kv_num_blocks = (uint32_t)num_prop(env, argv[2], "kvNumBlocks", p.kv_num_blocks);
    p.draft_kv_num_blocks = (uint32_t)num_prop(env, argv[2], "draftKvNumBlocks", p.draft_kv_num_blocks);
    p.block_size = (uint32_t)num_prop(env, argv[2], "blockSize", p.block_size);
    p.threads = (uint32_t)num_prop(env, argv[2], "threads", p.threads);
    p.mtp = bool_prop(env, argv[2], "mtp", p.mtp);
    p.isa = (uint32_t)num_prop(env, argv[2], "isa", p.isa);
    p.kv_window_blocks = (uint32_t)num_prop(env, argv[2], "kvWindowBlocks", p.kv_window_blocks);
    p.kv_offload_mem_bytes = (uint64_t)num_prop(env, argv[2], "kvOffloadMemBytes", 0);
    p.kv_dtype = (uint32_t)num_prop(env, argv[2], "kvDtype", p.kv_dtype);
    p.draft_p_min = (float)num_prop(env, argv[2], "draftPMin", p.draft_p_min);
    p.huge_page_weights = bool_prop(env, argv[2], "hugePageWeights", p.huge_page_weights);
  }
  char *offload = NULL;
  napi_value ov;
  if (argc >= 3 && has_prop(env, argv[2], "kvOffloadDir", &ov) && (offload = get_string(env, ov)))
    p.kv_offload_dir = offload;
  char *device = NULL;
  if (argc >= 3 && has_prop(env, argv[2], "device", &ov) && (device = get_string(env, ov)))
    p.device = device;
  specmla_engine *eng = NULL;
  specmla_status st = target ? specmla_engine_create(target, draft, &p, &eng) : SPECMLA_ERR_NULL_POINTER;
  free(target);
  free(draft);
  free(offload);
  free(device);
  if (fail(env, st)) return NULL;
  engine_box *b = malloc(sizeof *b);
  b->eng = eng;
  napi_value ext;
  NAPI_CALL(env, napi_create_external(env, b, box_finalize, NULL, &ext));
  return ext;
}

static napi_value js_close(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1];
  NAPI_CALL(env, napi_get_cb_info(env, info, &argc, argv, NULL, NULL));
  engine_box *b = argc >= 1 ? get_box(env, argv[0]) : NULL;
  if (!b) return NULL;
  specmla_engine *e = b->eng;
  b->eng = NULL;
  if (fail(env, specmla_engine_free(e))) return NULL;
  return NULL;
}

#define ARGS(n)                                                      \
  size_t argc = (n);                                                 \
  napi_value argv[(n)];                                              \
  NAPI_CALL(env, napi_get_cb_info(env, info, &argc, argv, NULL, NULL)); \
  engine_box *b = argc >= 1 ? get_box(env, argv[0]) : NULL;          \
  if (!b) return NULL

static napi_value js_submit(napi_env env, napi_callback_info info) {
  ARGS(3);
  napi_value opts;
  if (argc >= 3) opts = argv[2];
  else napi_get_undefined(env, &opts);
  if (argc < 2) {
    throw_type(env, "submit(handle, prompt, opts)");
    return NULL;
  }
  uint64_t id = 0;
  if (fail(env, submit(env, b->eng, argv[1], opts, &id))) return NULL;
  napi_value v;
  napi_create_double(env, (double)id, &v);
  return v;
}

static napi_value js_cancel(napi_env env, napi_callback_info info) {
  ARGS(2);
  double id = 0;
  if (argc >= 2) napi_get_value_double(env, argv[1], &id);
  fail(env, specmla_engine_cancel(b->eng, (uint64_t)id));
  return NULL;
}

/* setDraftWeights(handle, pathOrBuffer, wait) -> ticket */
static napi_value js_set_draft_weights(napi_env env, napi_callback_info info) {
  ARGS(3);
  bool wait = true;
  if (argc >= 3) napi_get_value_bool(env, argv[2], &wait);
  specmla_draft_source src = specmla_draft_source_default();
  char *path = NULL;
  bool is_buf = false;
  if (argc >= 2) napi_is_buffer(env, argv[1], &is_buf);
  if (is_buf) {
    void *data;
    size_t len;
    napi_get_buffer_info(env, argv[1], &data, &len);
    src.kind = SPECMLA_DRAFT_BYTES;
    src.bytes = data;
    src.n_bytes = len;
  } else {
    path = argc >= 2 ? get_string(env, argv[1]) : NULL;
    if (!path) {
      throw_type(env, "setDraftWeights(path | Buffer, wait)");
      return NULL;
    }
    src.kind = SPECMLA_DRAFT_PATH;
    src.path = path;
  }
  uint64_t ticket = 0;
  specmla_status st = specmla_engine_set_draft_weights(b->eng, &src, wait, &ticket);
  free(path);
  if (fail(env, st)) return NULL;
  napi_value v;
  napi_create_double(env, (double)ticket, &v);
  return v;
}

/* setDraftMtp(handle, wait) -> ticket: the target's own MTP layer as the drafter */
static napi_value js_set_draft_mtp(napi_env env, napi_callback_info info) {
  ARGS(2);
  bool wait = true;
  if (argc >= 2) napi_get_value_bool(env, argv[1], &wait);
  specmla_draft_source src = specmla_draft_source_default();
  src.kind = SPECMLA_DRAFT_MTP;
  uint64_t ticket = 0;
  specmla_status st = specmla_engine_set_draft_weights(b->eng, &src, wait, &ticket);
  if (fail(env, st)) return NULL;
  napi_value v;
  napi_create_double(env, (double)ticket, &v);
  return v;
}

/* An A/B arm from its name: "mtp", "ngram", "none", else a draft model directory (path kept). */
static specmla_draft_source arm_source(const char *name) {
  specmla_draft_source s = specmla_draft_source_default();
  if (!strcmp(name, "mtp")) s.kind = SPECMLA_DRAFT_MTP;
  else if (!strcmp(name, "ngram")) s.kind = SPECMLA_DRAFT_NGRAM;
  else if (!strcmp(name, "none")) s.kind = SPECMLA_DRAFT_NONE;
  else {
    s.kind = SPECMLA_DRAFT_PATH;
    s.path = name;
  }
  return s;
}

/* setDraftAb(handle, a, b, shareB, wait) -> ticket: a live A/B of two drafters */
static napi_value js_set_draft_ab(napi_env env, napi_callback_info info) {
  ARGS(5);
  if (argc < 4) {
    throw_type(env, "setDraftAb(handle, a, b, shareB, wait)");
    return NULL;
  }
  char *an = get_string(env, argv[1]);
  char *bn = get_string(env, argv[2]);
  if (!an || !bn) {
    free(an);
    free(bn);
    throw_type(env, "A/B arms are strings: a directory, 'mtp', 'ngram' or 'none'");
    return NULL;
  }
  double share = 0.5;
  napi_get_value_double(env, argv[3], &share);
  bool wait = true;
  if (argc >= 5) napi_get_value_bool(env, argv[4], &wait);
  specmla_draft_source sa = arm_source(an), sb = arm_source(bn);
  specmla_draft_source src = specmla_draft_source_default();
  src.kind = SPECMLA_DRAFT_AB;
  src.ab_a = &sa;
  src.ab_b = &sb;
  src.ab_ratio_b = share;
  uint64_t ticket = 0;
  specmla_status st = specmla_engine_set_draft_weights(b->eng, &src, wait, &ticket);
  free(an);
  free(bn);
  if (fail(env, st)) return NULL;
  napi_value v;
  napi_create_double(env, (double)ticket, &v);
  return v;
}

static napi_value js_swap_status(napi_env env, napi_callback_info info) {
  ARGS(2);
  double t = 0;
  if (argc >= 2) napi_get_value_double(env, argv[1], &t);
  specmla_swap_state s;
  uint64_t gen = 0;
  if (fail(env, specmla_engine_swap_status(b->eng, (uint64_t)t, &s, &gen))) return NULL;
  static const char *names[] = {"pending", "applied", "failed", "unknown"};
  napi_value o, state;
  napi_create_object(env, &o);
  napi_create_string_utf8(env, names[s], NAPI_AUTO_LENGTH, &state);
  napi_set_named_property(env, o, "state", state);
  set_num(env, o, "generation", (double)gen);
  if (s == SPECMLA_SWAP_FAILED) {
    napi_value why;
    napi_create_string_utf8(env, specmla_last_error(), NAPI_AUTO_LENGTH, &why);
    napi_set_named_property(env, o, "reason", why);
  }
  return o;
}

static napi_value js_counters(napi_env env, napi_callback_info info) {
  ARGS(2);
  double id = 0;
  if (argc >= 2) napi_get_value_double(env, argv[1], &id);
  specmla_counters c;
  if (fail(env, specmla_engine_request_counters(b->eng, (uint64_t)id, &c))) return NULL;
  return counters_to_js(env, &c);
}

static napi_value js_stats(napi_env env, napi_callback_info info) {
  ARGS(1);
  specmla_stats s;
  if (fail(env, specmla_engine_stats(b->eng, &s))) return NULL;
  napi_value o, hd;
  napi_create_object(env, &o);
  set_num(env, o, "steps", (double)s.steps);
  set_num(env, o, "running", (double)s.running);
  set_num(env, o, "waiting", (double)s.waiting);
  set_num(env, o, "draftGeneration", (double)s.draft_generation);
  set_num(env, o, "kvNumBlocks", (double)s.kv_num_blocks);
  set_num(env, o, "kvUsedBlocks", (double)s.kv_used_blocks);
  set_num(env, o, "timeTargetForwardS", s.time_target_forward_s);
  set_num(env, o, "timeDraftS", s.time_draft_s);
  napi_get_boolean(env, s.has_drafter, &hd);
  napi_set_named_property(env, o, "hasDrafter", hd);
  napi_set_named_property(env, o, "totals", counters_to_js(env, &s.totals));
  return o;
}

static napi_value js_health(napi_env env, napi_callback_info info) {
  ARGS(1);
  specmla_health h;
  memset(&h, 0, sizeof h);
  h.struct_size = sizeof h;
  if (fail(env, specmla_engine_health(b->eng, &h))) return NULL;
  napi_value o, off;
  napi_create_object(env, &o);
  set_num(env, o, "panicsContained", (double)h.panics_contained);
  set_num(env, o, "kvBlocksReclaimed", (double)h.kv_blocks_reclaimed);
  set_num(env, o, "drafterPanics", (double)h.drafter_panics);
  napi_get_boolean(env, h.drafter_disabled, &off);
  napi_set_named_property(env, o, "drafterDisabled", off);
  return o;
}

static napi_value js_tokenize(napi_env env, napi_callback_info info) {
  ARGS(3);
  char *text = argc >= 2 ? get_string(env, argv[1]) : NULL;
  if (!text) {
    throw_type(env, "tokenize(handle, text, addSpecial)");
    return NULL;
  }
  bool add = false;
  if (argc >= 3) napi_get_value_bool(env, argv[2], &add);
  size_t n = 0;
  specmla_status st = specmla_tokenize(b->eng, text, add, NULL, 0, &n);
  uint32_t *ids = malloc((n ? n : 1) * sizeof *ids);
  if (st == SPECMLA_ERR_BUFFER_TOO_SMALL) st = specmla_tokenize(b->eng, text, add, ids, n, &n);
  free(text);
  napi_value out = NULL;
  if (!fail(env, st)) out = ids_to_js(env, ids, n);
  free(ids);
  return out;
}

static napi_value js_detokenize(napi_env env, napi_callback_info info) {
  ARGS(3);
  size_t n = 0;
  uint32_t *ids = argc >= 2 ? get_ids(env, argv[1], &n) : NULL;
  if (!ids) {
    throw_type(env, "detokenize(handle, ids, skipSpecial)");
    return NULL;
  }
  bool skip = false;
  if (argc >= 3) napi_get_value_bool(env, argv[2], &skip);
  size_t len = 0;
  specmla_status st = specmla_detokenize(b->eng, ids, n, skip, NULL, 0, &len);
  char *buf = malloc(len + 1);
  if (st == SPECMLA_ERR_BUFFER_TOO_SMALL) st = specmla_detokenize(b->eng, ids, n, skip, buf, len + 1, &len);
  free(ids);
  napi_value out = NULL;
  if (!fail(env, st)) napi_create_string_utf8(env, buf, len, &out);
  free(buf);
  return out;
}


static napi_value js_metrics(napi_env env, napi_callback_info info) {
  ARGS(1);
  size_t len = 0;
  specmla_status st = specmla_engine_metrics(b->eng, NULL, 0, &len);
  char *buf = NULL;
  while (st == SPECMLA_ERR_BUFFER_TOO_SMALL) {
    free(buf);
    buf = malloc(len);
    st = specmla_engine_metrics(b->eng, buf, len, &len);
  }
  napi_value out = NULL;
  if (!fail(env, st)) napi_create_string_utf8(env, buf ? buf : "", buf ? len - 1 : 0, &out);
  free(buf);
  return out;
}

static napi_value init(napi_env env, napi_value exports) {
  napi_property_descriptor d[] = {
      {"version", NULL, js_version, NULL, NULL, NULL, napi_default, NULL},
      {"create", NULL, js_create, NULL, NULL, NULL, napi_default, NULL},
      {"close", NULL, js_close, NULL, NULL, NULL, napi_default, NULL},
      {"submit", NULL, js_submit, NULL, NULL, NULL, napi_default, NULL},
      {"step", NULL, js_step, NULL, NULL, NULL, napi_default, NULL},
      {"generate", NULL, js_generate, NULL, NULL, NULL, napi_default, NULL},
      {"cancel", NULL, js_cancel, NULL, NULL, NULL, napi_default, NULL},
      {"setDraftWeights", NULL, js_set_draft_weights, NULL, NULL, NULL, napi_default, NULL},
      {"setDraftMtp", NULL, js_set_draft_mtp, NULL, NULL, NULL, napi_default, NULL},
      {"setDraftAb", NULL, js_set_draft_ab, NULL, NULL, NULL, napi_default, NULL},
      {"swapStatus", NULL, js_swap_status, NULL, NULL, NULL, napi_default, NULL},
      {"counters", NULL, js_counters, NULL, NULL, NULL, napi_default, NULL},
      {"stats", NULL, js_stats, NULL, NULL, NULL, napi_default, NULL},
      {"health", NULL, js_health, NULL, NULL, NULL, napi_default, NULL},
      {"metrics", NULL, js_metrics, NULL, NULL, NULL, napi_default, NULL},
      {"tokenize", NULL, js_tokenize, NULL, NULL, NULL, napi_default, NULL},
      {"detokenize", NULL, js_detokenize, NULL, NULL, NULL, napi_default, NULL},
  };
  NAPI_CALL(env, napi_define_properties(env, exports, sizeof d / sizeof d[0], d));
  return exports;
}

NAPI_MODULE(specmla, init)
