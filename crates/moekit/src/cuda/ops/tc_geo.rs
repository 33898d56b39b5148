//! The tensor-core GEMM's geometry (`kernels/tc_gemm.cu` `TcGeo`, mirrored
//! here): the tile row counts, each instance's shared memory (raw stages of
//! packed weights, activation and weight tiles), and the choice of tile for
//! a launch from its rows, experts and column blocks.

use crate::dtype::DType;
use crate::format::{QuantWeights, WeightFormat};

/// Tile row counts the kernel is instantiated for (`BM`).
pub const TILE_ROWS: [usize; 5] = [16, 32, 64, 128, 256];
/// Weight rows of a tile (`TC_BROWS`): 128 output columns, or 64 with SwiGLU.
pub(crate) const BROWS: usize = 128;
/// K columns a pipeline step (`TC_BK`).
pub(crate) const BK: usize = 64;
/// A-tile stages (`TcStages`): 4 for tiles of < 64 rows, else 3.
pub(crate) fn stages(bm: usize) -> usize {
    if bm >= 64 {
        3
    } else {
        4
    }
}
/// Shared memory of an SM (228 KB; each block also takes 1 KB reserved):
/// `TcGeo::blocks_for`.
const SM_SMEM: usize = 233472;

/// Storage unit of a format: (weights, bytes) (`F::UNIT_W`, `F::UNIT_BYTES`).
fn unit(format: WeightFormat) -> (usize, usize) {
    match format {
        WeightFormat::Dense(d) => (1, d.size()),
        WeightFormat::Affine(p) => (32, 4 * p.bits as usize),
        WeightFormat::AffineU8 { .. } => (32, 32),
        WeightFormat::Ggml(t) => (t.block_size(), t.type_size()),
        WeightFormat::MlxFp(m) => (32, 4 * m.bits() as usize),
        WeightFormat::Fp8Block { .. } => (32, 32),
    }
}

/// A weight row's raw stage in shared memory (`TcRaw<F, aw>`: scales and
/// biases in words of `aw` bytes): its pitch in bytes and the pipeline steps
/// a stage feeds. None for dense weights of the activation type, which are
/// copied straight into the tiles.
struct RawRow {
    pitch: usize,
    rsteps: usize,
}

fn raw_row(w: &QuantWeights, dtype: DType, aw: usize) -> Option<RawRow> {
    if w.format() == WeightFormat::Dense(dtype) {
        return None;
    }
    let room = |n: usize| (n + 30) & !15;
    let (uw, ub) = unit(w.format());
    let kr = uw.max(BK);
    // Data: its bytes when units are whole 16-byte words, else the words
    // that cover them; scales and biases: 4-byte words rounded up to 8
    // bytes, or the 16-byte words that cover them.
    let data = if ub % 16 == 0 {
        kr / uw * ub
    } else {
        room(kr / uw * ub)
    };
    // Most groups a stage covers (`TcRaw::AUX_ELEMS`: KR / F::SUB, the
    // smallest group: 32, or nvfp4's 16).
    let groups = kr
        / match w.format() {
            WeightFormat::MlxFp(m) => m.group_size(),
            _ => 32,
        };
    let aux = w.scales().map_or(0, |s| {
        let size = s.dtype().size();
        if aw == 4 {
            ((4 - size % 4) % 4 + groups * size + 7) & !7
        } else {
            room(groups * size)
        }
    });
    // An odd number of 16-byte units (bank-conflict-free row reads).
    Some(RawRow {
        pitch: (data + 2 * aux) | 16,
        rsteps: kr / BK,
    })
}

/// The pitch of a weight row's raw stage with scales and biases in 4-byte
/// words (`TcRaw<F>::PITCH`), None for dense weights of `dtype`.
pub(crate) fn raw_pitch(w: &QuantWeights, dtype: DType) -> Option<usize> {
    raw_row(w, dtype, 4).map(|r| r.pitch)
}

