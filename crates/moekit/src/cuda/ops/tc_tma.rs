//! `kernels/tc_tma.cu`: the grouped expert GEMM of [`super::tc_gemm`] (same
//! parameters, rows, tiles, epilogues and outputs) on sm_90a, in a
//! warp-specialized schedule: a producer warpgroup fills a ring of
//! shared-memory stages (dense weights of the activation type by TMA, any
//! other format copied packed into raw stages by `cp.async` and decoded
//! there; x's gathered rows by `cp.async`), two consumer warpgroups
//! multiply with `wgmma` (x rows on M, weight rows on N), mbarriers hand
//! each stage over, and persistent blocks walk the tile list so the ring
//! runs on across tiles. Tiles of 256 weight rows × 64 or 128 rows of x.
//!
//! The staged kernel moves a 128 × 64 weight tile and its x tile through a
//! block-wide barrier every step and waits for each step's MMAs before the
//! next; at T = 4096 its tensor pipes were about half busy, fed from L2 at
//! 7.3 TB/s (`bench/results/h100/tc/2026-11-24b.md`). A 256-row weight
//! tile halves the x bytes a multiply-add needs, and the ring keeps the
//! tensor cores fed across steps and tiles. H200, qwen3-30b-a3b bf16
//! T = 4096, graph: 1005 → 786–826 µs; mixtral-8x7b 6900 → 5940–6000 µs
//! (`bench/results/h200/2026-11-29_s25/`).
//!
//! [`supports`] says whether an operand set fits and why not;
//! `crate::cuda::ops::tc_moe::expert_kernels` is the one place the MoE
//! block picks this kernel.

use super::tc_gemm::Kernel;
use super::Geometry;
use crate::cuda::jit::Source;
use crate::cuda::Arch;
use crate::dtype::DType;
use crate::error::{invalid, Result};
use crate::format::{QuantWeights, WeightFormat};
use crate::ops::act::GateUp;
use crate::tensor::Tensor;

pub(crate) static SRC: Source = Source {
    name: "tc_tma.cu",
    text: include_str!("../../../kernels/tc_tma.cu"),
};

/// Threads a block (`TMA_THREADS`): a producer and two consumer warpgroups.
pub(crate) const THREADS: u32 = 384;
/// Weight rows of a tile (`TMA_WROWS`).
pub(crate) const WEIGHT_ROWS: usize = 256;
/// Weight rows a TMA box (`TMA_BOX`).
const BOX_ROWS: u32 = 64;
/// K columns a step (`TC_BK`): K must be a multiple of it.
pub const STEP: usize = 64;
/// Tile row counts (rows of x) the kernel is instantiated for.
pub const TILE_ROWS: [usize; 2] = [64, 128];

/// A `CUtensorMap` as the kernel parameter holds it (`TmaMap`).
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub(crate) struct TmaMap([u64; 16]);

impl TmaMap {
    /// No map: the parameter of an instance that decodes its weights.
    pub(crate) fn zeroed() -> TmaMap {
        TmaMap([0; 16])
    }
}

/// `TmaParams`: a tensor map per weight source, then the GEMM's params.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub(crate) struct TmaParams {
    pub(crate) map: [TmaMap; 2],
    pub(crate) tc: super::tc_gemm::TcParams,
}
const _: () = assert!(std::mem::size_of::<TmaParams>() == 448);
// SAFETY: plain-old-data mirrored by the kernel's TmaParams.
unsafe impl cudarc::driver::DeviceRepr for TmaParams {}

/// Static shared memory the kernel may take besides its stages
/// (`TMA_STATIC`: the tile list's starts and offsets, barriers).
const STATIC_SMEM: usize = 10240;

/// Raw stages of decoded weights (`TMA_RAW_STAGES`).
const RAW_STAGES: usize = 2;

/// Shared memory of a `bm`-row instance for weights `w` under activations
/// of `dtype` (`TmaGeo::SMEM`): [`RAW_STAGES`] raw stages of the tile's
/// rows for decoded weights, then as many stages of 256 × 64 weights and
/// `bm` × 64 x values as fit a block's 227 KB beside [`STATIC_SMEM`], at
/// most 6, and 1 KB to align them.
pub(crate) fn smem_bytes(w: &QuantWeights, dtype: DType, bm: usize) -> usize {
    let raw = raw_bytes(w, dtype);
    let stage = WEIGHT_ROWS * 128 + bm * 128;
    let s = ((232448 - 1024 - STATIC_SMEM - raw) / stage).min(6);
    s * stage + raw + 1024
}

