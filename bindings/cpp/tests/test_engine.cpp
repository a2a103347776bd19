// GoogleTest suite for the C++ bindings, on the test models named by the environment (see the
// root Makefile's test-bindings): speculative greedy generation with a reasoning budget, counters,
// draft swaps mid-run, equality with spec-off generation and with the Rust CLI's output.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "specmla.hpp"

namespace {

std::string env(const char* k, const char* d = "") {
  const char* v = std::getenv(k);
  return (v && *v) ? v : d;
}

std::vector<uint32_t> ids_of(const std::string& s) {
  std::vector<uint32_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(static_cast<uint32_t>(std::stoul(item)));
  }
  return out;
}

struct ModelSetup {
  std::string target = env("SPECMLA_TARGET", "models/golden/v3_yarn");
  std::string draft = env("SPECMLA_DRAFT", "models/golden/v3_bf16");
  std::string draft2 = env("SPECMLA_DRAFT2", draft.c_str());
  std::string prompt = env("SPECMLA_PROMPT");
  std::vector<uint32_t> prompt_ids = ids_of(env("SPECMLA_PROMPT_IDS", "5,17,42,7,99,3,1"));
  std::vector<uint32_t> think = ids_of(env("SPECMLA_THINK_IDS"));
  uint32_t max_tokens = static_cast<uint32_t>(std::stoul(env("SPECMLA_MAX_TOKENS", "24")));
  int64_t budget = std::stoll(env("SPECMLA_BUDGET", "6"));

  specmla::RequestOptions opts(bool speculate, std::optional<int64_t> b = std::nullopt) const {
    specmla::RequestOptions o;
    o.max_tokens = max_tokens;
    o.speculate = speculate;
    o.reasoning_budget = b;
    if (think.size() == 2) {
      o.think_start = std::vector<uint32_t>{think[0]};
      o.think_end = std::vector<uint32_t>{think[1]};
    }
    return o;
  }
  specmla::Output run(specmla::Engine& e, bool speculate, std::optional<int64_t> b = std::nullopt) const {
    if (!prompt.empty()) return e.generate(std::string_view(prompt), opts(speculate, b));
    return e.generate(std::span<const uint32_t>(prompt_ids), opts(speculate, b));
  }
  uint64_t submit(specmla::Engine& e) const {
    if (!prompt.empty()) return e.submit(std::string_view(prompt), opts(true));
    return e.submit(std::span<const uint32_t>(prompt_ids), opts(true));
  }
  specmla::Engine engine() const {
    specmla::EngineOptions eo;
    eo.params.threads = 2;
    eo.params.kv_num_blocks = 256;
    eo.params.draft_kv_num_blocks = 256;
    return specmla::Engine(target, draft, eo);
  }
};

// Minimal reader of `"token_ids": [..]` from the CLI's JSON line.
std::vector<uint32_t> expected_ids(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  auto k = line.find("\"token_ids\"");
  if (k == std::string::npos) return {};
  auto a = line.find('[', k), b = line.find(']', k);
  std::string inner = line.substr(a + 1, b - a - 1);
  for (auto& c : inner) if (c == ' ') c = ',';
  return ids_of(inner);
}

TEST(Engine, SpeculativeGreedyEqualsPlainAndCli) {
  ModelSetup s;
  auto e = s.engine();
  auto a = s.run(e, true);
  auto b = s.run(e, false);
  ASSERT_FALSE(a.tokens.empty());
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.text, b.text);
  EXPECT_GT(a.counters.drafted_tokens, 0u);
  EXPECT_LE(a.counters.accepted_tokens, a.counters.drafted_tokens);
  std::string exp = env("SPECMLA_EXPECTED_JSON");
  if (!exp.empty()) {
    EXPECT_EQ(a.tokens, expected_ids(exp)) << "differs from the Rust CLI's output in " << exp;
  }

  if (!s.prompt.empty()) {
    EXPECT_EQ(e.detokenize(a.tokens, /*skip_special=*/true), a.text);  // event text skips special tokens
  }
}

TEST(Engine, ReasoningBudgetAndCounters) {
  ModelSetup s;
  auto e = s.engine();
  auto c = s.run(e, true, s.budget);
  auto d = s.run(e, false, s.budget);
  EXPECT_EQ(c.tokens, d.tokens);
  EXPECT_LE(c.counters.reasoning_tokens, static_cast<uint64_t>(s.budget));
  EXPECT_LE(c.counters.accepted_tokens, c.counters.drafted_tokens);
  uint64_t acc = 0;
  for (uint32_t i = 0; i < c.counters.n_positions; i++) acc += c.counters.accepted_per_position[i];
  EXPECT_EQ(acc, c.counters.accepted_tokens);
  EXPECT_LE(c.counters.reasoning_tokens + c.counters.answer_tokens, c.tokens.size());
  EXPECT_EQ(c.counters.prompt_tokens, s.prompt.empty() ? s.prompt_ids.size() : e.tokenize(s.prompt).size());
}

