//! The simple, obviously-right CPU implementations every other backend is tested against.
