// Speculative generation with a reasoning budget through the Go binding.
//
//	go run ./examples/generate [TARGET_DIR DRAFT_DIR [PROMPT]]
//
// Defaults come from SPECMLA_TARGET / SPECMLA_DRAFT / SPECMLA_PROMPT (token ids from
// SPECMLA_PROMPT_IDS and think markers from SPECMLA_THINK_IDS when the model has no tokenizer).
package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"specmla"
)

func arg(i int, envKey, def string) string {
	if len(os.Args) > i {
		return os.Args[i]
	}
	if v := os.Getenv(envKey); v != "" {
		return v
	}
	return def
}

func ids(s string) []uint32 {
	var out []uint32
	for _, f := range strings.Split(s, ",") {
		if v, err := strconv.ParseUint(strings.TrimSpace(f), 10, 32); err == nil {
			out = append(out, uint32(v))
		}
	}
	return out
}

func main() {
	target := arg(1, "SPECMLA_TARGET", "../../models/golden/v3_yarn")
	draft := arg(2, "SPECMLA_DRAFT", "../../models/golden/v3_bf16")
	prompt := arg(3, "SPECMLA_PROMPT", "")
	e, err := specmla.NewEngine(target, draft, specmla.DefaultEngineOptions())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer e.Close()
	o := specmla.DefaultRequestOptions()
	o.MaxTokens = 32
	o.ReasoningBudget = 8
	if th := ids(os.Getenv("SPECMLA_THINK_IDS")); len(th) == 2 {
		o.ThinkStart, o.ThinkEnd = th[:1], th[1:]
	}
	promptIDs := os.Getenv("SPECMLA_PROMPT_IDS")
	if promptIDs == "" {
		promptIDs = "5,17,42,7,99,3,1"
	}
	out, err := e.Generate(ids(promptIDs), prompt, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("specmla %s\ntokens %v\ntext %q\nfinish %s\n", specmla.Version(), out.Tokens, out.Text, out.Finish)
	c := out.Counters
	fmt.Printf("reasoning %d answer %d forced_end %d | drafted %d accepted %d mean acceptance length %.2f | per position %v / %v\n",
		c.ReasoningTokens, c.AnswerTokens, c.ForcedEndOfThink, c.DraftedTokens, c.AcceptedTokens,
		c.MeanAcceptanceLength, c.AcceptedPerPosition, c.DraftedPerPosition)
}
