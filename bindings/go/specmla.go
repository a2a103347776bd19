// Package specmla is a thin cgo binding over the specmla C ABI (include/specmla.h,
// libspecmla.so): an embeddable inference engine for DeepSeek-family MLA models with
// speculative decoding and a reasoning budget.
//
// Build the library first (`make lib` at the repository root). Every failing call returns a
// *Error carrying the C status and the library's message. Engine methods may be called from any
// goroutine (see docs/C_ABI.md): Step calls are serialised by the library, Stats waits for a
// running step, everything else never waits. Close is idempotent.
package specmla

/*
#cgo CFLAGS: -I${SRCDIR}/../../include
#cgo LDFLAGS: -L${SRCDIR}/../../target/release -lspecmla -Wl,-rpath,${SRCDIR}/../../target/release
#include <stdlib.h>
#include "specmla.h"
*/
import "C"

import (
	"fmt"
	"runtime"
	"sync"
	"unsafe"
)

// Error is a failed call: the C status code and the library's message.
type Error struct {
	Status int
	Name   string
	Msg    string
}

func (e *Error) Error() string { return fmt.Sprintf("%s: %s", e.Name, e.Msg) }

// Status codes (a subset tests and callers commonly check).
const (
	StatusOK           = int(C.SPECMLA_OK)
	ErrInvalidArgument = int(C.SPECMLA_ERR_INVALID_ARGUMENT)
	ErrInvalidHandle   = int(C.SPECMLA_ERR_INVALID_HANDLE)
	ErrBufferTooSmall  = int(C.SPECMLA_ERR_BUFFER_TOO_SMALL)
	ErrInvalidUTF8     = int(C.SPECMLA_ERR_INVALID_UTF8)
	ErrUnknownRequest  = int(C.SPECMLA_ERR_UNKNOWN_REQUEST)
	ErrInvalidRequest  = int(C.SPECMLA_ERR_INVALID_REQUEST)
	ErrIO              = int(C.SPECMLA_ERR_IO)
	ErrDraft           = int(C.SPECMLA_ERR_DRAFT)
	MaxDraftPositions  = int(C.SPECMLA_MAX_DRAFT_POSITIONS)
)

// call runs one C call with the OS thread locked, so the thread-local last error read on
// failure belongs to that call.
func call(f func() C.enum_specmla_status) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	st := f()
	if st == C.SPECMLA_OK {
		return nil
	}
	return &Error{Status: int(st), Name: C.GoString(C.specmla_status_name(C.int32_t(st))), Msg: C.GoString(C.specmla_last_error())}
}

// Version is the library version string.
func Version() string { return C.GoString(C.specmla_version()) }

// EngineOptions configure NewEngine (start from DefaultEngineOptions).
type EngineOptions struct {
	NumDraftTokens   uint32 // 1..16
	Adaptive         bool
	KVNumBlocks      uint32
	DraftKVNumBlocks uint32
	BlockSize        uint32
	Threads          uint32 // 0 = all cores
	MTP              bool   // with no draft directory: draft with the target's MTP layer
	ISA              uint32 // kernel instruction set: 0 auto (fastest: avx512bf16 where present), 1 portable, 2 avx2, 3 avx512, 4 amx (opt-in), 5 avx512bf16, 6 exact (best f32-exact level)
	KVWindowBlocks   uint32 // DeepSeek-V4 sliding-window pool blocks (0 = default; ignored otherwise)
	KVOffloadDir     string // second KV tier: a directory whose file keeps prompt blocks across engines
	KVOffloadMem     uint64 // second KV tier: host-memory bytes for evicted prefix blocks (0 = none)
	KVDtype          uint32 // target KV cache dtype: SPECMLA_KV_* (0 auto = f32)
	Device           string // the target's forward: "" / "cpu", "cuda" or "cuda:N" (needs KVDtype bf16)
	DraftPMin        float32 // drafters' confidence cut in [0, 1]: stop drafting after a token below it (0 = off)
	HugePageWeights  bool    // read this engine's weight files into huge pages instead of mapping them (faster memory-bound decode, slower load, all weights resident)
}

// DefaultEngineOptions mirrors specmla_engine_default_params.
func DefaultEngineOptions() EngineOptions {
	p := C.specmla_engine_default_params()
	return EngineOptions{
		NumDraftTokens: uint32(p.num_draft_tokens), Adaptive: bool(p.adaptive),
		KVNumBlocks: uint32(p.kv_num_blocks), DraftKVNumBlocks: uint32(p.draft_kv_num_blocks),
		BlockSize: uint32(p.block_size), Threads: uint32(p.threads), MTP: bool(p.mtp),
		ISA: uint32(p.isa), KVWindowBlocks: uint32(p.kv_window_blocks), KVDtype: uint32(p.kv_dtype),
		DraftPMin: float32(p.draft_p_min), HugePageWeights: bool(p.huge_page_weights),
	}
}

// Engine owns one engine handle.
type Engine struct {
	mu sync.Mutex
	h  *C.specmla_engine
}

// NewEngine loads target (a model directory) and, if draft is not "", a draft model directory.
func NewEngine(target, draft string, o EngineOptions) (*Engine, error) {
	p := C.specmla_engine_default_params()
	p.num_draft_tokens = C.uint32_t(o.NumDraftTokens)
	p.adaptive = C.bool(o.Adaptive)
	p.kv_num_blocks = C.uint32_t(o.KVNumBlocks)
	p.draft_kv_num_blocks = C.uint32_t(o.DraftKVNumBlocks)
	p.block_size = C.uint32_t(o.BlockSize)
	p.threads = C.uint32_t(o.Threads)
	p.mtp = C.bool(o.MTP)
	p.isa = C.uint32_t(o.ISA)
	p.kv_window_blocks = C.uint32_t(o.KVWindowBlocks)
	p.kv_offload_mem_bytes = C.uint64_t(o.KVOffloadMem)
	p.kv_dtype = C.uint32_t(o.KVDtype)
	p.draft_p_min = C.float(o.DraftPMin)
	p.huge_page_weights = C.bool(o.HugePageWeights)
	if o.Device != "" {
		cdev := C.CString(o.Device)
		defer C.free(unsafe.Pointer(cdev))
		p.device = cdev
	}
	if o.KVOffloadDir != "" {
		cdir := C.CString(o.KVOffloadDir)
		defer C.free(unsafe.Pointer(cdir))
		p.kv_offload_dir = cdir
	}
	ct := C.CString(target)
	defer C.free(unsafe.Pointer(ct))
	var cd *C.char
	if draft != "" {
		cd = C.CString(draft)
		defer C.free(unsafe.Pointer(cd))
	}
	e := &Engine{}
	if err := call(func() C.enum_specmla_status { return C.specmla_engine_create(ct, cd, &p, &e.h) }); err != nil {
		return nil, err
	}
	runtime.SetFinalizer(e, func(e *Engine) { _ = e.Close() })
	return e, nil
}

// Close frees the engine; calling it again is a no-op.
func (e *Engine) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.h == nil {
		return nil
	}
	h := e.h
	e.h = nil
	return call(func() C.enum_specmla_status { return C.specmla_engine_free(h) })
}

func (e *Engine) handle() *C.specmla_engine {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.h // nil after Close: the library reports SPECMLA_ERR_INVALID_HANDLE
}
