//! (filled in with the CUDA kernels of this area)
