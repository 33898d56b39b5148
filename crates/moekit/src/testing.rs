//! Internals re-exported for moekit's own integration tests, examples and
//! benchmarks. **Not part of the API**: hidden from the docs, may change or
//! disappear in any release. Code outside this repository should not use it.

/// The fast CPU backend's row dot products (f32 and integer) and
/// grouped-matmul strategies.
pub mod cpu_fast {
    pub use crate::cpu::fast::dot::{dot_row, dot_rows, dot_rows_at, XSums};
    pub use crate::cpu::fast::gather_mm::{
        act_choice, gather_mm_act, gather_mm_with, ActChoice, Strategy,
    };
    pub use crate::cpu::fast::qdot::{
        kind_of, kind_of_affine, kind_of_rows, qdot_rows, QKind, QRow,
    };
}

pub use crate::format::rows::{RawRow, RowDecoder, ScaleRow};

/// The row decoder of `w` (what the CPU backends read weights through).
pub fn decoder(w: &crate::QuantWeights) -> crate::Result<RowDecoder<'_>> {
    w.decoder()
}

/// The CUDA backend's NVRTC compiler, kernel instances and typed launch
/// wrappers (each checks its arguments; the raw `launch` stays private).
pub mod cuda {
    pub use crate::cuda::jit::{compile, compile_cached, Compiled, Source};
    pub use crate::cuda::ops::{all_instances, instance_arches};

    /// `kernels/act.cu`.
    pub mod act {
        pub use crate::cuda::ops::act::swiglu_into;
    }
    /// `kernels/decode.cu`.
    pub mod decode {
        pub use crate::cuda::ops::decode::force_fold;
    }
    /// `kernels/gather_mm.cu`.
    pub mod gather_mm {
        pub use crate::cuda::ops::gather_mm::{
            gather_glu_into, gather_mm_into, gather_swiglu_into,
        };
    }
    /// `kernels/norm.cu`.
    pub mod norm {
        pub use crate::cuda::ops::norm::{epilogue_into, EpilogueOperands, STAGED_MAX_DIM};
    }
    /// `kernels/permute.cu`.
    pub mod permute {
        pub use crate::cuda::ops::permute::{permute_into, unpermute_into};
    }
    /// `kernels/route.cu`.
    pub mod route {
        pub use crate::cuda::ops::route::route_into;
    }
    /// `kernels/sort.cu`.
    pub mod sort {
        pub use crate::cuda::ops::sort::expert_sort_into;
    }
    /// `kernels/tc_gemm.cu`.
    pub mod tc_gemm {
        pub use crate::cuda::ops::tc_gemm::{
            force_by_row, glu_into, matmul_into, split_matmul_into, swiglu_into, tile_rows, TcRows,
        };
        pub use crate::cuda::ops::tc_parts::{k_parts, sum_parts_into};
    }
    /// `kernels/tc_ra.cu`.
    pub mod tc_ra {
        pub use crate::cuda::ops::tc_ra::{
            glu_into, matmul_into, max_tile, permute_into, span_order, supports, swiglu_into,
            tile_rows, SpanOrder, SPAN,
        };
    }
    /// `kernels/tc_tma.cu`.
    pub mod tc_tma {
        pub use crate::cuda::ops::tc_tma::{glu_into, matmul_into, supports, tile_rows};
    }
}
