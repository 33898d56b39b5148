//! Norm epilogues (STUB).
