//! The CPU backends (crate-internal): `reference` is the oracle (simple
//! loops, f64 where it helps); `fast` is the production path (rayon, cache
//! blocking), whose vector kernels run at the [`SimdLevel`] chosen at run
//! time ([`simd_level`]) and whose fused dots use the activations chosen by
//! [`act_mode`] — the public parts of this module.

pub(crate) mod fast;
mod level;
pub(crate) mod reference;

pub use level::{
    act_mode, in_pool, prefetch_distance, simd_level, with_act_mode, ActMode, SimdLevel, ACT_ENV,
    LEVEL_ENV, PREFETCH_DEFAULT, PREFETCH_ENV,
};
