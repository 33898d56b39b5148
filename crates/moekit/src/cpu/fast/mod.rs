//! Fast CPU implementations: rayon parallelism and cache-friendly blocking.
pub mod sort;
pub mod permute;
pub mod gather_mm;
pub mod route;
pub mod norm;
pub mod dot;
