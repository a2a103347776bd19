package specmla

// TestSoak: one engine driven from many goroutines through the binding (run it with -race, as
// `make test-go` does): submitters with mixed requests (greedy with and without a reasoning budget,
// seeded sampling with and without speculation, requests refused at submit), cancels from their own
// goroutines, one stepping goroutine, a reader of counters and stats, and a swapper cycling good
// and bad draft weights (directories, bytes, the MTP layer). The target KV pool is small, so
// requests are preempted and recomputed. Every submitted request must finish exactly once; greedy
// requests and unspeculated seeded sampling must give their single-request reference output (a
// fresh engine without a drafter), cancelled ones a prefix of it; per-request counters must sum to
// the engine totals and no KV block may be held at the end. Finally the engine is closed while
// goroutines are still calling into it.
//
// Bounded: 240 requests or 20 s of submitting (SPECMLA_SOAK_SECONDS / SPECMLA_SOAK_REQUESTS for
// longer runs).

import (
	"bufio"
	"errors"
	"math/rand"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

const (
	soakSubmitters = 3
	soakInFlight   = 3
	soakDraftK     = 4
	soakBlock      = 8
)

type soakKind int

const (
	soakGreedy soakKind = iota
	soakSampledPlain
	soakSampledSpec
)

var soakKindName = []string{"greedy", "sampled-plain", "sampled-spec"}

type soakRef struct {
	tokens []uint32
	finish FinishReason
}

type soakReq struct {
	submitted            bool // Submit returned this id (events may come first)
	owner                int
	kind                 soakKind
	prompt, budget, seed int
	maxTokens            uint32
	speculate            bool
	cancelOK             bool // a Cancel call succeeded
	tokens               []uint32
	finishes             int
	afterFinish          int
	finish               FinishReason
	err                  string
}

type soakState struct {
	mu                  sync.Mutex
	reqs                map[uint64]*soakReq // by id, created by Submit's caller or the first event
	submitted, finished int                 // requests Submit returned, and those of them finished
}

func soakEnvInt(k string, d int) int {
	if v, err := strconv.Atoi(os.Getenv(k)); err == nil && v > 0 {
		return v
	}
	return d
}

// soakPrompts: the text prompt and lines of SPECMLA_SOAK_PROMPTS (tokenizer models), else the
// token-id prompt and variants of it.
func soakPrompts(t *testing.T, s setup, ref *Engine) (ids [][]uint32, texts []string) {
	if s.prompt != "" {
		texts = append(texts, s.prompt)
		if f, err := os.Open(os.Getenv("SPECMLA_SOAK_PROMPTS")); err == nil {
			sc := bufio.NewScanner(f)
			for sc.Scan() && len(texts) < 3 {
				if l := strings.TrimSpace(sc.Text()); l != "" && l != s.prompt {
					texts = append(texts, l)
				}
			}
			f.Close()
		}
		for _, x := range texts {
			v, err := ref.Tokenize(x, false)
			if err != nil || len(v) == 0 {
				t.Fatalf("Tokenize(%q): %v", x, err)
			}
			ids = append(ids, v)
		}
		return ids, texts
	}
	p := s.ids
	rot := append(append([]uint32(nil), p[1:]...), p[0])
	ids = [][]uint32{p, append(append([]uint32(nil), p...), p...), rot}
	return ids, make([]string, len(ids))
}

func TestSoak(t *testing.T) {
	s := load(t)
	seconds := soakEnvInt("SPECMLA_SOAK_SECONDS", 0)
	requests := soakEnvInt("SPECMLA_SOAK_REQUESTS", 0)
	if requests == 0 {
		requests = 240
		if seconds > 0 {
			requests = 1 << 30
		}
	}
	if seconds == 0 {
		seconds = 20
	}
	budgets := []int64{-1, s.budget}
	seeds := []uint64{1234, 98765}

	// 1. references: a fresh engine without a drafter, one request at a time
	ro := DefaultEngineOptions()
	ro.Threads = 2
	refEng, err := NewEngine(s.target, "", ro)
	if err != nil {
		t.Fatalf("reference engine: %v", err)
	}
	prompts, texts := soakPrompts(t, s, refEng)
	longest := 0
	for _, p := range prompts {
		if len(p) > longest {
			longest = len(p)
		}
	}
	poolBlocks := (int(2.2*float64(longest+48+soakDraftK+1)) + soakBlock - 1) / soakBlock
	fitMax := make([]uint32, len(prompts))
	for i, p := range prompts {
		fitMax[i] = uint32(poolBlocks*soakBlock - len(p) - soakDraftK - 1)
	}
	refGreedy := make([][]soakRef, len(prompts))
	refSampled := make([][]soakRef, len(prompts))
	for pi, p := range prompts {
		for _, b := range budgets {
			o := s.opts(false, b)
			o.MaxTokens = fitMax[pi]
			out, err := refEng.Generate(p, "", o)
			if err != nil {
				t.Fatalf("greedy reference: %v", err)
			}
			refGreedy[pi] = append(refGreedy[pi], soakRef{out.Tokens, out.Finish})
		}
		for _, seed := range seeds {
			o := s.opts(false, -1)
			o.MaxTokens, o.Temperature, o.TopP, o.Seed = fitMax[pi], 0.8, 0.9, seed
			out, err := refEng.Generate(p, "", o)
			if err != nil {
				t.Fatalf("sampled reference: %v", err)
			}
			refSampled[pi] = append(refSampled[pi], soakRef{out.Tokens, out.Finish})
		}
	}
	if err := refEng.Close(); err != nil {
		t.Fatal(err)
	}

	// 2. the soak engine: small pools, a drafter
	o := DefaultEngineOptions()
	o.Threads, o.NumDraftTokens, o.BlockSize = 2, soakDraftK, soakBlock
	o.KVNumBlocks, o.DraftKVNumBlocks = uint32(poolBlocks), uint32(poolBlocks)
	e, err := NewEngine(s.target, s.draft, o)
	if err != nil {
		t.Fatalf("NewEngine: %v", err)
	}
	defer e.Close()
	badDir := t.TempDir()
	if cfg, err := os.ReadFile(filepath.Join(s.draft, "config.json")); err == nil {
		_ = os.WriteFile(filepath.Join(badDir, "config.json"), cfg, 0o600)
	}
	_ = os.WriteFile(filepath.Join(badDir, "model.safetensors"), []byte("\x10\x00\x00\x00\x00\x00\x00\x00{not safetensors"), 0o600)
	draftBytes, err := os.ReadFile(filepath.Join(s.draft, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}

	st := &soakState{reqs: map[uint64]*soakReq{}}
	var (
		fails      atomic.Int64
		submitting atomic.Int32
		swapping   atomic.Bool
		steps      atomic.Int64
		maxID      atomic.Uint64
		wg         sync.WaitGroup
		cancelWG   sync.WaitGroup
		stopReader = make(chan struct{})
		refusedKV  atomic.Int64
		cancels    atomic.Int64
		reads      atomic.Int64
		swapsOK    atomic.Int64
		swapsBad   atomic.Int64
		latencies  []time.Duration
	)
	failf := func(format string, args ...any) {
		if fails.Add(1) <= 30 {
			t.Errorf(format, args...)
		}
	}
	outstanding := make([]atomic.Int32, soakSubmitters)
	deadline := time.Now().Add(time.Duration(seconds) * time.Second)
	if d, ok := t.Deadline(); ok && d.Add(-90*time.Second).Before(deadline) { // go test -timeout
		deadline = d.Add(-90 * time.Second)
	}
	hardDeadline := deadline.Add(60 * time.Second)
	start := time.Now()
	submitting.Store(soakSubmitters)
	swapping.Store(true)

	// stepper: steps until every submitted request has finished and the swapper is done (an async
	// swap is installed by a step)
	stepDone := make(chan struct{})
	go func() {
		defer close(stepDone)
		idleOpen := 0
		for {
			st.mu.Lock()
			open := st.submitted - st.finished
			st.mu.Unlock()
			if submitting.Load() == 0 && !swapping.Load() && open == 0 {
				return
			}
			if time.Now().After(hardDeadline) {
				failf("%d requests never finished (lost or stuck)", open)
				return
			}
			t0 := time.Now()
			evs, err := e.Step()
			dt := time.Since(t0)
			if err != nil {
				failf("Step: %v", err)
				return
			}
			steps.Add(1)
			if submitting.Load() == 0 && open > 0 && len(evs) == 0 {
				// every submit has returned, so the engine has seen every request: if it holds none
				// while some never finished, they are lost
				if x, err := e.Stats(); err == nil && x.Running == 0 && x.Waiting == 0 {
					if idleOpen++; idleOpen >= 100 {
						failf("%d requests never finished and the engine holds none (lost)", open)
						return
					}
				} else {
					idleOpen = 0
				}
			}
			if open > 0 {
				latencies = append(latencies, dt)
			} else {
				time.Sleep(200 * time.Microsecond)
			}
			st.mu.Lock()
			for _, ev := range evs {
				r := st.reqs[ev.RequestID]
				if r == nil { // the submitter has not recorded this id yet
					r = &soakReq{}
					st.reqs[ev.RequestID] = r
				}
				if r.finishes > 0 {
					r.afterFinish++
				}
				r.tokens = append(r.tokens, ev.Tokens...)
				if ev.Finish != FinishNone {
					r.finishes++
					r.finish, r.err = ev.Finish, ev.Error
					if r.finishes == 1 && r.submitted {
						st.finished++
						outstanding[r.owner].Add(-1)
					}
				}
			}
			st.mu.Unlock()
		}
	}()

	// submitters
	for si := 0; si < soakSubmitters; si++ {
		wg.Add(1)
		go func(si int) {
			defer wg.Done()
			defer submitting.Add(-1)
			rng := rand.New(rand.NewSource(int64(si + 1)))
			for n := 0; n < (requests+soakSubmitters-1)/soakSubmitters && time.Now().Before(deadline); {
				if outstanding[si].Load() >= soakInFlight {
					time.Sleep(time.Millisecond)
					continue
				}
				pi := rng.Intn(len(prompts))
				roll := rng.Intn(100)
				r := &soakReq{submitted: true, owner: si, prompt: pi, speculate: true, seed: -1}
				opt := s.opts(true, -1)
				opt.MaxTokens = []uint32{1, 8, 16, 32, 48}[rng.Intn(5)]
				switch {
				case roll < 6: // too large for the pool: refused with a reason
					opt.MaxTokens = fitMax[pi] + 1 + uint32(rng.Intn(32))
					_, err := e.Submit(prompts[pi], opt)
					var se *Error
					if !errors.As(err, &se) || se.Name != "SPECMLA_ERR_KV_EXHAUSTED" || se.Msg == "" {
						failf("oversized request: %v", err)
					}
					refusedKV.Add(1)
					continue
				case roll < 60:
					r.kind = soakGreedy
					r.budget = rng.Intn(len(budgets))
					opt.ReasoningBudget = budgets[r.budget]
					r.speculate = rng.Intn(6) != 0
				case roll < 78:
					r.kind = soakSampledPlain
					r.seed = rng.Intn(len(seeds))
					opt.Temperature, opt.TopP, opt.Seed = 0.8, 0.9, seeds[r.seed]
					r.speculate = false
				default:
					r.kind = soakSampledSpec
					opt.Temperature, opt.TopP, opt.Seed = []float32{0.5, 1}[rng.Intn(2)], 0.9, rng.Uint64()
				}
				opt.Speculate = r.speculate
				r.maxTokens = opt.MaxTokens
				outstanding[si].Add(1)
				var id uint64
				var err error
				if texts[pi] != "" && r.kind == soakGreedy && rng.Intn(3) == 0 {
					id, err = e.SubmitText(texts[pi], opt)
				} else {
					id, err = e.Submit(prompts[pi], opt)
				}
				if err != nil {
					outstanding[si].Add(-1)
					failf("Submit: %v", err)
					return
				}
				n++
				st.mu.Lock()
				if early := st.reqs[id]; early != nil { // its events came first
					if early.submitted {
						failf("request id %d handed out twice", id)
					}
					r.tokens, r.finishes, r.afterFinish, r.finish, r.err = early.tokens, early.finishes, early.afterFinish, early.finish, early.err
				}
				st.reqs[id] = r
				st.submitted++
				if r.finishes > 0 {
					st.finished++
					outstanding[si].Add(-1)
				}
				st.mu.Unlock()
				for m := maxID.Load(); id > m && !maxID.CompareAndSwap(m, id); m = maxID.Load() {
				}
				if rng.Intn(100) < 12 {
					delay := time.Duration(rng.Intn(20)) * time.Millisecond
					cancelWG.Add(1)
					go func() {
						defer cancelWG.Done()
						time.Sleep(delay)
						err := e.Cancel(id)
						var se *Error
						if err != nil && (!errors.As(err, &se) || se.Status != ErrUnknownRequest) {
							failf("Cancel(%d): %v", id, err)
						}
						st.mu.Lock()
						r.cancelOK = err == nil
						st.mu.Unlock()
						cancels.Add(1)
					}()
				}
			}
		}(si)
	}

	// reader: counters of random requests, engine stats
	go func() {
		rng := rand.New(rand.NewSource(99))
		var lastSteps uint64
		for {
			select {
			case <-stopReader:
				return
			default:
			}
			if m := maxID.Load(); m > 0 {
				id := 1 + uint64(rng.Int63n(int64(m)))
				c, err := e.Counters(id)
				var se *Error
				if err == nil {
					if c.AcceptedTokens > c.DraftedTokens || len(c.AcceptedPerPosition) > MaxDraftPositions {
						failf("request %d: bad counters %+v", id, c)
					}
				} else if !errors.As(err, &se) || se.Status != ErrUnknownRequest {
					failf("Counters(%d): %v", id, err)
				}
			}
			if reads.Add(1)%16 == 0 {
				x, err := e.Stats()
				if err != nil {
					failf("Stats: %v", err)
				} else {
					if x.Steps < lastSteps || x.KVUsedBlocks > x.KVNumBlocks || x.Totals.AcceptedTokens > x.Totals.DraftedTokens {
						failf("bad stats %+v (steps before %d)", x, lastSteps)
					}
					lastSteps = x.Steps
				}
			}
			time.Sleep(300 * time.Microsecond)
		}
	}()

	// swapper: every few steps, good and bad draft weights, sync and async
	swapDone := make(chan struct{})
	go func() {
		defer close(swapDone)
		defer swapping.Store(false)
		type op struct {
			name string
			do   func() (uint64, error)
			sync bool // error expected from the call itself
			good int  // 1 must apply, 0 must fail, 2 either (MTP: only targets with an MTP layer)
		}
		ops := []op{
			{"draft2 async", func() (uint64, error) { return e.SetDraftWeights(s.draft2, false) }, false, 1},
			{"nonexistent sync", func() (uint64, error) { return e.SetDraftWeights("/nonexistent/specmla/draft", true) }, true, 0},
			{"garbage bytes sync", func() (uint64, error) { return e.SetDraftWeightsBytes([]byte("not safetensors"), true) }, true, 0},
			{"draft sync", func() (uint64, error) { return e.SetDraftWeights(s.draft, true) }, false, 1},
			{"bad weights dir async", func() (uint64, error) { return e.SetDraftWeights(badDir, false) }, false, 0},
			{"draft bytes async", func() (uint64, error) { return e.SetDraftWeightsBytes(draftBytes, false) }, false, 1},
			{"mtp async", func() (uint64, error) { return e.SetDraftMTP(false) }, false, 2},
			{"draft async", func() (uint64, error) { return e.SetDraftWeights(s.draft, false) }, false, 1},
		}
		var lastGen uint64
		next := int64(3)
		for i := 0; submitting.Load() > 0; {
			if steps.Load() < next {
				time.Sleep(500 * time.Microsecond)
				continue
			}
			o := ops[i%len(ops)]
			i++
			ticket, err := o.do()
			switch {
			case o.sync:
				var se *Error
				if !errors.As(err, &se) || se.Msg == "" {
					failf("swap %s: want an error with a reason, got %v", o.name, err)
				}
				swapsBad.Add(1)
			case err != nil:
				failf("swap %s: %v", o.name, err)
			default:
				state, gen, why := SwapPending, uint64(0), ""
				for t0 := time.Now(); state == SwapPending && time.Since(t0) < time.Minute; {
					if state, gen, why, err = e.SwapStatus(ticket); err != nil {
						failf("SwapStatus: %v", err)
					}
					if state == SwapPending {
						time.Sleep(time.Millisecond)
					}
				}
				switch {
				case state == SwapApplied && o.good != 0:
					if gen <= lastGen {
						failf("swap %s: generation %d after %d", o.name, gen, lastGen)
					}
					lastGen = gen
					swapsOK.Add(1)
				case state == SwapFailed && o.good != 1 && why != "":
					swapsBad.Add(1)
				default:
					failf("swap %s: state %v (reason %q), want good=%d", o.name, state, why, o.good)
				}
			}
			next = steps.Load() + 2 + int64(i%7)
		}
	}()

	wg.Wait()
	cancelWG.Wait()
	<-swapDone
	<-stepDone
	close(stopReader)
	elapsed := time.Since(start)

	// 3. checks
	stats, err := e.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if stats.Running != 0 || stats.Waiting != 0 || stats.KVUsedBlocks != 0 {
		failf("after draining: running %d waiting %d KV blocks held %d", stats.Running, stats.Waiting, stats.KVUsedBlocks)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if maxID.Load() != uint64(st.submitted) || len(st.reqs) != st.submitted {
		failf("highest id %d, %d requests submitted, events for %d ids", maxID.Load(), st.submitted, len(st.reqs))
	}
	var sum Counters
	byFinish := map[FinishReason]int{}
	compared := 0
	for id, r := range st.reqs {
		if !r.submitted {
			failf("events for request %d that no Submit returned", id)
			continue
		}
		if r.finishes != 1 || r.afterFinish != 0 {
			failf("request %d (%s): %d finish events, %d events after the finish", id, soakKindName[r.kind], r.finishes, r.afterFinish)
			continue
		}
		byFinish[r.finish]++
		if r.finish == FinishError {
			failf("request %d failed in the engine: %s", id, r.err)
			continue
		}
		if r.finish == FinishCancelled && !r.cancelOK {
			failf("request %d cancelled but no Cancel call succeeded", id)
		}
		if len(r.tokens) > int(r.maxTokens) {
			failf("request %d: %d tokens > max_tokens %d", id, len(r.tokens), r.maxTokens)
		}
		c, err := e.Counters(id)
		if err != nil {
			failf("Counters(%d) after finishing: %v", id, err)
			continue
		}
		if c.ReasoningTokens+c.AnswerTokens+c.ForcedTokens != uint64(len(r.tokens)) || (!r.speculate && c.DraftedTokens != 0) {
			failf("request %d: counters %+v for %d tokens (speculate %v)", id, c, len(r.tokens), r.speculate)
		}
		sum.PromptTokens += c.PromptTokens
		sum.DraftedTokens += c.DraftedTokens
		sum.AcceptedTokens += c.AcceptedTokens
		sum.Preemptions += c.Preemptions
		var ref soakRef
		switch r.kind {
		case soakGreedy:
			ref = refGreedy[r.prompt][r.budget]
		case soakSampledPlain:
			ref = refSampled[r.prompt][r.seed]
		default:
			continue
		}
		want, wantFinish := ref.tokens, ref.finish
		if !(ref.finish == FinishStop && len(ref.tokens) <= int(r.maxTokens)) {
			want, wantFinish = ref.tokens[:r.maxTokens], FinishLength
		}
		ok := len(r.tokens) <= len(want)
		for i := 0; ok && i < len(r.tokens); i++ {
			ok = r.tokens[i] == want[i]
		}
		if r.finish != FinishCancelled {
			ok = ok && len(r.tokens) == len(want) && r.finish == wantFinish
		}
		compared++
		if !ok {
			failf("request %d (%s, prompt %d, max_tokens %d, speculate %v): %v %s, reference %v %s",
				id, soakKindName[r.kind], r.prompt, r.maxTokens, r.speculate, r.tokens, r.finish, want, wantFinish)
		}
	}
	tot := stats.Totals
	if sum.PromptTokens != tot.PromptTokens || sum.DraftedTokens != tot.DraftedTokens ||
		sum.AcceptedTokens != tot.AcceptedTokens || sum.Preemptions != tot.Preemptions {
		failf("per-request counters %+v do not sum to the engine totals %+v", sum, tot)
	}
	if tot.Preemptions == 0 || byFinish[FinishCancelled] == 0 || refusedKV.Load() == 0 || swapsOK.Load() < 2 || swapsBad.Load() < 2 || compared == 0 {
		failf("workload too weak: preemptions %d, cancelled %d, refused %d, swaps %d/%d, compared %d",
			tot.Preemptions, byFinish[FinishCancelled], refusedKV.Load(), swapsOK.Load(), swapsBad.Load(), compared)
	}
	sort.Slice(latencies, func(i, j int) bool { return latencies[i] < latencies[j] })
	var p50, p99 time.Duration
	if n := len(latencies); n > 0 {
		p50, p99 = latencies[n/2], latencies[n*99/100]
	}
	t.Logf("soak: %d requests in %v (%d compared with references; finished %v; %d refused; %d cancels), %d steps "+
		"(p50 %v p99 %v), %d preemptions, swaps %d applied %d refused (generation %d), %d counter/stats reads",
		len(st.reqs), elapsed.Round(time.Millisecond), compared, byFinish, refusedKV.Load(), cancels.Load(), stats.Steps,
		p50.Round(10*time.Microsecond), p99.Round(10*time.Microsecond), tot.Preemptions, swapsOK.Load(), swapsBad.Load(),
		stats.DraftGeneration, reads.Load())

	// 4. Close while goroutines still call into the engine: nil or INVALID_HANDLE, nothing else
	var closers sync.WaitGroup
	for g := 0; g < 4; g++ {
		closers.Add(1)
		go func(g int) {
			defer closers.Done()
			for i := 0; i < 200; i++ {
				var err error
				switch (g + i) % 4 {
				case 0:
					_, err = e.Step()
				case 1:
					_, err = e.Submit(prompts[0], s.opts(true, -1))
				case 2:
					_, err = e.Counters(1)
				default:
					_, err = e.Stats()
				}
				var se *Error
				if err != nil && (!errors.As(err, &se) || (se.Status != ErrInvalidHandle && se.Status != ErrUnknownRequest)) {
					failf("call during Close: %v", err)
				}
			}
		}(g)
	}
	time.Sleep(2 * time.Millisecond)
	if err := e.Close(); err != nil {
		failf("Close: %v", err)
	}
	closers.Wait()
}
