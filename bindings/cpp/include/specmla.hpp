// specmla C++ bindings: header-only RAII over the C ABI (include/specmla.h).
//
// - specmla::Engine owns one engine handle (move-only; the destructor frees it).
// - Every failing call throws specmla::Error carrying the C status and the library's message.
// - Inputs are std::span / std::string_view; outputs are owning std::vector / std::string.
// Thread-safety follows the C ABI (docs/C_ABI.md): all methods may be called from any thread;
// step() calls are serialised by the library; stats() waits for a running step.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "specmla.h"

namespace specmla {

/// A failed call: the C status plus the library's message.
class Error : public std::runtime_error {
 public:
  Error(specmla_status status, const std::string& msg)
      : std::runtime_error(std::string(specmla_status_name(status)) + ": " + msg), status_(status) {}
  specmla_status status() const noexcept { return status_; }

 private:
  specmla_status status_;
};

inline void check(specmla_status s) {
  if (s != SPECMLA_OK) throw Error(s, specmla_last_error());
}

inline std::string version() { return specmla_version(); }

/// Per-request options (defaults: greedy, 256 tokens, no budget, speculation on).
struct RequestOptions {
  uint32_t max_tokens = 256;
  float temperature = 0.0f;
  uint32_t top_k = 0;
  float top_p = 1.0f;
  uint64_t seed = 0;
  bool ignore_eos = false;
  bool speculate = true;
  bool logprobs = false;
  /// Most committed reasoning tokens; std::nullopt = unlimited.
  std::optional<int64_t> reasoning_budget;
  std::vector<uint32_t> stop_token_ids;
  std::vector<std::string> stop_strings;
  /// Marker overrides (default: the tokenizer's <think> / </think>).
  std::optional<std::vector<uint32_t>> think_start, think_end;
  /// Workload label for the metrics (empty = none; at most 64 bytes).
  std::string label;
  /// Under an A/B drafter (set_draft_ab): 0 = arm A, 1 = arm B; std::nullopt = by its share.
  std::optional<int32_t> draft_arm;
};

/// One arm of a live A/B (Engine::set_draft_ab): a draft model directory, the target's MTP
/// layer, the n-gram drafter, or none (a no-speculation control arm).
struct DraftArm {
  uint32_t kind = SPECMLA_DRAFT_NONE;  // SPECMLA_DRAFT_{NONE, NGRAM, PATH, MTP}
  std::string path;                    // SPECMLA_DRAFT_PATH
  uint32_t ngram_min_n = 1, ngram_max_n = 3;
};

/// What one step produced for one request.
struct Event {
  uint64_t request_id = 0;
  std::vector<uint32_t> tokens;
  std::string text;
  specmla_finish_reason finish = SPECMLA_FINISH_NONE;
  std::string error;
  bool finished() const noexcept { return finish != SPECMLA_FINISH_NONE; }
};

/// A finished request.
struct Output {
  uint64_t request_id = 0;
  std::vector<uint32_t> tokens;
  std::string text;
  specmla_finish_reason finish = SPECMLA_FINISH_NONE;
  specmla_counters counters{};
};

/// Engine settings; wraps specmla_engine_params with its defaults.
struct EngineOptions {
  specmla_engine_params params = specmla_engine_default_params();
};

class Engine {
 public:
  /// Load `target_dir` and optionally a draft model directory.
  explicit Engine(std::string_view target_dir, std::optional<std::string_view> draft_dir = std::nullopt,
                  const EngineOptions& opts = EngineOptions{}) {
    std::string t(target_dir);
    std::string d = draft_dir ? std::string(*draft_dir) : std::string();
    check(specmla_engine_create(t.c_str(), draft_dir ? d.c_str() : nullptr, &opts.params, &h_));
  }
  ~Engine() { specmla_engine_free(h_); }
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  Engine(Engine&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  Engine& operator=(Engine&& o) noexcept {
    if (this != &o) {
      specmla_engine_free(h_);
      h_ = std::exchange(o.h_, nullptr);
    }
    return *this;
  }

  specmla_engine* get() const noexcept { return h_; }

  uint64_t submit(std::span<const uint32_t> prompt_ids, const RequestOptions& o = {}) {
    return submit_impl(prompt_ids.data(), prompt_ids.size(), nullptr, o);
  }
  uint64_t submit(std::string_view prompt_text, const RequestOptions& o = {}) {
    std::string s(prompt_text);
    return submit_impl(nullptr, 0, s.c_str(), o);
  }

  std::vector<Event> step() {
    specmla_step_result* r = nullptr;
    check(specmla_engine_step(h_, &r));
    std::vector<Event> out;
    out.reserve(r->n_events);
    for (size_t i = 0; i < r->n_events; i++) {
      const specmla_event& e = r->events[i];
      Event ev;
      ev.request_id = e.request_id;
      ev.tokens.assign(e.tokens, e.tokens + e.n_tokens);
      ev.text.assign(e.text, e.text_len);
      ev.finish = e.finish_reason;
      if (e.error) ev.error = e.error;
      out.push_back(std::move(ev));
    }
    specmla_step_result_free(r);
    return out;
  }

  /// Submit and step until this request finishes (events of other requests are dropped, so use
  /// it when this thread owns the engine's stepping).
  template <class Prompt>
  Output generate(const Prompt& prompt, const RequestOptions& o = {}) {
    Output out;
    out.request_id = submit(prompt, o);
    while (out.finish == SPECMLA_FINISH_NONE) {
      for (auto& ev : step()) {
        if (ev.request_id != out.request_id) continue;
        out.tokens.insert(out.tokens.end(), ev.tokens.begin(), ev.tokens.end());
        out.text += ev.text;
        if (ev.finish == SPECMLA_FINISH_ERROR) throw Error(SPECMLA_ERR_ENGINE, ev.error);
        out.finish = ev.finish;
      }
    }
    out.counters = counters(out.request_id);
    return out;
  }

  void cancel(uint64_t id) { check(specmla_engine_cancel(h_, id)); }
  bool has_work() const {
    bool w = false;
    check(specmla_engine_has_work(h_, &w));
    return w;
  }

  /// New draft weights from a model directory or a .safetensors file. wait=true validates here
  /// (throws on bad weights); wait=false returns a ticket at once (see swap_status).
  uint64_t set_draft_weights(std::string_view path, bool wait = true) {
    std::string p(path);
    specmla_draft_source s = specmla_draft_source_default();
    s.kind = SPECMLA_DRAFT_PATH;
    s.path = p.c_str();
    return swap(s, wait);
  }
  /// New draft weights as safetensors bytes (copied) for the current draft architecture.
  uint64_t set_draft_weights(std::span<const uint8_t> bytes, bool wait = true) {
    specmla_draft_source s = specmla_draft_source_default();
    s.kind = SPECMLA_DRAFT_BYTES;
    s.bytes = bytes.data();
    s.n_bytes = bytes.size();
    return swap(s, wait);
  }

  /// The target's own multi-token-prediction layer as the drafter (DeepSeek-V3 or V4 MTP).
  uint64_t set_draft_mtp(bool wait = true) {
    specmla_draft_source s = specmla_draft_source_default();
    s.kind = SPECMLA_DRAFT_MTP;
    return swap(s, wait);
  }

  /// A live A/B of two drafters, each with its own draft KV: a request goes to the arm its
  /// RequestOptions::draft_arm names, else to B with probability share_b. Per-arm counters are
  /// in metrics() (label arm="a" / "b").
  uint64_t set_draft_ab(const DraftArm& a, const DraftArm& b, double share_b, bool wait = true) {
    auto arm = [](const DraftArm& d) {
      specmla_draft_source s = specmla_draft_source_default();
      s.kind = d.kind;
      s.path = d.path.empty() ? nullptr : d.path.c_str();
      s.ngram_min_n = d.ngram_min_n;
      s.ngram_max_n = d.ngram_max_n;
      return s;
    };
    specmla_draft_source sa = arm(a), sb = arm(b);
    specmla_draft_source s = specmla_draft_source_default();
    s.kind = SPECMLA_DRAFT_AB;
    s.ab_a = &sa;
    s.ab_b = &sb;
    s.ab_ratio_b = share_b;
    return swap(s, wait);
  }

  struct SwapInfo {
    specmla_swap_state state;
    uint64_t generation;
    std::string reason;  // why it FAILED
  };
  SwapInfo swap_status(uint64_t ticket) const {
    SwapInfo i{SPECMLA_SWAP_UNKNOWN, 0, {}};
    check(specmla_engine_swap_status(h_, ticket, &i.state, &i.generation));
    if (i.state == SPECMLA_SWAP_FAILED) i.reason = specmla_last_error();
    return i;
  }

  specmla_counters counters(uint64_t id) const {
    specmla_counters c{};
    check(specmla_engine_request_counters(h_, id, &c));
    return c;
  }
  specmla_stats stats() const {
    specmla_stats s{};
    check(specmla_engine_stats(h_, &s));
    return s;
  }
  // Failure containment: panics contained, KV block references reclaimed, drafter panics,
  // whether drafting is off after one.
  specmla_health health() const {
    specmla_health h{};
    h.struct_size = sizeof h;
    check(specmla_engine_health(h_, &h));
    return h;
  }

  // The engine's metrics in the Prometheus text format (counters per workload label and draft
  // generation, latency histograms, KV blocks, swaps).
  std::string metrics() const {
    size_t n = 0;
    specmla_status st = specmla_engine_metrics(h_, nullptr, 0, &n);
    while (st == SPECMLA_ERR_BUFFER_TOO_SMALL) {
      std::string buf(n, '\0');
      st = specmla_engine_metrics(h_, buf.data(), buf.size(), &n);
      if (st == SPECMLA_OK) {
        buf.resize(n - 1);
        return buf;
      }
    }
    check(st);
    return std::string();
  }

  std::vector<uint32_t> tokenize(std::string_view text, bool add_special = false) const {
    std::string t(text);
    std::vector<uint32_t> ids(t.size() + 8);
    size_t n = 0;
    specmla_status st = specmla_tokenize(h_, t.c_str(), add_special, ids.data(), ids.size(), &n);
    if (st == SPECMLA_ERR_BUFFER_TOO_SMALL) {
      ids.resize(n);
      st = specmla_tokenize(h_, t.c_str(), add_special, ids.data(), ids.size(), &n);
    }
    check(st);
    ids.resize(n);
    return ids;
  }
  std::string detokenize(std::span<const uint32_t> ids, bool skip_special = false) const {
    std::string out(ids.size() * 8 + 16, '\0');
    size_t len = 0;
    specmla_status st = specmla_detokenize(h_, ids.data(), ids.size(), skip_special, out.data(), out.size(), &len);
    if (st == SPECMLA_ERR_BUFFER_TOO_SMALL) {
      out.resize(len + 1);
      st = specmla_detokenize(h_, ids.data(), ids.size(), skip_special, out.data(), out.size(), &len);
    }
    check(st);
    out.resize(len);
    return out;
  }

 private:
  uint64_t submit_impl(const uint32_t* ids, size_t n, const char* text, const RequestOptions& o) {
    specmla_request_params p = specmla_request_default_params();
    p.max_tokens = o.max_tokens;
    p.temperature = o.temperature;
    p.top_k = o.top_k;
    p.top_p = o.top_p;
    p.seed = o.seed;
    p.ignore_eos = o.ignore_eos;
    p.speculate = o.speculate;
    p.logprobs = o.logprobs;
    p.label = o.label.empty() ? nullptr : o.label.c_str();
    p.draft_arm = o.draft_arm.value_or(-1);
    p.reasoning_budget = o.reasoning_budget.value_or(-1);
    p.stop_token_ids = o.stop_token_ids.data();
    p.n_stop_token_ids = o.stop_token_ids.size();
    std::vector<const char*> stops;
    for (const auto& s : o.stop_strings) stops.push_back(s.c_str());
    p.stop_strings = stops.data();
    p.n_stop_strings = stops.size();
    if (o.think_start) {
      p.think_start = o.think_start->data();
      p.n_think_start = o.think_start->size();
    }
    if (o.think_end) {
      p.think_end = o.think_end->data();
      p.n_think_end = o.think_end->size();
    }
    uint64_t id = 0;
    check(specmla_engine_submit(h_, ids, n, text, &p, &id));
    return id;
  }
  uint64_t swap(const specmla_draft_source& s, bool wait) {
    uint64_t t = 0;
    check(specmla_engine_set_draft_weights(h_, &s, wait, &t));
    return t;
  }

  specmla_engine* h_ = nullptr;
};

}  // namespace specmla
