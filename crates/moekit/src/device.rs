//! Where a tensor's data lives and which backend runs an op.

use crate::error::{invalid, Result};
use std::fmt;

/// Where a tensor's storage lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Device {
    /// Host memory.
    #[default]
    Cpu,
    /// CUDA device with this ordinal (backend arrives with the CUDA issue).
    Cuda(usize),
}

impl Device {
    /// Parses `cpu`, `cuda` (ordinal 0) or `cuda:N`.
    pub fn parse(s: &str) -> Result<Device> {
        match s {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            _ => match s.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(n)) => Ok(Device::Cuda(n)),
                _ => Err(invalid("device", "device", "cpu, cuda or cuda:N", s)),
            },
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

/// Which implementation of an op runs. Ops pick [`Backend::for_device`] by
/// default; tests name a backend explicitly to force every code path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// The simple, obviously-right CPU oracle (`cpu::reference`).
    CpuReference,
    /// The fast CPU path (`cpu::fast`): rayon + cache blocking.
    CpuFast,
    /// The CUDA backend (`cuda::ops`), on the device of the op's tensors.
    Cuda,
}

impl Backend {
    /// The default backend for data on `device`.
    pub fn for_device(device: Device) -> Result<Backend> {
        match device {
            Device::Cpu => Ok(Backend::CpuFast),
            Device::Cuda(n) => crate::cuda::device(n).map(|_| Backend::Cuda),
        }
    }
}
