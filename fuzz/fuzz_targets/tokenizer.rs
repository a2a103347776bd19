//! libFuzzer target `tokenizer`: raw bytes -> `specmla::fuzzing::tokenizer` (see its module doc for
//! what the bytes mean and what is checked). A typed error is a normal outcome; a panic is a
//! crash.
#![no_main]

mod common;

libfuzzer_sys::fuzz_target!(init: common::init(), |data: &[u8]| {
    let _ = specmla::fuzzing::tokenizer(data);
});
