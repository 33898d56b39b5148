//! GPU tests: every CUDA op against the CPU reference on fresh random inputs.
//!
//! Built with `--features gpu-tests` (CI only compiles it); run on a CUDA
//! machine (`scripts/gpu-bundle.sh` packs it). Without a GPU every test
//! fails loudly: none passes by skipping.
//!
//! Outputs are preallocated and poisoned with NaN, so a kernel that misses
//! an element fails the NMSE check (which rejects non-finite values).

mod common;
mod decode;
mod expert_scale;
mod gather_mm;
mod interop;
mod moe;
mod norm_act;
mod permute;
mod route_sort;
mod tc;
mod tc_ra;
mod tc_tma;