/// Shared memory of an instance (`TcGeo::SMEM`) for activations of `dtype`.
pub(crate) fn smem_bytes(w: &QuantWeights, dtype: DType, bm: usize) -> usize {
    let a_b = stages(bm) * bm * BK * 2;
    let b_tile = BROWS * BK * 2;
    // Dense weights of the activation type go straight to S B stages.
    // Tiles of >= 32 rows may run on wgmma: room to align them to 1024 bytes.
    let slack = if bm >= 32 { 1024 } else { 0 };
    let blocks = |smem: usize| SM_SMEM / (smem + 1024);
    // Raw stages (`TcTiles::lead_for`): one more (raw copies one step ahead
    // of A) unless that fits fewer blocks on an SM.
    let best = |raw: &RawRow| {
        let with = |lead: usize| {
            let rs = 1 + (stages(bm) - 2 + lead).div_ceil(raw.rsteps);
            a_b + 2 * b_tile + rs * BROWS * raw.pitch + slack
        };
        if blocks(with(1)) >= blocks(with(0)) {
            with(1)
        } else {
            with(0)
        }
    };
    let (Some(r4), Some(r16)) = (raw_row(w, dtype, 4), raw_row(w, dtype, 16)) else {
        return a_b + stages(bm) * b_tile + slack;
    };
    // `TcTiles::AUX_WORD`: 16-byte scale/bias words for tiles of >= 128 rows
    // where they fit as many blocks an SM, else 4-byte words.
    if w.scales().is_some() && bm >= 128 && blocks(best(&r16)) >= blocks(best(&r4)) {
        best(&r16)
    } else {
        best(&r4)
    }
}

/// The tile row count for `m` rows spread over up to `n_experts` experts,
/// the output split into `col_blocks` column blocks of a tile each.
///
/// Several experts: the smallest of [`TILE_ROWS`] that holds an expert's
/// expected rows (`per = m / min(E, m)`) with a quarter to spare
/// (`per + per / 4`), so few rows per expert waste little of a tile and many
/// rows get large tiles. The spare quarter: routed rows scatter around
/// `per`, and a tile of exactly `per` rows gives about half of the experts a
/// second, nearly empty tile that decodes all of its weights again. H100,
/// qwen3-30b-a3b, tensor-core path, graph µs, the tile of `per` rows vs the
/// next larger one (`MOEKIT_TC_TILE_STEP=1`,
/// `bench/results/h100/tc/2026-11-24c_tile_step.md`): T = 256 (16 rows an
/// expert) affine4 463 → 414, q4_k 510 → 424, q8_0 644 → 527, bf16 528 →
/// 517; T = 512 (32) affine4 542 → 488, q4_k 574 → 487, q8_0 717 → 571,
/// bf16 540 → 539; T = 1024 (64) affine4 668 → 583, q8_0 807 → 674, q4_k
/// 681 → 709, bf16 571 → 584. 256-row tiles (one block an SM) only past 256
/// rows, where two 128-row tiles (two blocks an SM) measured faster for 3
/// of 4 formats (qwen3-30b-a3b T = 4096, 256 rows an expert, ms 128 vs 256:
/// affine4 1.35 vs 1.43, bf16 1.11 vs 1.43, q8_0 1.57 vs 1.56, q4_k 1.67 vs
/// 1.46; T = 2048, 128 rows an expert, stays at 128: 256 is slower for
/// every format).
///
/// One expert (the router, a shared expert): the smallest tile whose grid
/// stays within [`SINGLE_BLOCKS`] blocks, at most 128 rows. Large tiles there
/// left the GPU idle: the qwen3-30b-a3b router (N = 128, two column blocks)
/// ran 4 blocks at T = 512 and 32 at T = 4096 on 256-row tiles, 90 µs either
/// way under ncu (H100), more than the routed experts' down projection at
/// T = 512; small tiles re-read the weights once per tile from L2, which
/// the block bound keeps in check. It depends on shapes only.
pub fn tile_rows(m: usize, n_experts: usize, col_blocks: usize) -> usize {
    if n_experts <= 1 {
        return TILE_ROWS[..TILE_ROWS.len() - 1]
            .iter()
            .copied()
            .find(|&t| m.div_ceil(t).saturating_mul(col_blocks.max(1)) <= SINGLE_BLOCKS)
            .unwrap_or(REQUIRED_TILE);
    }
    let per = m.div_ceil(n_experts.clamp(1, m.max(1)));
    let largest = TILE_ROWS[TILE_ROWS.len() - 1];
    if per > largest {
        return largest;
    }
    let want = per + per / 4;
    TILE_ROWS
        .into_iter()
        .find(|&t| t >= want && t < largest)
        .unwrap_or(TILE_ROWS[TILE_ROWS.len() - 2])
}