/// Bytes of the [`RAW_STAGES`] raw stages of a tile's rows for decoded
/// weights (0 for dense weights of `dtype`, which come by TMA).
fn raw_bytes(w: &QuantWeights, dtype: DType) -> usize {
    super::tc_geo::raw_pitch(w, dtype).map_or(0, |p| RAW_STAGES * WEIGHT_ROWS * p)
}

/// Whether `tc_tma` takes activations of `dtype` against `w` on a device
/// of `arch` (sm_90a: wgmma and TMA); the reason when it does not. Dense
/// weights of the activation type come by TMA, every other format through
/// its decoder.
pub fn supports(dtype: DType, w: &QuantWeights, arch: Arch) -> std::result::Result<(), String> {
    super::tc_gemm::sm90_operands("the TMA GEMM", dtype, w, arch, STEP)?;
    if !has_room(w.format()) {
        return Err(format!(
            "dense f32 weights: two raw stages of their rows leave no room for the ring (convert them to {dtype})"
        ));
    }
    // TMA row coordinates are i32: every weight row, plus a box past the last.
    let rows = w.n_experts().saturating_mul(w.rows());
    if by_tma(dtype, w) && rows.saturating_add(2 * WEIGHT_ROWS) > i32::MAX as usize {
        return Err(format!("{rows} weight rows: TMA coordinates are 32-bit"));
    }
    Ok(())
}

/// Whether a ring of stages fits beside two raw stages of `format`'s rows:
/// every format but dense f32 (the kernel's `TmaGeo` asserts two stages;
/// `supports` refuses the rest, and no instance is compiled for it).
fn has_room(format: WeightFormat) -> bool {
    format != WeightFormat::Dense(DType::F32)
}

/// Whether the kernel copies `w` by TMA (dense weights of the activation
/// type) rather than decoding it in its producer threads.
pub(crate) fn by_tma(dtype: DType, w: &QuantWeights) -> bool {
    w.format() == WeightFormat::Dense(dtype)
}

pub(crate) use super::tc_gemm::Use;

/// How the MoE block uses `tc_tma`, from `MOEKIT_TC_TMA` (read once): `0`
/// never, `all` at every tile it has, else from [`MIN_TILE`] rows up.
pub(crate) fn use_mode() -> Use {
    static ENV: std::sync::OnceLock<Use> = std::sync::OnceLock::new();
    *ENV.get_or_init(|| Use::from_env("MOEKIT_TC_TMA"))
}

/// The staged kernel's tile (rows of x) from which the MoE block runs dense
/// weights on `tc_tma`. Below it (64-row tiles or less: about 50 rows an
/// expert or fewer) the staged kernel measured as fast or faster (H200,
/// qwen3-30b-a3b bf16, graph, `MOEKIT_TC_TMA=all` against the table, same
/// call: T = 64 331–333 against 323–330 µs, T = 512 364 against 350–359).
pub const MIN_TILE: usize = 128;

/// Whether the MoE block runs a GEMM of activations `dtype` against `w`
/// (`glu`: with a general activation or biases; `rows`: the experts'
/// average rows) on `tc_tma` where the
/// staged kernel would take `bm`-row tiles: dense weights of the activation
/// type from [`MIN_TILE`] rows, and with a general activation where the
/// experts average [`GLU_ROWS`] rows or more; every GEMM at every tile with
/// `MOEKIT_TC_TMA=all`, none with `0`.
///
/// Decoded weights stay on `tc_ra` and the staged kernel: decoded into the
/// ring by the producer warpgroup, they measured no faster (H200, graph,
/// `MOEKIT_TC_TMA=0` against `all`, same call,
/// `bench/results/h200/2026-11-30_s26/run5`: qwen3-30b-a3b T = 4096
/// affine4-g64 983 against 1216 µs, q4_k 981 / 1244, q8_0 1447 / 1417,
/// q4_0 1240 / 1246, q6_k 2279 / 2317; T = 512 affine4 268 / 468;
/// mixtral-8x7b affine4 6158 / 10100). gpt-oss-20b's general activation
/// (`glu`, bf16, T = 4096) measured slower on `tc_tma` while its epilogue
/// divided by IEEE rules (2343 µs staged against 2355, `run2`), and faster
/// once `silu`/`glu_at` divide with `__fdividef`: 2170–2177 µs with the
/// gate/up staged against 1930–1936 on `tc_tma`, same call
/// (`bench/results/h200/2026-11-30_s28/run3`; 512 rows an expert) — but
/// T = 512 (64 rows an expert, 128-row tiles) 513 → 569–572 µs on
/// `tc_tma` (`run4`): hence [`GLU_ROWS`].
pub(crate) fn runs(dtype: DType, w: &QuantWeights, glu: bool, bm: usize, rows: usize) -> bool {
    match use_mode() {
        Use::Never => false,
        Use::Everywhere => true,
        Use::Table => by_tma(dtype, w) && bm >= MIN_TILE && (!glu || rows >= GLU_ROWS),
    }
}

