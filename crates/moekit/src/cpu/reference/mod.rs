//! The simple, obviously-right CPU implementations every other backend is tested against.
pub mod gather_mm;
pub mod norm;
pub mod permute;
pub mod route;
pub mod sort;
