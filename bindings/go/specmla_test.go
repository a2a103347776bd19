package specmla

import (
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Test models come from the environment (see the root Makefile's test-bindings).
type setup struct {
	target, draft, draft2, prompt string
	ids, think                    []uint32
	maxTokens                     uint32
	budget                        int64
}

func env(k, d string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return d
}

func idsOf(s string) []uint32 {
	var out []uint32
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			v, _ := strconv.ParseUint(f, 10, 32)
			out = append(out, uint32(v))
		}
	}
	return out
}

func load(t *testing.T) setup {
	root := "../../"
	s := setup{
		target: env("SPECMLA_TARGET", root+"models/golden/v3_yarn"),
		draft:  env("SPECMLA_DRAFT", root+"models/golden/v3_bf16"),
		prompt: os.Getenv("SPECMLA_PROMPT"),
		ids:    idsOf(env("SPECMLA_PROMPT_IDS", "5,17,42,7,99,3,1")),
		think:  idsOf(os.Getenv("SPECMLA_THINK_IDS")),
	}
	s.draft2 = env("SPECMLA_DRAFT2", s.draft)
	mt, _ := strconv.Atoi(env("SPECMLA_MAX_TOKENS", "24"))
	s.maxTokens = uint32(mt)
	s.budget, _ = strconv.ParseInt(env("SPECMLA_BUDGET", "6"), 10, 64)
	return s
}

func (s setup) opts(speculate bool, budget int64) RequestOptions {
	o := DefaultRequestOptions()
	o.MaxTokens = s.maxTokens
	o.Speculate = speculate
	o.ReasoningBudget = budget
	if len(s.think) == 2 {
		o.ThinkStart, o.ThinkEnd = s.think[:1], s.think[1:]
	}
	return o
}