/// Rows an expert averages from which the MoE block runs a gate/up GEMM
/// with a general activation (gpt-oss's GLU epilogue) on `tc_tma`: it
/// measured faster at 512 rows an expert and slower at 64 (gpt-oss-20b
/// bf16 T = 4096 and 512, above); two full 128-row tiles an expert is the
/// line drawn between them (not measured in between).
pub const GLU_ROWS: usize = 2 * MIN_TILE;

/// The tile row count for `m` rows over `n_experts` experts: the staged
/// kernel's choice ([`super::tc_geo::tile_rows`]), 64 or 128.
pub fn tile_rows(m: usize, n_experts: usize, col_blocks: usize) -> usize {
    if super::tc_geo::tile_rows(m, n_experts, col_blocks) >= 128 {
        128
    } else {
        64
    }
}

/// Instances for the compile check: every decoder type × {f16, bf16} ×
/// {plain, SwiGLU, SwiGLU's general activation (GLU)} × [`TILE_ROWS`].
pub fn instances() -> Vec<(&'static Source, String)> {
    let mut names = std::collections::BTreeSet::new();
    for (f, ft) in super::gather_mm::all_format_types() {
        if !has_room(f) {
            continue; // refused: `supports`
        }
        for t in ["__half", "__nv_bfloat16"] {
            for bm in TILE_ROWS {
                names.insert(format!("moekit::tc_tma<{ft}, {t}, 1, {bm}>"));
                names.insert(format!("moekit::tc_tma<{ft}, {t}, 2, {bm}>"));
                names.insert(format!("moekit::tc_tma<{ft}, {t}, 2, {bm}, true>"));
            }
        }
    }
    names.into_iter().map(|e| (&SRC, e)).collect()
}

/// The tensor map of dense weights `w` (`[E·rows, K]` of T): boxes of
/// [`BOX_ROWS`] rows × 64 columns, 128-byte swizzle (wgmma's K-major
/// layout), zeros past the last row.
pub(crate) fn tensor_map(op: &'static str, w: &QuantWeights) -> Result<TmaMap> {
    use cudarc::driver::sys;
    let dtype = match w.format() {
        WeightFormat::Dense(DType::Bf16) => {
            sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
        }
        WeightFormat::Dense(DType::F16) => {
            sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16
        }
        f => return Err(invalid(op, "weights", "dense bf16 or f16 weights", f)),
    };
    let data = w.data().cuda_bytes()?;
    let (k, rows) = (w.cols() as u64, (w.n_experts() * w.rows()) as u64);
    let dims = [k, rows];
    let strides = [k * 2];
    let boxes = [STEP as u32, BOX_ROWS];
    let elem = [1u32, 1];
    // SAFETY: an all-zero CUtensorMap is a valid (unencoded) value of this
    // plain C struct; the encode call fills it.
    let mut map: sys::CUtensorMap = unsafe { std::mem::zeroed() };
    data.device()
        .context()
        .bind_to_thread()
        .map_err(crate::error::cuda_err(op))?;
    // SAFETY: `map` is a live, aligned CUtensorMap; the address is a device
    // allocation of `rows · K` elements of the map's type (the weights'
    // data tensor), and the dims, strides, box and element strides arrays
    // hold rank (2) entries (strides: rank − 1), as the call reads them.
    unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map,
            dtype,
            2,
            data.ptr() as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            elem.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    }
    .result()
    .map_err(crate::error::cuda_err(op))?;
    // SAFETY: CUtensorMap is 128 bytes of plain data (its opaque words).
    Ok(TmaMap(unsafe {
        std::mem::transmute_copy::<sys::CUtensorMap, [u64; 16]>(&map)
    }))
}

/// The launch of [`Kernel::Tma`] for [`super::tc_gemm::run_kernel`] over
/// `m` rows, `n_experts` experts and `col_blocks` column blocks of weights
/// `w` (`glu`: the general activation's instance): its tile, shared memory
/// and instance name.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_shape(
    op: &'static str,
    x: &Tensor,
    w: &QuantWeights,
    p_sources: usize,
    glu: bool,
    m: usize,
    n_experts: usize,
    col_blocks: usize,
) -> Result<(usize, usize, String)> {
    let bm = tile_rows(m, n_experts, col_blocks);
    if !(1..=2).contains(&p_sources) {
        return Err(invalid(
            op,
            "sources",
            "1 or 2 (plain or SwiGLU)",
            p_sources,
        ));
    }
    let name = super::tc_gemm::kernel_name("tc_tma", w, x.dtype(), p_sources, bm, glu)?;
    Ok((bm, smem_bytes(w, x.dtype(), bm), name))
}

