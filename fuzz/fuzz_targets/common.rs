//! Shared by every fuzz target: the panic policy. libfuzzer-sys aborts on every panic, also one
//! the library catches on purpose (the C ABI's guard, the tokenizer's containment of the
//! `tokenizers` crate), which is not a bug. So the abort-everything hook is replaced by one that
//! only prints, and a panic that escapes the library's entry point — the bug — aborts the
//! process in libfuzzer-sys's own wrapper (`catch_unwind` + `abort`), which libFuzzer reports as
//! a crash and saves the input.

/// Install the print-only panic hook (call from `fuzz_target!`'s `init`).
pub fn init() {
    std::panic::set_hook(Box::new(|info| {
        let what = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        let at = info.location().map(|l| l.to_string()).unwrap_or_default();
        eprintln!("panic at {at}: {what}");
    }));
}
