//! The checked-in C header must equal what cbindgen generates from src/ffi with cbindgen.toml.
//! A change to an export, a `repr(C)` type or a constant without `make header` fails here.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn generate() -> String {
    let root = root();
    let config =
        cbindgen::Config::from_file(root.join("cbindgen.toml")).expect("read cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(root.join("src/ffi/mod.rs"))
        .generate()
        .expect("cbindgen parses src/ffi");
    let mut out = Vec::new();
    bindings.write(&mut out);
    String::from_utf8(out).expect("header is UTF-8")
}

fn header_path() -> PathBuf {
    root().join("include/specmla.h")
}

#[test]
fn header_matches_rust_exports() {
    let want = generate();
    let have = std::fs::read_to_string(header_path()).expect("include/specmla.h exists");
    if have != want {
        let new = root().join("target/specmla.h.generated");
        let _ = std::fs::write(&new, &want);
        let line = have
            .lines()
            .zip(want.lines())
            .position(|(a, b)| a != b)
            .map_or(0, |i| i + 1);
        panic!(
            "include/specmla.h is out of date (first difference near line {line}); the generated header \
             was written to {}; run `make header` and commit it",
            new.display()
        );
    }
}

#[test]
fn header_declares_every_export() {
    // Guards against a export that cbindgen silently skips (e.g. a missing `extern "C"`).
    let header = std::fs::read_to_string(header_path()).expect("include/specmla.h exists");
    let mut n = 0;
    for entry in std::fs::read_dir(root().join("src/ffi")).expect("src/ffi") {
        let path = entry.expect("dir entry").path();
        let src = std::fs::read_to_string(&path).expect("read ffi source");
        let mut lines = src.lines();
        while let Some(l) = lines.next() {
            if l.trim() == "#[no_mangle]" {
                let sig = lines.next().unwrap_or_default();
                let name = sig
                    .split("fn ")
                    .nth(1)
                    .and_then(|s| s.split('(').next())
                    .unwrap_or_default();
                assert!(
                    name.starts_with("specmla_"),
                    "{}: export `{name}` lacks the specmla_ prefix",
                    path.display()
                );
                assert!(
                    header.contains(&format!("{name}(")),
                    "header lacks `{name}`"
                );
                n += 1;
            }
        }
    }
    assert!(n >= 20, "found only {n} exports");
}

/// `cargo test --test header_drift -- --ignored regenerate` (what `make header` runs).
#[test]
#[ignore]
fn regenerate() {
    std::fs::create_dir_all(Path::new(&header_path()).parent().expect("include dir"))
        .expect("mkdir include");
    std::fs::write(header_path(), generate()).expect("write include/specmla.h");
}