/// Block geometry of a launch over at most `gx × gy` tiles (column blocks
/// × row tiles) with `smem` bytes: persistent blocks, one an SM (the
/// kernel walks its tiles from there).
pub(crate) fn geometry(gx: u32, gy: u32, smem: usize, sm_count: u32) -> Geometry {
    Geometry {
        grid: (gx.saturating_mul(gy).min(sm_count.max(1)), 1, 1),
        block: (THREADS, 1, 1),
        shared: smem as u32,
    }
}

/// `out [M, N] = x · W[e(row)]ᵀ` on `tc_tma`.
pub fn matmul_into(
    x: &Tensor,
    w: &QuantWeights,
    rows: super::tc_gemm::TcRows<'_>,
    out: &Tensor,
) -> Result<()> {
    super::tc_gemm::run_kernel(
        Kernel::Tma,
        "tc_tma",
        x,
        [(w, 0), (w, 0)],
        1,
        w.rows(),
        rows,
        out,
        super::GluParams::default(),
    )
}

/// Fused `act(x·Gᵀ + bg) · (x·Uᵀ + bu)` on `tc_tma` into `out [M, I]`
/// (`ffn`'s activation, biases and scales).
pub fn glu_into(
    x: &Tensor,
    w: &GateUp,
    rows: super::tc_gemm::TcRows<'_>,
    ffn: &crate::ops::ffn::ExpertFfn,
    out: &Tensor,
) -> Result<()> {
    super::tc_gemm::run_swiglu(Kernel::Tma, "tc_tma_swiglu", x, w, rows, ffn, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_fit_the_shared_memory_of_an_sm() {
        use crate::format::random::random_weights;
        for f in WeightFormat::all() {
            if !has_room(f) {
                continue; // refused: `supports`
            }
            let w = random_weights(f, 1, 8, 256, DType::F16, 1, &|| {}).unwrap();
            for bm in TILE_ROWS {
                let s = smem_bytes(&w, DType::Bf16, bm);
                assert!(s + STATIC_SMEM <= 232448, "{f} {bm}: {s}");
                // Dense weights by TMA: a ring of four stages at least;
                // decoded weights beside their raw stages: two.
                let raw = raw_bytes(&w, DType::Bf16);
                let want = if raw == 0 { 4 } else { 2 };
                let stages = (s - 1024 - raw) / (WEIGHT_ROWS * 128 + bm * 128);
                assert!(stages >= want, "{f} {bm}: {stages} stages");
            }
        }
    }

    #[test]
    fn supports_every_format_but_dense_f32_on_sm90() {
        use crate::format::random::random_weights;
        let sm90 = Arch::SM90;
        for f in WeightFormat::all() {
            let w = random_weights(f, 2, 8, 256, DType::F16, 1, &|| {}).unwrap();
            let got = supports(DType::Bf16, &w, sm90);
            if f == WeightFormat::Dense(DType::F32) {
                let why = got.unwrap_err();
                assert!(why.contains("dense f32"), "{why}");
            } else {
                assert!(got.is_ok(), "{f}: {got:?}");
            }
            // Activations other than bf16/f16, K off the step, and other
            // architectures are refused with their reasons.
            let why = supports(DType::F32, &w, sm90).unwrap_err();
            assert!(why.contains("activations"), "{f}: {why}");
            let why = supports(DType::Bf16, &w, Arch { major: 8, minor: 0 }).unwrap_err();
            assert!(why.contains("sm_90a"), "{f}: {why}");
        }
        let w = random_weights(
            WeightFormat::Dense(DType::Bf16),
            1,
            8,
            96,
            DType::F16,
            1,
            &|| {},
        )
        .unwrap();
        let why = supports(DType::Bf16, &w, sm90).unwrap_err();
        assert!(why.contains("K = 96"), "{why}");
    }

    #[test]
    fn tiles_are_64_or_128_rows() {
        assert_eq!(tile_rows(4096 * 8, 128, 6), 128);
        assert_eq!(tile_rows(512 * 8, 128, 6), 64);
        assert_eq!(tile_rows(8, 128, 6), 64);
    }
}
