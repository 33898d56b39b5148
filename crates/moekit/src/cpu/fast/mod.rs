//! Fast CPU implementations: rayon parallelism and cache-friendly blocking.
pub mod dot;
pub mod gather_mm;
pub mod norm;
pub mod permute;
pub mod qdot;
pub mod route;
pub mod sort;
