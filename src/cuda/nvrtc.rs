//! NVRTC through cudarc's dynamic loading: compile one kernel source for one architecture with
//! the ptxas resource report, and check every kernel for every target architecture.

use std::ffi::CString;

use cudarc::nvrtc::{result, sys};

use crate::error::{Error, Result};

use super::kernels::{kernel_sources, HOT_KERNELS};

/// The architectures the compile check covers: Ampere, Hopper (and its arch-specific sm_90a),
/// Blackwell (and sm_100a).
pub const ARCHS: [&str; 5] = ["sm_80", "sm_90", "sm_90a", "sm_100", "sm_100a"];

/// Whether the NVRTC library can be loaded (false on a machine without CUDA; never panics).
pub fn available() -> bool {
    // SAFETY: only probes whether the shared library loads.
    unsafe { sys::is_culib_present() }
}

/// ptxas's report for one entry function.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FunctionReport {
    pub name: String,
    pub registers: u32,
    pub smem_bytes: u32,
    pub stack_bytes: u32,
    pub spill_store_bytes: u32,
    pub spill_load_bytes: u32,
}

impl FunctionReport {
    /// One line of the compile report: name, arch, registers, shared memory, stack, spills.
    pub fn line(&self, arch: &str) -> String {
        format!(
            "{:<24} {:<8} regs {:>3}  smem {:>6} B  stack {:>4} B  spills {}/{} B",
            self.name,
            arch,
            self.registers,
            self.smem_bytes,
            self.stack_bytes,
            self.spill_store_bytes,
            self.spill_load_bytes
        )
    }
}

/// One (file, architecture) compile.
#[derive(Clone, Debug)]
pub struct CompileReport {
    pub file: String,
    pub arch: String,
    pub functions: Vec<FunctionReport>,
    pub log: String,
    /// The compiled cubin.
    pub cubin: Vec<u8>,
}

fn number_before(s: &str, unit: &str) -> Option<u32> {
    let i = s.find(unit)?;
    s[..i].split_whitespace().last()?.parse().ok()
}

/// The per-function figures of a ptxas `-v` log.
pub fn parse_ptxas_log(log: &str) -> Vec<FunctionReport> {
    let mut out: Vec<FunctionReport> = Vec::new();
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or("").to_string();
            out.push(FunctionReport {
                name,
                ..Default::default()
            });
            continue;
        }
        let Some(f) = out.last_mut() else {
            continue;
        };
        if line.contains("bytes stack frame") {
            f.stack_bytes = number_before(line, "bytes stack frame").unwrap_or(0);
            f.spill_store_bytes = number_before(line, "bytes spill stores").unwrap_or(0);
            f.spill_load_bytes = number_before(line, "bytes spill loads").unwrap_or(0);
        }
        if line.contains("Used") && line.contains("registers") {
            f.registers = number_before(line, "registers").unwrap_or(0);
            f.smem_bytes = number_before(line, "bytes smem").unwrap_or(0);
        }
    }
    out
}

/// A new NVRTC program of `source` (named `file`); the caller destroys it.
fn program(file: &str, source: &str) -> Result<sys::nvrtcProgram> {
    if !available() {
        return Err(Error::Engine(
            "NVRTC is not available (libnvrtc.so not found on the library path)".into(),
        ));
    }
    let src = CString::new(source)
        .map_err(|_| Error::InvalidArgument(format!("{file}: a NUL byte in the source")))?;
    let name = CString::new(file).unwrap_or_default();
    result::create_program(&src, Some(&name))
        .map_err(|e| Error::Engine(format!("{file}: nvrtcCreateProgram: {e:?}")))
}

/// Compile `source` (named `file`) for `arch` (e.g. `sm_90`) with `-Xptxas=-v`: the resource
/// report and the cubin a device of that architecture loads without NVRTC or a JIT. An NVRTC
/// error (the log says why) is `Error::Engine` naming the file and architecture.
pub fn compile(file: &str, source: &str, arch: &str) -> Result<CompileReport> {
    let prog = program(file, source)?;
    let opts = vec![
        format!("--gpu-architecture={arch}"),
        "-Xptxas=-v".to_string(),
        "--std=c++17".to_string(),
        "-default-device".to_string(),
    ];
    // SAFETY: `prog` is live until the destroy below; the log and the cubin are read before it,
    // the cubin buffer with the size NVRTC gave.
    let (compiled, log, cubin) = unsafe {
        let compiled = result::compile_program(prog, &opts).is_ok();
        let log = result::get_program_log(prog)
            .map(|v| v.iter().map(|&c| c as u8 as char).collect::<String>())
            .unwrap_or_default();
        let mut n = 0usize;
        let mut cubin = Vec::new();
        if compiled
            && sys::nvrtcGetCUBINSize(prog, &mut n) == sys::nvrtcResult::NVRTC_SUCCESS
            && n > 0
        {
            cubin = vec![0u8; n];
            if sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr() as *mut std::ffi::c_char)
                != sys::nvrtcResult::NVRTC_SUCCESS
            {
                cubin.clear();
            }
        }
        let _ = result::destroy_program(prog);
        (compiled, log, cubin)
    };
    let log = log.trim_end_matches('\0').to_string();
    if !compiled {
        return Err(Error::Engine(format!(
            "{file} does not compile for {arch}:\n{log}"
        )));
    }
    if cubin.is_empty() {
        return Err(Error::Engine(format!("{file}: no cubin for {arch}")));
    }
    Ok(CompileReport {
        file: file.to_string(),
        arch: arch.to_string(),
        functions: parse_ptxas_log(&log),
        log,
        cubin,
    })
}

/// Compile every kernel for every architecture of [`ARCHS`]; an error names the first kernel
/// that fails to compile or the first hot kernel (`HOT_KERNELS`) that spills registers.
pub fn check_all() -> Result<Vec<CompileReport>> {
    let mut out = Vec::new();
    for k in kernel_sources() {
        for arch in ARCHS {
            let r = compile(k.file, &k.source, arch)?;
            if r.functions.is_empty() {
                return Err(Error::Engine(format!(
                    "{} for {arch}: no entry function in the ptxas report:\n{}",
                    k.file, r.log
                )));
            }
            for f in &r.functions {
                if HOT_KERNELS.contains(&f.name.as_str())
                    && (f.spill_store_bytes > 0 || f.spill_load_bytes > 0)
                {
                    return Err(Error::Engine(format!(
                        "{} ({}) spills registers for {arch}: {} bytes stored, {} loaded",
                        f.name, k.file, f.spill_store_bytes, f.spill_load_bytes
                    )));
                }
            }
            out.push(r);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptxas_reports_parse() {
        let log = "ptxas info    : 0 bytes gmem\n\
            ptxas info    : Compiling entry function 'k' for 'sm_90'\n\
            ptxas info    : Function properties for k\n\
            ptxas         .     8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n\
            ptxas info    : Used 40 registers, used 1 barriers, 1024 bytes smem\n\
            ptxas info    : Compiling entry function 'j' for 'sm_90'\n\
            ptxas info    : Used 10 registers, used 0 barriers\n";
        let f = parse_ptxas_log(log);
        assert_eq!(f.len(), 2);
        assert_eq!(
            f[0],
            FunctionReport {
                name: "k".into(),
                registers: 40,
                smem_bytes: 1024,
                stack_bytes: 8,
                spill_store_bytes: 4,
                spill_load_bytes: 12
            }
        );
        assert_eq!(
            (f[1].name.as_str(), f[1].registers, f[1].smem_bytes),
            ("j", 10, 0)
        );
    }
}