/// Most blocks a single-expert GEMM's tile choice aims for: about two
/// waves of an H100's 132 SMs.
pub const SINGLE_BLOCKS: usize = 264;

/// The largest tile every launch may need (256-row tiles are optional: see
/// [`launch_tile_rows`]).
pub(crate) const REQUIRED_TILE: usize = 128;

/// The tile row count a launch uses on a device with `smem_optin` bytes of
/// shared memory a block: [`tile_rows`], stepped down to [`REQUIRED_TILE`]
/// where a 256-row tile of this format does not fit (an A100 allows 163 KB;
/// q6_K's 256-row tiles take 189 KB). [`supports`] checked the smaller ones.
pub fn launch_tile_rows(
    m: usize,
    n_experts: usize,
    col_blocks: usize,
    w: &QuantWeights,
    dtype: DType,
    smem_optin: usize,
) -> usize {
    let mut bm = tile_rows(m, n_experts, col_blocks);
    if n_experts > 1 {
        bm = step_tile(bm, tile_step());
    }
    if bm > REQUIRED_TILE && smem_bytes(w, dtype, bm) > smem_optin {
        REQUIRED_TILE
    } else {
        bm
    }
}

/// Steps [`tile_rows`]' choice for several experts by `MOEKIT_TC_TILE_STEP`
/// places in [`TILE_ROWS`] (−2..=2, read once; 0 by default). A tuning knob
/// for measuring the tile table: every tile gives the same bits per row.
fn tile_step() -> isize {
    static ENV: std::sync::OnceLock<isize> = std::sync::OnceLock::new();
    *ENV.get_or_init(|| super::env_knob("MOEKIT_TC_TILE_STEP", -2..=2, 0))
}

