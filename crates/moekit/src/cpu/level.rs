//! Which instruction-set level the CPU kernels run at, chosen at run time.
//!
//! The fused dot kernels ([`fast::dot`](super::fast::dot)) are compiled once
//! per [`SimdLevel`]; which one runs is decided once per process by
//! [`simd_level`] (CPU feature detection), so a crate that depends on moekit
//! gets the AVX2 kernels without `-C target-cpu` flags.

use std::sync::OnceLock;

/// An instruction-set level the CPU kernels are compiled for.
///
/// More levels may be added (e.g. AVX-VNNI, AVX-512, NEON dot product).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SimdLevel {
    /// Plain Rust for any CPU (what the build's target features allow).
    Portable,
    /// x86-64 with AVX2, FMA and F16C (the x86-64-v3 vector features).
    Avx2,
}

impl SimdLevel {
    /// Every level, in order of preference (best first).
    pub const ALL: [SimdLevel; 2] = [SimdLevel::Avx2, SimdLevel::Portable];

    /// The level's name: `portable` or `avx2`.
    pub fn name(self) -> &'static str {
        match self {
            SimdLevel::Portable => "portable",
            SimdLevel::Avx2 => "avx2",
        }
    }

    /// The level named `name` (as [`SimdLevel::name`] writes it).
    pub fn parse(name: &str) -> Option<SimdLevel> {
        SimdLevel::ALL.into_iter().find(|l| l.name() == name)
    }

    /// Whether this CPU can run the level's kernels (detected at run time).
    pub fn is_supported(self) -> bool {
        match self {
            SimdLevel::Portable => true,
            SimdLevel::Avx2 => avx2_detected(),
        }
    }

    /// The best level this CPU supports.
    pub fn detect() -> SimdLevel {
        SimdLevel::ALL
            .into_iter()
            .find(|l| l.is_supported())
            .unwrap_or(SimdLevel::Portable)
    }
}

impl std::fmt::Display for SimdLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(target_arch = "x86_64")]
fn avx2_detected() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
}

#[cfg(not(target_arch = "x86_64"))]
fn avx2_detected() -> bool {
    false
}

/// Environment variable that caps the level [`simd_level`] picks: a level
/// name (`portable`, `avx2`); read once, on the first call. A level this CPU
/// does not support, or an unknown name, is ignored (the detected level is used).
pub const LEVEL_ENV: &str = "MOEKIT_CPU_LEVEL";

/// The level the CPU kernels run at in this process: the best level the CPU
/// supports, or the one named by [`LEVEL_ENV`] if set and supported.
/// Decided on the first call and fixed after.
pub fn simd_level() -> SimdLevel {
    static LEVEL: OnceLock<SimdLevel> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        std::env::var(LEVEL_ENV)
            .ok()
            .and_then(|v| SimdLevel::parse(v.trim()))
            .filter(|l| l.is_supported())
            .unwrap_or_else(SimdLevel::detect)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for l in SimdLevel::ALL {
            assert_eq!(SimdLevel::parse(l.name()), Some(l));
        }
        assert_eq!(SimdLevel::parse("avx9"), None);
        assert!(SimdLevel::Portable.is_supported());
        assert!(SimdLevel::detect().is_supported());
    }
}
