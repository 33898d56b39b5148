//! The simple, obviously-right CPU implementations every other backend is tested against.
pub mod sort;
pub mod permute;
pub mod gather_mm;
pub mod route;
pub mod norm;
