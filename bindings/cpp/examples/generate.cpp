// C++ example: speculative generation with a reasoning budget, then the request's counters.
//   generate_cpp TARGET_DIR DRAFT_DIR "PROMPT" [MAX_TOKENS] [BUDGET]
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "specmla.hpp"

int main(int argc, char** argv) {
  if (argc < 4) {
    std::cerr << "usage: " << argv[0] << " TARGET_DIR DRAFT_DIR PROMPT [MAX_TOKENS] [BUDGET]\n";
    return 2;
  }
  try {
    specmla::Engine engine(argv[1], argv[2]);
    specmla::RequestOptions o;
    o.max_tokens = argc > 4 ? std::atoi(argv[4]) : 64;
    o.reasoning_budget = argc > 5 ? std::atoll(argv[5]) : 32;
    auto out = engine.generate(std::string_view(argv[3]), o);
    std::cout << out.text << "\n--\nreasoning " << out.counters.reasoning_tokens << " answer "
              << out.counters.answer_tokens << " drafted " << out.counters.drafted_tokens << " accepted "
              << out.counters.accepted_tokens << " mean acceptance length " << out.counters.mean_acceptance_length
              << "\n";
  } catch (const specmla::Error& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
}
