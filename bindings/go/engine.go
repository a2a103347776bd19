package specmla

/*
#include <stdlib.h>
#include "specmla.h"
*/
import "C"

import (
	"errors"
	"unsafe"
)

// FinishReason of a request ("" while it runs).
type FinishReason string

const (
	FinishNone       FinishReason = ""
	FinishStop       FinishReason = "stop"
	FinishStopString FinishReason = "stop_string"
	FinishLength     FinishReason = "length"
	FinishCancelled  FinishReason = "cancelled"
	FinishError      FinishReason = "error"
)

func finishOf(f C.enum_specmla_finish_reason) FinishReason {
	switch f {
	case C.SPECMLA_FINISH_STOP:
		return FinishStop
	case C.SPECMLA_FINISH_STOP_STRING:
		return FinishStopString
	case C.SPECMLA_FINISH_LENGTH:
		return FinishLength
	case C.SPECMLA_FINISH_CANCELLED:
		return FinishCancelled
	case C.SPECMLA_FINISH_ERROR:
		return FinishError
	}
	return FinishNone
}

// Event is what one step produced for one request.
type Event struct {
	RequestID uint64
	Tokens    []uint32
	Text      string
	Finish    FinishReason
	Error     string
}

// Step runs one engine step and returns its events.
func (e *Engine) Step() ([]Event, error) {
	var r *C.specmla_step_result
	h := e.handle()
	if err := call(func() C.enum_specmla_status { return C.specmla_engine_step(h, &r) }); err != nil {
		return nil, err
	}
	defer C.specmla_step_result_free(r)
	evs := unsafe.Slice(r.events, int(r.n_events))
	out := make([]Event, 0, len(evs))
	for _, ev := range evs {
		o := Event{RequestID: uint64(ev.request_id), Finish: finishOf(ev.finish_reason)}
		if ev.n_tokens > 0 {
			o.Tokens = append([]uint32(nil), unsafe.Slice((*uint32)(unsafe.Pointer(ev.tokens)), int(ev.n_tokens))...)
		}
		o.Text = C.GoStringN(ev.text, C.int(ev.text_len))
		if ev.error != nil {
			o.Error = C.GoString(ev.error)
		}
		out = append(out, o)
	}
	return out, nil
}

// Output is a finished request.
type Output struct {
	RequestID uint64
	Tokens    []uint32
	Text      string
	Finish    FinishReason
	Counters  Counters
}

// Generate submits one request (ids when text is "") and steps until it finishes. Events of
// other requests are dropped: use it when this goroutine owns the engine's stepping.
func (e *Engine) Generate(ids []uint32, text string, o RequestOptions) (Output, error) {
	var id uint64
	var err error
	if text != "" {
		id, err = e.SubmitText(text, o)
	} else {
		id, err = e.Submit(ids, o)
	}
	if err != nil {
		return Output{}, err
	}
	out := Output{RequestID: id}
	for out.Finish == FinishNone {
		evs, err := e.Step()
		if err != nil {
			return out, err
		}
		for _, ev := range evs {
			if ev.RequestID != id {
				continue
			}
			out.Tokens = append(out.Tokens, ev.Tokens...)
			out.Text += ev.Text
			if ev.Finish == FinishError {
				return out, errors.New("request failed: " + ev.Error)
			}
			out.Finish = ev.Finish
		}
	}
	out.Counters, err = e.Counters(id)
	return out, err
}

// Cancel a queued or running request.
func (e *Engine) Cancel(id uint64) error {
	h := e.handle()
	return call(func() C.enum_specmla_status { return C.specmla_engine_cancel(h, C.uint64_t(id)) })
}

// SwapState of a draft swap ticket.
type SwapState int

const (
	SwapPending SwapState = SwapState(C.SPECMLA_SWAP_PENDING)
	SwapApplied SwapState = SwapState(C.SPECMLA_SWAP_APPLIED)
	SwapFailed  SwapState = SwapState(C.SPECMLA_SWAP_FAILED)
	SwapUnknown SwapState = SwapState(C.SPECMLA_SWAP_UNKNOWN)
)

func (e *Engine) swap(src *C.specmla_draft_source, wait bool) (uint64, error) {
	var t C.uint64_t
	h := e.handle()
	err := call(func() C.enum_specmla_status { return C.specmla_engine_set_draft_weights(h, src, C.bool(wait), &t) })
	return uint64(t), err
}

// SetDraftWeights swaps in a draft model directory or a .safetensors file for the current
// draft architecture. wait=true validates here and returns the error of bad weights; wait=false
// returns at once (poll SwapStatus). The swap lands between two steps.
func (e *Engine) SetDraftWeights(path string, wait bool) (uint64, error) {
	cp := C.CString(path)
	defer C.free(unsafe.Pointer(cp))
	src := C.specmla_draft_source_default()
	src.kind = C.SPECMLA_DRAFT_PATH
	src.path = cp
	return e.swap(&src, wait)
}

