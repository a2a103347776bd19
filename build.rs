//! Build script: gives the C library its SONAME (`libspecmla.so.0`) and a linker version script
//! so the shared object exports only `specmla_*` symbols. Affects the cdylib only.

use std::io::Write;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    let map = std::path::Path::new(&out).join("specmla.map");
    let mut f = std::fs::File::create(&map).expect("write the version script");
    f.write_all(b"{\n  global: specmla_*;\n  local: *;\n};\n")
        .expect("write the version script");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libspecmla.so.0");
        println!(
            "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
            map.display()
        );
    }
}
