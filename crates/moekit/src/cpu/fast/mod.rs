//! Fast CPU implementations: rayon parallelism and cache-friendly blocking.