func (s setup) engine(t *testing.T) *Engine {
	o := DefaultEngineOptions()
	o.Threads, o.KVNumBlocks, o.DraftKVNumBlocks = 2, 256, 256
	e, err := NewEngine(s.target, s.draft, o)
	if err != nil {
		t.Fatalf("NewEngine: %v", err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

func (s setup) run(t *testing.T, e *Engine, speculate bool, budget int64) Output {
	out, err := e.Generate(s.ids, s.prompt, s.opts(speculate, budget))
	if err != nil {
		t.Fatalf("Generate: %v", err)
	}
	return out
}

func TestSpeculativeGreedyEqualsPlainAndCLI(t *testing.T) {
	s := load(t)
	e := s.engine(t)
	a := s.run(t, e, true, -1)
	b := s.run(t, e, false, -1)
	if len(a.Tokens) == 0 || !reflect.DeepEqual(a.Tokens, b.Tokens) || a.Text != b.Text {
		t.Fatalf("speculative %v %q != plain %v %q", a.Tokens, a.Text, b.Tokens, b.Text)
	}
	if a.Counters.DraftedTokens == 0 || a.Counters.AcceptedTokens > a.Counters.DraftedTokens {
		t.Fatalf("bad counters %+v", a.Counters)
	}
	if p := os.Getenv("SPECMLA_EXPECTED_JSON"); p != "" {
		raw, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var exp struct {
			Text     string   `json:"text"`
			TokenIDs []uint32 `json:"token_ids"`
		}
		if err := json.Unmarshal([]byte(strings.SplitN(string(raw), "\n", 2)[0]), &exp); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(exp.TokenIDs, a.Tokens) || exp.Text != a.Text {
			t.Fatalf("CLI output %v %q != Go %v %q", exp.TokenIDs, exp.Text, a.Tokens, a.Text)
		}
	}
}

func TestReasoningBudgetCounters(t *testing.T) {
	s := load(t)
	e := s.engine(t)
	c := s.run(t, e, true, s.budget)
	d := s.run(t, e, false, s.budget)
	if !reflect.DeepEqual(c.Tokens, d.Tokens) {
		t.Fatalf("budgeted speculative %v != plain %v", c.Tokens, d.Tokens)
	}
	k := c.Counters
	if k.ReasoningTokens > uint64(s.budget) || k.AcceptedTokens > k.DraftedTokens {
		t.Fatalf("bad counters %+v", k)
	}
	var acc uint64
	for _, v := range k.AcceptedPerPosition {
		acc += v
	}
	if acc != k.AcceptedTokens || len(k.AcceptedPerPosition) > MaxDraftPositions {
		t.Fatalf("per-position %v does not sum to %d", k.AcceptedPerPosition, k.AcceptedTokens)
	}
}

func TestDraftSwapMidRun(t *testing.T) {
	s := load(t)
	e := s.engine(t)
	ref := s.run(t, e, true, -1)
	var id uint64
	var err error
	if s.prompt != "" {
		id, err = e.SubmitText(s.prompt, s.opts(true, -1))
	} else {
		id, err = e.Submit(s.ids, s.opts(true, -1))
	}
	if err != nil {
		t.Fatal(err)
	}
	var got []uint32
	done := false
	pump := func() {
		evs, err := e.Step()
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs {
			if ev.RequestID == id {
				got = append(got, ev.Tokens...)
				done = done || ev.Finish != FinishNone
			}
		}
	}
	pump()
	pump()
	if _, err := e.SetDraftWeights("/nonexistent/draft.safetensors", true); err == nil {
		t.Fatal("bad weights accepted")
	} else {
		var se *Error
		if !errors.As(err, &se) || !strings.Contains(se.Msg, "nonexistent") {
			t.Fatalf("unexpected error %v", err)
		}
	}
	if _, err := e.SetDraftWeightsBytes([]byte("not safetensors"), true); err == nil {
		t.Fatal("garbage bytes accepted")
	}
	ticket, err := e.SetDraftWeights(s.draft2, true)
	if err != nil {
		t.Fatal(err)
	}
	for !done {
		pump()
	}
	if !reflect.DeepEqual(got, ref.Tokens) {
		t.Fatalf("after swap %v != %v", got, ref.Tokens)
	}
	if st, gen, _, err := e.SwapStatus(ticket); err != nil || st != SwapApplied || gen == 0 {
		t.Fatalf("swap status %v %d %v", st, gen, err)
	}
	t2, _ := e.SetDraftWeights(s.draft, false)
	t3, _ := e.SetDraftWeights("/nonexistent/dir", false)
	var st2, st3 SwapState
	var why string
	for i := 0; i < 2000; i++ {
		st2, _, _, _ = e.SwapStatus(t2)
		st3, _, why, _ = e.SwapStatus(t3)
		if st2 != SwapPending && st3 != SwapPending {
			break
		}
		if _, err := e.Step(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if st2 != SwapApplied || st3 != SwapFailed || why == "" {
		t.Fatalf("async swaps: %v %v %q", st2, st3, why)
	}
	if again := s.run(t, e, true, -1); !reflect.DeepEqual(again.Tokens, ref.Tokens) {
		t.Fatalf("after swap back %v != %v", again.Tokens, ref.Tokens)
	}
	if st, err := e.Stats(); err != nil || st.DraftGeneration < 2 || !st.HasDrafter {
		t.Fatalf("stats %+v %v", st, err)
	}
}

func TestErrorsAndClose(t *testing.T) {
	s := load(t)
	if _, err := NewEngine("/nonexistent/model", "", DefaultEngineOptions()); err == nil {
		t.Fatal("missing model accepted")
	}
	e := s.engine(t)
	o := s.opts(true, -5)
	if _, err := e.Submit(s.ids, o); err == nil {
		t.Fatal("budget -5 accepted")
	} else if se := err.(*Error); se.Status != ErrInvalidArgument {
		t.Fatalf("want invalid argument, got %v", err)
	}
	if err := e.Cancel(987654); err == nil || err.(*Error).Status != ErrUnknownRequest {
		t.Fatalf("cancel unknown: %v", err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := e.Step(); err == nil || err.(*Error).Status != ErrInvalidHandle {
		t.Fatalf("step after Close: %v", err)
	}
}

func TestV4WindowPoolOption(t *testing.T) {
	target := env("SPECMLA_V4_TARGET", "../../models/golden/v4_mixed")
	o := DefaultEngineOptions()
	o.Threads = 2
	o.KVWindowBlocks = 1 // cannot hold one step's sliding window
	if _, err := NewEngine(target, "", o); err == nil || !strings.Contains(err.Error(), "kv_window_blocks") {
		t.Fatalf("a 1-block window pool: want an error naming kv_window_blocks, got %v", err)
	}
	o.KVWindowBlocks = 64
	e, err := NewEngine(target, "", o)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ro := DefaultRequestOptions()
	ro.MaxTokens = 8
	ro.IgnoreEOS = true
	out, err := e.Generate([]uint32{1, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41}, "", ro)
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Tokens) != 8 {
		t.Fatalf("want 8 tokens, got %d", len(out.Tokens))
	}
}

func TestMTPDrafterGreedyEqualsPlain(t *testing.T) {
	s := load(t)
	target := env("SPECMLA_MTP_TARGET", "../../models/golden/v3_yarn") // a target with an MTP layer
	o := DefaultEngineOptions()
	o.Threads, o.KVNumBlocks, o.DraftKVNumBlocks = 2, 256, 256
	plain, err := NewEngine(target, "", o)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	ref := s.run(t, plain, false, -1)
	o.MTP = true
	o.ISA = 1 // portable kernels: the same bits as the auto-chosen ones
	e, err := NewEngine(target, "", o)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if got := s.run(t, e, true, -1); !reflect.DeepEqual(got.Tokens, ref.Tokens) || got.Counters.DraftedTokens == 0 {
		t.Fatalf("MTP %v (drafted %d) != plain %v", got.Tokens, got.Counters.DraftedTokens, ref.Tokens)
	}
	if _, err := plain.SetDraftMTP(true); err != nil {
		t.Fatal(err)
	}
	if got := s.run(t, plain, true, -1); !reflect.DeepEqual(got.Tokens, ref.Tokens) {
		t.Fatalf("after a swap to MTP %v != plain %v", got.Tokens, ref.Tokens)
	}
	// the drafters' confidence cut: same output; out of [0, 1] refused naming the field
	o.DraftPMin = 0.5
	cut, err := NewEngine(target, "", o)
	if err != nil {
		t.Fatal(err)
	}
	defer cut.Close()
	if got := s.run(t, cut, true, -1); !reflect.DeepEqual(got.Tokens, ref.Tokens) {
		t.Fatalf("MTP with a confidence cut %v != plain %v", got.Tokens, ref.Tokens)
	}
	o.DraftPMin = 1.5
	if _, err := NewEngine(target, "", o); err == nil || !strings.Contains(err.Error(), "draft_p_min") {
		t.Fatalf("draft_p_min 1.5: got %v, want an error naming the field", err)
	}
	// weights read into huge pages: the same output
	o.DraftPMin = 0.5
	o.HugePageWeights = true
	huge, err := NewEngine(target, "", o)
	if err != nil {
		t.Fatal(err)
	}
	defer huge.Close()
	if got := s.run(t, huge, true, -1); !reflect.DeepEqual(got.Tokens, ref.Tokens) {
		t.Fatalf("MTP with huge-page weights %v != plain %v", got.Tokens, ref.Tokens)
	}
}

// The n-gram and no-drafter swaps keep greedy outputs; HasWork follows the queue.
func TestNgramAndNoneSwapsAndHasWork(t *testing.T) {
	s := load(t)
	e := s.engine(t)
	ref := s.run(t, e, false, -1)
	if busy, err := e.HasWork(); err != nil || busy {
		t.Fatalf("idle engine: HasWork %v %v", busy, err)
	}
	if _, err := e.SetDraftNgram(1, 3, true); err != nil {
		t.Fatal(err)
	}
	var id uint64
	var err error
	if s.prompt != "" {
		id, err = e.SubmitText(s.prompt, s.opts(true, -1))
	} else {
		id, err = e.Submit(s.ids, s.opts(true, -1))
	}
	if err != nil {
		t.Fatal(err)
	}
	if busy, err := e.HasWork(); err != nil || !busy {
		t.Fatalf("queued request: HasWork %v %v", busy, err)
	}
	var got []uint32
	for busy := true; busy; {
		evs, err := e.Step()
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs {
			if ev.RequestID == id {
				got = append(got, ev.Tokens...)
			}
		}
		if busy, err = e.HasWork(); err != nil {
			t.Fatal(err)
		}
	}
	if !reflect.DeepEqual(got, ref.Tokens) {
		t.Fatalf("n-gram drafter changed the output: %v != %v", got, ref.Tokens)
	}
	if _, err := e.SetDraftNgram(5, 2, true); err == nil {
		t.Fatal("n-gram range 5..2 accepted")
	}
	if _, err := e.SetDraftNone(true); err != nil {
		t.Fatal(err)
	}
	// the swap lands between two steps: after the next run the drafter is gone
	if again := s.run(t, e, true, -1); !reflect.DeepEqual(again.Tokens, ref.Tokens) {
		t.Fatalf("without a drafter %v != %v", again.Tokens, ref.Tokens)
	}
	if st, err := e.Stats(); err != nil || st.HasDrafter || st.DraftGeneration < 2 {
		t.Fatalf("after SetDraftNone: %+v %v", st, err)
	}
	if h, err := e.Health(); err != nil || h != (Health{}) {
		t.Fatalf("healthy engine: %+v %v", h, err)
	}
	o := s.opts(true, -1)
	o.Label = "go-test"
	if _, err := e.Generate(s.ids, s.prompt, o); err != nil {
		t.Fatal(err)
	}
	if m, err := e.Metrics(); err != nil || !strings.Contains(m, "# TYPE specmla_spec_decode_num_accepted_tokens_total counter") ||
		!strings.Contains(m, `label="go-test"`) {
		t.Fatalf("metrics: %v\n%s", err, m)
	}
}

// A live A/B of two drafters: both arms keep the plain greedy output, each arm's counters are
// in the metrics text under arm="a" / arm="b", an explicit DraftArm is honoured and a bad one
// refused.
func TestDraftABArms(t *testing.T) {
	s := load(t)
	e := s.engine(t)
	ref := s.run(t, e, false, -1)
	if _, err := e.SetDraftAB(DraftArm{Kind: DraftPath, Path: s.draft}, DraftArm{Kind: DraftNgram}, 0.5, true); err != nil {
		t.Fatal(err)
	}
	for arm := 0; arm < 2; arm++ {
		o := s.opts(true, -1)
		o.DraftArm = arm
		out, err := e.Generate(s.ids, s.prompt, o)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(out.Tokens, ref.Tokens) {
			t.Fatalf("arm %d: %v != plain %v", arm, out.Tokens, ref.Tokens)
		}
	}
	m, err := e.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`arm="a"`, `arm="b"`} {
		if !strings.Contains(m, want) {
			t.Fatalf("metrics lack %s", want)
		}
	}
	o := s.opts(true, -1)
	o.DraftArm = 2
	if _, err := e.Submit([]uint32{1, 2, 3}, o); err == nil || !strings.Contains(err.Error(), "draft_arm") {
		t.Fatalf("draft arm 2: %v", err)
	}
	if _, err := e.SetDraftAB(DraftArm{Kind: DraftMTP}, DraftArm{Kind: DraftNone}, 1.5, true); err == nil {
		t.Fatal("share 1.5 accepted")
	}
}

// The second KV tier on disk: a second engine on the same directory restores the first one's
// prompt blocks (cached prompt tokens > 0) and generates the same tokens.
func TestKVOffloadDirSurvivesTheEngine(t *testing.T) {
	s := load(t)
	dir := t.TempDir()
	o := DefaultEngineOptions()
	o.Threads, o.KVNumBlocks, o.DraftKVNumBlocks = 2, 256, 256
	o.KVOffloadDir = dir
	var outs []Output
	for i := 0; i < 2; i++ {
		e, err := NewEngine(s.target, s.draft, o)
		if err != nil {
			t.Fatal(err)
		}
		outs = append(outs, s.run(t, e, true, -1))
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if !reflect.DeepEqual(outs[0].Tokens, outs[1].Tokens) {
		t.Fatalf("restored %v != first %v", outs[1].Tokens, outs[0].Tokens)
	}
	if outs[1].Counters.CachedPromptTokens == 0 {
		t.Fatalf("second engine restored nothing: %+v", outs[1].Counters)
	}
}

// The device option reaches the engine: an unknown device and (on a machine without an NVIDIA
// driver) a CUDA device are refused at creation with the engine's message; "cpu" serves.
func TestDeviceOption(t *testing.T) {
	s := load(t)
	o := DefaultEngineOptions()
	o.Threads, o.KVNumBlocks, o.DraftKVNumBlocks = 2, 256, 256
	o.Device = "tpu:0"
	if _, err := NewEngine(s.target, s.draft, o); err == nil || !strings.Contains(err.Error(), "expected cpu, cuda or cuda:N") {
		t.Fatalf("tpu:0: %v", err)
	}
	if _, err := os.Stat("/proc/driver/nvidia"); err != nil {
		o.Device, o.KVDtype = "cuda", 2 // SPECMLA_KV_BF16
		if _, err := NewEngine(s.target, s.draft, o); err == nil || !strings.Contains(err.Error(), "CUDA") {
			t.Fatalf("cuda without a driver: %v", err)
		}
	}
	o.Device = "cpu"
	e, err := NewEngine(s.target, s.draft, o)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if out := s.run(t, e, true, -1); len(out.Tokens) == 0 {
		t.Fatal("cpu engine generated nothing")
	}
}
