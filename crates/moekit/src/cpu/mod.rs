//! CPU backends: [`reference`] is the oracle (simple loops, f64 where it
//! helps); [`fast`] is the production path (rayon, cache blocking).

pub mod fast;
pub mod reference;
