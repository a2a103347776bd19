package specmla

/*
#include <stdlib.h>
#include "specmla.h"
*/
import "C"

import "unsafe"

// RequestOptions of one request (start from DefaultRequestOptions).
type RequestOptions struct {
	MaxTokens       uint32
	Temperature     float32
	TopK            uint32
	TopP            float32
	Seed            uint64
	IgnoreEOS       bool
	Speculate       bool
	ReasoningBudget int64 // -1 = unlimited
	StopTokenIDs    []uint32
	StopStrings     []string
	ThinkStart      []uint32 // nil = the tokenizer's <think>
	ThinkEnd        []uint32 // nil = the tokenizer's </think>
	Label           string   // workload label for the metrics ("" = none; <= 64 bytes)
	DraftArm        int      // under an A/B drafter: 0 = arm A, 1 = arm B, -1 = by its share
}

// DefaultRequestOptions: greedy, 256 tokens, no budget, speculation on.
func DefaultRequestOptions() RequestOptions {
	return RequestOptions{MaxTokens: 256, TopP: 1, Speculate: true, ReasoningBudget: -1, DraftArm: -1}
}

// cArena holds C copies of Go data for one call (cgo forbids passing Go pointers inside structs).
type cArena []unsafe.Pointer

func (a *cArena) ids(v []uint32) *C.uint32_t {
	if len(v) == 0 {
		return nil
	}
	p := C.malloc(C.size_t(len(v)) * 4)
	copy(unsafe.Slice((*uint32)(p), len(v)), v)
	*a = append(*a, p)
	return (*C.uint32_t)(p)
}

func (a *cArena) str(s string) *C.char {
	p := C.CString(s)
	*a = append(*a, unsafe.Pointer(p))
	return p
}

func (a *cArena) free() {
	for _, p := range *a {
		C.free(p)
	}
}

func (a *cArena) params(o RequestOptions) C.specmla_request_params {
	p := C.specmla_request_default_params()
	p.max_tokens = C.uint32_t(o.MaxTokens)
	p.temperature = C.float(o.Temperature)
	p.top_k = C.uint32_t(o.TopK)
	p.top_p = C.float(o.TopP)
	p.seed = C.uint64_t(o.Seed)
	p.ignore_eos = C.bool(o.IgnoreEOS)
	p.speculate = C.bool(o.Speculate)
	p.reasoning_budget = C.int64_t(o.ReasoningBudget)
	p.stop_token_ids = a.ids(o.StopTokenIDs)
	p.n_stop_token_ids = C.size_t(len(o.StopTokenIDs))
	if n := len(o.StopStrings); n > 0 {
		arr := C.malloc(C.size_t(n) * C.size_t(unsafe.Sizeof(uintptr(0))))
		*a = append(*a, arr)
		view := unsafe.Slice((**C.char)(arr), n)
		for i, s := range o.StopStrings {
			view[i] = a.str(s)
		}
		p.stop_strings = (**C.char)(arr)
		p.n_stop_strings = C.size_t(n)
	}
	if o.ThinkStart != nil {
		p.think_start = a.ids(o.ThinkStart)
		p.n_think_start = C.size_t(len(o.ThinkStart))
	}
	if o.ThinkEnd != nil {
		p.think_end = a.ids(o.ThinkEnd)
		p.n_think_end = C.size_t(len(o.ThinkEnd))
	}
	if o.Label != "" {
		p.label = a.str(o.Label)
	}
	p.draft_arm = C.int32_t(o.DraftArm)
	return p
}

// Submit queues a request with a token-id prompt and returns its id.
func (e *Engine) Submit(promptIDs []uint32, o RequestOptions) (uint64, error) {
	var a cArena
	defer a.free()
	p := a.params(o)
	ids := a.ids(promptIDs)
	var id C.uint64_t
	h := e.handle()
	err := call(func() C.enum_specmla_status {
		return C.specmla_engine_submit(h, ids, C.size_t(len(promptIDs)), nil, &p, &id)
	})
	return uint64(id), err
}

// SubmitText queues a request with a UTF-8 text prompt (needs a tokenizer).
func (e *Engine) SubmitText(prompt string, o RequestOptions) (uint64, error) {
	var a cArena
	defer a.free()
	p := a.params(o)
	text := a.str(prompt)
	var id C.uint64_t
	h := e.handle()
	err := call(func() C.enum_specmla_status { return C.specmla_engine_submit(h, nil, 0, text, &p, &id) })
	return uint64(id), err
}