TEST(Engine, DraftSwapMidRun) {
  ModelSetup s;
  auto e = s.engine();
  auto ref = s.run(e, true);
  uint64_t id = s.submit(e);
  std::vector<uint32_t> got;
  bool done = false;
  auto pump = [&] {
    for (auto& ev : e.step()) {
      if (ev.request_id != id) continue;
      got.insert(got.end(), ev.tokens.begin(), ev.tokens.end());
      done = done || ev.finished();
    }
  };
  pump();
  pump();
  try {
    e.set_draft_weights("/nonexistent/draft.safetensors");
    FAIL() << "bad weights were accepted";
  } catch (const specmla::Error& err) {
    EXPECT_NE(err.status(), SPECMLA_OK);
    EXPECT_NE(std::string(err.what()).find("nonexistent"), std::string::npos);
  }
  uint64_t t = e.set_draft_weights(s.draft2);
  while (!done) pump();
  EXPECT_EQ(got, ref.tokens);
  auto st = e.swap_status(t);
  EXPECT_EQ(st.state, SPECMLA_SWAP_APPLIED);
  // async: swap back, and a failing one that says why
  uint64_t t2 = e.set_draft_weights(s.draft, false);
  uint64_t t3 = e.set_draft_weights("/nonexistent/dir", false);
  for (int i = 0; i < 2000; i++) {
    if (e.swap_status(t2).state != SPECMLA_SWAP_PENDING && e.swap_status(t3).state != SPECMLA_SWAP_PENDING) break;
    e.step();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(e.swap_status(t2).state, SPECMLA_SWAP_APPLIED);
  auto f = e.swap_status(t3);
  EXPECT_EQ(f.state, SPECMLA_SWAP_FAILED);
  EXPECT_FALSE(f.reason.empty());
  EXPECT_EQ(s.run(e, true).tokens, ref.tokens);
  EXPECT_GE(e.stats().draft_generation, 2u);
  const specmla_health h = e.health();
  EXPECT_EQ(h.panics_contained, 0u);
  EXPECT_EQ(h.kv_blocks_reclaimed, 0u);
  EXPECT_EQ(h.drafter_panics, 0u);
  EXPECT_FALSE(h.drafter_disabled);
  // metrics: Prometheus text, the swaps counted, a labelled request's counters under its label
  specmla::RequestOptions lo;
  lo.max_tokens = 4;
  lo.label = "cpp-test";
  e.generate(std::span<const uint32_t>(s.prompt_ids), lo);
  const std::string m = e.metrics();
  EXPECT_NE(m.find("label=\"cpp-test\""), std::string::npos) << m;
  EXPECT_NE(m.find("# TYPE specmla_spec_decode_num_accepted_tokens_total counter"), std::string::npos);
  // two refused: the blocking load of a missing file and the background one of a missing dir
  EXPECT_NE(m.find("specmla_draft_swaps_total{outcome=\"failed\"} 2"), std::string::npos) << m;
}

TEST(Engine, ErrorsAndMoveSemantics) {
  ModelSetup s;
  EXPECT_THROW(specmla::Engine("/nonexistent/model"), specmla::Error);
  auto e = s.engine();
  specmla::Engine moved = std::move(e);
  EXPECT_EQ(e.get(), nullptr);
  try {
    moved.cancel(424242);
    FAIL();
  } catch (const specmla::Error& err) {
    EXPECT_EQ(err.status(), SPECMLA_ERR_UNKNOWN_REQUEST);
  }
  specmla::RequestOptions o;
  o.reasoning_budget = -5;
  EXPECT_THROW(moved.submit(std::span<const uint32_t>(s.prompt_ids), o), specmla::Error);
  EXPECT_THROW(moved.counters(99999), specmla::Error);
}

}  // namespace

TEST(Engine, V4WindowPoolOption) {
  const std::string target = env("SPECMLA_V4_TARGET", "models/golden/v4_mixed");
  specmla::EngineOptions eo;
  eo.params.threads = 2;
  eo.params.kv_window_blocks = 1;  // cannot hold one step's sliding window
  try {
    specmla::Engine bad(target, std::nullopt, eo);
    FAIL() << "a 1-block window pool was accepted";
  } catch (const specmla::Error& err) {
    EXPECT_NE(std::string(err.what()).find("kv_window_blocks"), std::string::npos) << err.what();
  }
  eo.params.kv_window_blocks = 64;
  specmla::Engine e(target, std::nullopt, eo);
  specmla::RequestOptions o;
  o.max_tokens = 8;
  o.ignore_eos = true;
  const std::vector<uint32_t> ids = {1, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41};
  auto out = e.generate(std::span<const uint32_t>(ids), o);
  EXPECT_EQ(out.tokens.size(), 8u);
}

