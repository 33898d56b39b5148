//! The CPU backends (crate-internal): `reference` is the oracle (simple
//! loops, f64 where it helps); `fast` is the production path (rayon, cache
//! blocking), whose vector kernels run at the [`SimdLevel`] chosen at run
//! time ([`simd_level`]) — the one public part of this module.

pub(crate) mod fast;
mod level;
pub(crate) mod reference;

pub use level::{simd_level, SimdLevel, LEVEL_ENV};