/// `bm` moved `step` places along [`TILE_ROWS`], clamped to the table.
fn step_tile(bm: usize, step: isize) -> usize {
    let at = TILE_ROWS.iter().position(|&t| t == bm).unwrap_or(0) as isize;
    TILE_ROWS[(at + step).clamp(0, TILE_ROWS.len() as isize - 1) as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tile_rows_follow_rows_per_expert() {
        // qwen3-30b-a3b (E = 128, k = 8): T = 1 → 8 rows over 8 experts.
        assert_eq!(tile_rows(8, 128, 12), 16);
        assert_eq!(tile_rows(64 * 8, 128, 12), 16);
        assert_eq!(tile_rows(128 * 8, 128, 12), 16);
        // 16, 32 and 64 rows an expert: the next tile up (a quarter spare).
        assert_eq!(tile_rows(256 * 8, 128, 12), 32);
        assert_eq!(tile_rows(512 * 8, 128, 12), 64);
        assert_eq!(tile_rows(1024 * 8, 128, 12), 128);
        assert_eq!(tile_rows(2048 * 8, 128, 12), 128);
        // qwen3-next (E = 512, k = 10): 10 and 80 rows an expert.
        assert_eq!(tile_rows(512 * 10, 512, 4), 16);
        assert_eq!(tile_rows(4096 * 10, 512, 4), 128);
        assert_eq!(tile_rows(4096 * 8, 128, 12), 128);
        assert_eq!(tile_rows(4097 * 8, 128, 1), 256);
        assert_eq!(tile_rows(0, 128, 12), 16);
        // A single expert (router, shared expert): the smallest tile whose
        // grid stays within SINGLE_BLOCKS, at most 128 rows.
        // qwen3-30b-a3b router (two column blocks): T = 512 and 4096.
        assert_eq!(tile_rows(512, 1, 2), 16);
        assert_eq!(tile_rows(4096, 1, 2), 32);
        assert_eq!(tile_rows(1, 1, 2), 16);
        assert_eq!(tile_rows(300, 1, 44), 64);
        assert_eq!(tile_rows(100_000, 1, 2), 128);
        assert_eq!(tile_rows(100_000, 1, 0), 128);
    }

    #[test]
    fn tile_steps_stay_in_the_table() {
        assert_eq!(step_tile(32, 1), 64);
        assert_eq!(step_tile(32, -1), 16);
        assert_eq!(step_tile(16, -2), 16);
        assert_eq!(step_tile(128, 2), 256);
        assert_eq!(step_tile(64, 0), 64);
    }

    #[test]
    fn tiles_step_down_where_256_rows_do_not_fit() {
        let a100 = 163 * 1024;
        let q6 = WeightFormat::Ggml(crate::format::GgmlType::Q6_K);
        let w =
            crate::format::random::random_weights(q6, 1, 8, 256, DType::F16, 1, &|| {}).unwrap();
        let m = 4097 * 8;
        assert_eq!(tile_rows(m, 128, 1), 256);
        assert!(smem_bytes(&w, DType::Bf16, 256) > a100);
        assert_eq!(launch_tile_rows(m, 128, 1, &w, DType::Bf16, a100), 128);
        assert_eq!(
            launch_tile_rows(m, 128, 1, &w, DType::Bf16, 227 * 1024),
            256
        );
        assert!(super::super::tc_gemm::supports(DType::Bf16, &w, a100).is_ok());
    }

    #[test]
    fn raw_copies_lead_only_where_occupancy_holds() {
        // affine4-g64 with f16 scales: below 128 rows, raw rows of 48 bytes
        // (32 of codes, 8 of scales, 8 of biases), 6 KB a stage.
        let f = WeightFormat::Affine(crate::format::AffineParams {
            bits: 4,
            group_size: 64,
        });
        let w = crate::format::random::random_weights(f, 1, 8, 256, DType::F16, 1, &|| {}).unwrap();
        // 32 rows: 4 raw stages (one step ahead), three blocks an SM.
        assert_eq!(
            smem_bytes(&w, DType::Bf16, 32),
            16384 + 32768 + 4 * 6144 + 1024
        );
        // 128 rows: scales and biases in 16-byte words (112-byte rows, 14 KB a
        // stage), where 3 raw stages would leave one block an SM; 2 keep two.
        assert_eq!(
            smem_bytes(&w, DType::Bf16, 128),
            49152 + 32768 + 2 * 14336 + 1024
        );
        // affine8-g64 at 128 rows: 16-byte words (144-byte rows) would leave
        // one block an SM, 4-byte ones (80-byte rows) keep two.
        let f8 = WeightFormat::Affine(crate::format::AffineParams {
            bits: 8,
            group_size: 64,
        });
        let w8 =
            crate::format::random::random_weights(f8, 1, 8, 256, DType::F16, 1, &|| {}).unwrap();
        assert_eq!(
            smem_bytes(&w8, DType::Bf16, 128),
            49152 + 32768 + 3 * 128 * 80 + 1024
        );
        // Dense f32 rows of 256 bytes (272 with the odd unit): 128 rows hold
        // one block an SM either way, so 3 raw stages, not 2.
        let f = WeightFormat::Dense(DType::F32);
        let w = crate::format::random::random_weights(f, 1, 8, 256, DType::F16, 1, &|| {}).unwrap();
        assert_eq!(
            smem_bytes(&w, DType::Bf16, 128),
            49152 + 32768 + 3 * 128 * 272 + 1024
        );
    }

    #[test]
    fn shared_memory_of_the_largest_instances_fits_sm90() {
        // Largest raw stages: q6_K (210-byte blocks) and dense f32 rows.
        let fmts = [
            WeightFormat::Ggml(crate::format::GgmlType::Q6_K),
            WeightFormat::Dense(DType::F32),
        ];
        for f in fmts {
            let w =
                crate::format::random::random_weights(f, 1, 8, 256, DType::F16, 1, &|| {}).unwrap();
            let s = smem_bytes(&w, DType::Bf16, TILE_ROWS[TILE_ROWS.len() - 1]);
            assert!(s <= 227 * 1024, "{f}: {s}");
        }
    }
}