TEST(Engine, MtpDrafterGreedyEqualsPlain) {
  ModelSetup s;
  std::string target = env("SPECMLA_MTP_TARGET", "models/golden/v3_yarn");  // has an MTP layer
  specmla::EngineOptions eo;
  eo.params.threads = 2;
  specmla::Engine plain(target, std::nullopt, eo);
  auto ref = s.run(plain, false);
  eo.params.mtp = true;
  specmla::Engine e(target, std::nullopt, eo);
  auto got = s.run(e, true);
  EXPECT_EQ(got.tokens, ref.tokens);
  EXPECT_GT(got.counters.drafted_tokens, 0u);
  plain.set_draft_mtp();
  EXPECT_EQ(s.run(plain, true).tokens, ref.tokens);
  // weights read into huge pages: the same output
  eo.params.huge_page_weights = true;
  specmla::Engine huge(target, std::nullopt, eo);
  EXPECT_EQ(s.run(huge, true).tokens, ref.tokens);
}

// A live A/B of two drafters: both arms keep the plain greedy output; the metrics carry both
// arms; a bad arm number and a bad share are refused.
TEST(Engine, DraftAbArms) {
  ModelSetup s;
  auto e = s.engine();
  auto ref = s.run(e, false);
  specmla::DraftArm a, b;
  a.kind = SPECMLA_DRAFT_PATH;
  a.path = s.draft;
  b.kind = SPECMLA_DRAFT_NGRAM;
  e.set_draft_ab(a, b, 0.5);
  for (int32_t arm : {0, 1}) {
    auto o = s.opts(true);
    o.draft_arm = arm;
    auto out = s.prompt.empty() ? e.generate(std::span<const uint32_t>(s.prompt_ids), o)
                                : e.generate(std::string_view(s.prompt), o);
    EXPECT_EQ(out.tokens, ref.tokens) << "arm " << arm;
  }
  const std::string m = e.metrics();
  EXPECT_NE(m.find("arm=\"a\""), std::string::npos);
  EXPECT_NE(m.find("arm=\"b\""), std::string::npos);
  auto o = s.opts(true);
  o.draft_arm = 2;
  const std::vector<uint32_t> ids = {1, 2, 3};
  EXPECT_THROW(e.submit(std::span<const uint32_t>(ids), o), specmla::Error);
  specmla::DraftArm mtp;
  mtp.kind = SPECMLA_DRAFT_MTP;
  EXPECT_THROW(e.set_draft_ab(mtp, specmla::DraftArm{}, 1.5), specmla::Error);
}

// The second KV tier on disk: a second engine on the same directory restores the first one's
// prompt blocks and generates the same tokens.
TEST(Engine, KvOffloadDirSurvivesTheEngine) {
  ModelSetup s;
  char tmpl[] = "/tmp/specmla-cpp-tier-XXXXXX";
  const char* dir = mkdtemp(tmpl);
  ASSERT_NE(dir, nullptr);
  std::vector<specmla::Output> outs;
  for (int i = 0; i < 2; i++) {
    specmla::EngineOptions eo;
    eo.params.threads = 2;
    eo.params.kv_num_blocks = 256;
    eo.params.draft_kv_num_blocks = 256;
    eo.params.kv_offload_dir = dir;
    specmla::Engine e(s.target, s.draft, eo);
    outs.push_back(s.run(e, true));
  }
  EXPECT_EQ(outs[1].tokens, outs[0].tokens);
  EXPECT_GT(outs[1].counters.cached_prompt_tokens, 0u);
  std::system((std::string("rm -rf ") + dir).c_str());
}

TEST(Engine, DeviceFieldReachesTheEngine) {
  ModelSetup s;
  specmla::EngineOptions eo;
  eo.params.threads = 2;
  eo.params.kv_num_blocks = 256;
  eo.params.draft_kv_num_blocks = 256;
  eo.params.device = "tpu:0";
  try {
    specmla::Engine e(s.target, s.draft, eo);
    FAIL() << "tpu:0 accepted";
  } catch (const specmla::Error& err) {
    EXPECT_NE(std::string(err.what()).find("expected cpu, cuda or cuda:N"), std::string::npos) << err.what();
  }
  eo.params.device = "cpu";
  specmla::Engine e(s.target, s.draft, eo);
  EXPECT_FALSE(s.run(e, true).tokens.empty());
}
