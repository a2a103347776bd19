//! Which device a model runs on: `cpu` (default) or `cuda[:N]` (`EngineConfig::device`, CLI
//! `--device`, the C ABI's `device` string).

use std::fmt;

use crate::error::{Error, Result};

/// A compute device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Device {
    /// The CPU kernels (`kernels`), the default.
    #[default]
    Cpu,
    /// CUDA device ordinal N (`cuda::backend`).
    Cuda(usize),
}

impl Device {
    /// Parse `cpu`, `cuda` (device 0) or `cuda:N`.
    pub fn parse(s: &str) -> Result<Device> {
        let t = s.trim().to_ascii_lowercase();
        match t.as_str() {
            "cpu" | "" => Ok(Device::Cpu),
            "cuda" | "gpu" => Ok(Device::Cuda(0)),
            _ => {
                let n = t
                    .strip_prefix("cuda:")
                    .and_then(|n| n.parse::<usize>().ok())
                    .filter(|&n| n < 1024);
                n.map(Device::Cuda).ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "device {s:?}: expected cpu, cuda or cuda:N (N a device ordinal)"
                    ))
                })
            }
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_display_round_trip() {
        assert_eq!(Device::parse("cpu").unwrap(), Device::Cpu);
        assert_eq!(Device::parse(" CUDA ").unwrap(), Device::Cuda(0));
        assert_eq!(Device::parse("cuda:3").unwrap(), Device::Cuda(3));
        for d in [Device::Cpu, Device::Cuda(0), Device::Cuda(7)] {
            assert_eq!(Device::parse(&d.to_string()).unwrap(), d);
        }
        for bad in [
            "cuda:",
            "cuda:-1",
            "cuda:x",
            "tpu",
            "cuda:99999",
            "cuda:1:2",
        ] {
            let e = Device::parse(bad).unwrap_err().to_string();
            assert!(e.contains("expected cpu, cuda or cuda:N"), "{bad}: {e}");
        }
    }
}