// SetDraftWeightsBytes swaps in safetensors bytes for the current draft architecture.
func (e *Engine) SetDraftWeightsBytes(b []byte, wait bool) (uint64, error) {
	src := C.specmla_draft_source_default()
	src.kind = C.SPECMLA_DRAFT_BYTES
	if len(b) > 0 {
		p := C.CBytes(b)
		defer C.free(p)
		src.bytes = (*C.uint8_t)(p)
	}
	src.n_bytes = C.size_t(len(b))
	return e.swap(&src, wait)
}

// SetDraftMTP swaps in the target's own multi-token-prediction layer as the drafter.
func (e *Engine) SetDraftMTP(wait bool) (uint64, error) {
	src := C.specmla_draft_source_default()
	src.kind = C.SPECMLA_DRAFT_MTP
	return e.swap(&src, wait)
}

// SetDraftNone removes the drafter (plain decoding from the next step on).
func (e *Engine) SetDraftNone(wait bool) (uint64, error) {
	src := C.specmla_draft_source_default()
	src.kind = C.SPECMLA_DRAFT_NONE
	return e.swap(&src, wait)
}

// SetDraftNgram swaps in the n-gram (prompt lookup) drafter matching minN..maxN tokens.
func (e *Engine) SetDraftNgram(minN, maxN uint32, wait bool) (uint64, error) {
	src := C.specmla_draft_source_default()
	src.kind = C.SPECMLA_DRAFT_NGRAM
	src.ngram_min_n = C.uint32_t(minN)
	src.ngram_max_n = C.uint32_t(maxN)
	return e.swap(&src, wait)
}

// DraftArm is one arm of a live A/B (SetDraftAB): a draft model directory (Path), the target's
// MTP layer, the n-gram drafter, or none (a no-speculation control arm).
type DraftArm struct {
	Kind     DraftKind
	Path     string // DraftPath
	NgramMin uint32 // DraftNgram (0 = 1)
	NgramMax uint32 // DraftNgram (0 = 3)
}

// DraftKind of an A/B arm.
type DraftKind int

const (
	DraftNone  DraftKind = DraftKind(C.SPECMLA_DRAFT_NONE)
	DraftNgram DraftKind = DraftKind(C.SPECMLA_DRAFT_NGRAM)
	DraftPath  DraftKind = DraftKind(C.SPECMLA_DRAFT_PATH)
	DraftMTP   DraftKind = DraftKind(C.SPECMLA_DRAFT_MTP)
)

func (a *cArena) arm(d DraftArm) *C.specmla_draft_source {
	p := (*C.specmla_draft_source)(C.malloc(C.size_t(unsafe.Sizeof(C.specmla_draft_source{}))))
	*a = append(*a, unsafe.Pointer(p))
	*p = C.specmla_draft_source_default()
	p.kind = C.uint32_t(d.Kind)
	if d.Path != "" {
		p.path = a.str(d.Path)
	}
	if d.NgramMin > 0 {
		p.ngram_min_n = C.uint32_t(d.NgramMin)
	}
	if d.NgramMax > 0 {
		p.ngram_max_n = C.uint32_t(d.NgramMax)
	}
	return p
}

// SetDraftAB swaps in a live A/B of two drafters, each with its own draft KV: a request goes to
// the arm its RequestOptions.DraftArm names, else to B with probability shareB (a fixed hash of
// its id). Per-arm counters are in the metrics text (label arm="a" / "b").
func (e *Engine) SetDraftAB(a, b DraftArm, shareB float64, wait bool) (uint64, error) {
	var ar cArena
	defer ar.free()
	src := C.specmla_draft_source_default()
	src.kind = C.SPECMLA_DRAFT_AB
	src.ab_a = ar.arm(a)
	src.ab_b = ar.arm(b)
	src.ab_ratio_b = C.double(shareB)
	return e.swap(&src, wait)
}

// HasWork reports whether any request is queued or running.
func (e *Engine) HasWork() (bool, error) {
	var b C.bool
	h := e.handle()
	err := call(func() C.enum_specmla_status { return C.specmla_engine_has_work(h, &b) })
	return bool(b), err
}

// SwapStatus of a ticket; reason says why it failed.
func (e *Engine) SwapStatus(ticket uint64) (state SwapState, generation uint64, reason string, err error) {
	var st C.enum_specmla_swap_state
	var gen C.uint64_t
	h := e.handle()
	err = call(func() C.enum_specmla_status {
		s := C.specmla_engine_swap_status(h, C.uint64_t(ticket), &st, &gen)
		if s == C.SPECMLA_OK && st == C.SPECMLA_SWAP_FAILED {
			reason = C.GoString(C.specmla_last_error()) // same locked thread
		}
		return s
	})
	return SwapState(st), uint64(gen), reason, err
}
