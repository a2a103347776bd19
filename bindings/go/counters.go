package specmla

/*
#include <stdlib.h>
#include "specmla.h"
*/
import "C"

import "unsafe"

// Counters of one request (or summed over the engine).
type Counters struct {
	PromptTokens, CachedPromptTokens, ReasoningTokens, AnswerTokens uint64
	DraftedTokens, AcceptedTokens, RecoveredTokens, BonusTokens     uint64
	ForcedEndOfThink, ForcedTokens, DraftSteps, DraftTokensSaved    uint64
	Preemptions                                                     uint64
	MeanAcceptanceLength                                            float64
	AcceptedPerPosition, DraftedPerPosition                         []uint64
}

func countersOf(c *C.specmla_counters) Counters {
	n := int(c.n_positions)
	acc := unsafe.Slice((*uint64)(unsafe.Pointer(&c.accepted_per_position[0])), n)
	dr := unsafe.Slice((*uint64)(unsafe.Pointer(&c.drafted_per_position[0])), n)
	return Counters{
		PromptTokens: uint64(c.prompt_tokens), CachedPromptTokens: uint64(c.cached_prompt_tokens),
		ReasoningTokens: uint64(c.reasoning_tokens), AnswerTokens: uint64(c.answer_tokens),
		DraftedTokens: uint64(c.drafted_tokens), AcceptedTokens: uint64(c.accepted_tokens),
		RecoveredTokens: uint64(c.recovered_tokens), BonusTokens: uint64(c.bonus_tokens),
		ForcedEndOfThink: uint64(c.forced_end_of_think), ForcedTokens: uint64(c.forced_tokens),
		DraftSteps: uint64(c.draft_steps), DraftTokensSaved: uint64(c.draft_tokens_saved),
		Preemptions: uint64(c.preemptions), MeanAcceptanceLength: float64(c.mean_acceptance_length),
		AcceptedPerPosition: append([]uint64(nil), acc...), DraftedPerPosition: append([]uint64(nil), dr...),
	}
}

// Counters of a request (queued, running or finished).
func (e *Engine) Counters(id uint64) (Counters, error) {
	var c C.specmla_counters
	h := e.handle()
	if err := call(func() C.enum_specmla_status { return C.specmla_engine_request_counters(h, C.uint64_t(id), &c) }); err != nil {
		return Counters{}, err
	}
	return countersOf(&c), nil
}

// Stats are engine-wide statistics.
type Stats struct {
	Steps, Running, Waiting   uint64
	Totals                    Counters
	DraftGeneration           uint64
	HasDrafter                bool
	KVNumBlocks, KVUsedBlocks uint64
}

// Stats waits for a running step, then reports.
func (e *Engine) Stats() (Stats, error) {
	var s C.specmla_stats
	h := e.handle()
	if err := call(func() C.enum_specmla_status { return C.specmla_engine_stats(h, &s) }); err != nil {
		return Stats{}, err
	}
	return Stats{
		Steps: uint64(s.steps), Running: uint64(s.running), Waiting: uint64(s.waiting),
		Totals: countersOf(&s.totals), DraftGeneration: uint64(s.draft_generation), HasDrafter: bool(s.has_drafter),
		KVNumBlocks: uint64(s.kv_num_blocks), KVUsedBlocks: uint64(s.kv_used_blocks),
	}, nil
}

// Health holds the failure-containment counters.
type Health struct {
	PanicsContained   uint64 // panics inside a step, each failing at most the request causing it
	KVBlocksReclaimed uint64 // KV block references given back after them
	DrafterPanics     uint64 // drafter panics, each switching drafting off (outputs unchanged)
	DrafterDisabled   bool   // drafting is off until a swap installs a new drafter
}

// Health waits for a running step, then reports the failure-containment counters.
func (e *Engine) Health() (Health, error) {
	var s C.specmla_health
	s.struct_size = C.size_t(unsafe.Sizeof(s))
	h := e.handle()
	if err := call(func() C.enum_specmla_status { return C.specmla_engine_health(h, &s) }); err != nil {
		return Health{}, err
	}
	return Health{
		PanicsContained: uint64(s.panics_contained), KVBlocksReclaimed: uint64(s.kv_blocks_reclaimed),
		DrafterPanics: uint64(s.drafter_panics), DrafterDisabled: bool(s.drafter_disabled),
	}, nil
}

// Metrics waits for a running step, then returns the engine's metrics in the Prometheus text
// format (counters per workload label and draft generation, latency histograms, KV blocks,
// swaps).
func (e *Engine) Metrics() (string, error) {
	h := e.handle()
	var n C.size_t
	err := call(func() C.enum_specmla_status { return C.specmla_engine_metrics(h, nil, 0, &n) })
	if err == nil {
		return "", nil
	}
	if e2, ok := err.(*Error); !ok || e2.Status != ErrBufferTooSmall {
		return "", err
	}
	for {
		size := n
		buf := (*C.char)(C.malloc(size))
		err = call(func() C.enum_specmla_status { return C.specmla_engine_metrics(h, buf, size, &n) })
		if err == nil {
			s := C.GoString(buf)
			C.free(unsafe.Pointer(buf))
			return s, nil
		}
		C.free(unsafe.Pointer(buf))
		// the text grew between the two calls (another thread stepped): try again
		if e2, ok := err.(*Error); !ok || e2.Status != ErrBufferTooSmall {
			return "", err
		}
	}
}

// Tokenize text with the engine's tokenizer.
func (e *Engine) Tokenize(text string, addSpecial bool) ([]uint32, error) {
	ct := C.CString(text)
	defer C.free(unsafe.Pointer(ct))
	h := e.handle()
	var n C.size_t
	err := call(func() C.enum_specmla_status { return C.specmla_tokenize(h, ct, C.bool(addSpecial), nil, 0, &n) })
	if err != nil {
		if e2, ok := err.(*Error); !ok || e2.Status != ErrBufferTooSmall {
			return nil, err
		}
	}
	if n == 0 {
		return []uint32{}, nil
	}
	buf := (*C.uint32_t)(C.malloc(n * 4))
	defer C.free(unsafe.Pointer(buf))
	if err := call(func() C.enum_specmla_status { return C.specmla_tokenize(h, ct, C.bool(addSpecial), buf, n, &n) }); err != nil {
		return nil, err
	}
	return append([]uint32(nil), unsafe.Slice((*uint32)(unsafe.Pointer(buf)), int(n))...), nil
}

// Detokenize ids into text.
func (e *Engine) Detokenize(ids []uint32, skipSpecial bool) (string, error) {
	var cids *C.uint32_t
	if len(ids) > 0 {
		cids = (*C.uint32_t)(C.malloc(C.size_t(len(ids)) * 4))
		defer C.free(unsafe.Pointer(cids))
		copy(unsafe.Slice((*uint32)(unsafe.Pointer(cids)), len(ids)), ids)
	}
	h := e.handle()
	var n C.size_t
	err := call(func() C.enum_specmla_status {
		return C.specmla_detokenize(h, cids, C.size_t(len(ids)), C.bool(skipSpecial), nil, 0, &n)
	})
	if err != nil {
		if e2, ok := err.(*Error); !ok || e2.Status != ErrBufferTooSmall {
			return "", err
		}
	}
	buf := (*C.char)(C.malloc(n + 1))
	defer C.free(unsafe.Pointer(buf))
	if err := call(func() C.enum_specmla_status {
		return C.specmla_detokenize(h, cids, C.size_t(len(ids)), C.bool(skipSpecial), buf, n+1, &n)
	}); err != nil {
		return "", err
	}
	return C.GoStringN(buf, C.int(n)), nil
}
