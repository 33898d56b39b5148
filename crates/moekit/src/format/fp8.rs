//! FP8 block-scaled weights: the official Hugging Face checkpoints of
//! DeepSeek-V3 / R1, Kimi-K2, MiniMax-M2 and the Qwen3 `-FP8` models
//! (`quantization_config: {quant_method: "fp8", fmt: "e4m3",
//! weight_block_size: [128, 128]}`).
//!
//! **In the checkpoint** a linear weight `X.weight` `[N, K]` is stored as
//! OCP e4m3fn bytes (safetensors `F8_E4M3`) and `X.weight_scale_inv`
//! `f32 [⌈N/bn⌉, ⌈K/bk⌉]` holds one scale per `bn × bk` block (the last
//! block of a row or column may be partial); the weight is
//!
//! ```text
//! w[n, k] = e4m3(weight[n, k]) · weight_scale_inv[n / bn, k / bk]
//! ```
//!
//! one f32 product (DeepSeek's `weight_dequant`, transformers'
//! `FP8Linear`, mlx-lm's `sanitize`: the blocks of the ragged edge are
//! the padded blocks cut back).
//!
//! **In moekit** ([`WeightFormat::Fp8Block`](super::WeightFormat::Fp8Block)
//! `{ block_k }`, name `fp8-b<block_k>`) the codes stay as they are,
//! `u8 [E, N, K]`, and the block scales are expanded **per row** at load:
//! `scales` `f32 [E, N, K/block_k]`, row `n`'s scale of column group `j`
//! being `weight_scale_inv[n / bn, j·block_k / bk]` ([`expand_scales`]).
//! That is the per-row group-scale layout the affine formats use, so every
//! kernel (the CPU dot, the CUDA decoders that index a row's scales by
//! `k >> group_shift`) takes it unchanged; it costs 4 bytes per `block_k`
//! weights (3.1 % of the codes at 128) where the block form would cost
//! `4/bn` bytes per 128 — an extra 3 % of the bytes a token reads, for
//! no special case in any kernel. `block_k` is the checkpoint's `bk`
//! (128) when `K` is a multiple of it (every released checkpoint: K =
//! 7168, 2048, 3072, 1536, …); for a `K` with a partial last column block
//! it is the largest of 128, 64, 32 dividing both `K` and `bk`
//! ([`row_group`]), each group still inside one checkpoint block. `K` must
//! be a multiple of 32 (the CUDA decoders read 32 codes at a time).
//!
//! e4m3 is [`e4m3_to_f32`] (OCP e4m3fn, as `mx.from_fp8` and
//! `torch.float8_e4m3fn`: no infinities, 0x7F and 0xFF are NaN).

use super::mlxfp::{e4m3_to_f32, E4M3};
use crate::error::{invalid, Result};

/// The per-row group sizes moekit stores (`fp8-b32`, `fp8-b64`, `fp8-b128`).
pub const BLOCK_KS: [usize; 3] = [32, 64, 128];

/// Checks a `block_k` of [`WeightFormat::Fp8Block`](super::WeightFormat::Fp8Block).
pub fn check_block_k(op: &'static str, block_k: usize) -> Result<()> {
    if BLOCK_KS.contains(&block_k) {
        Ok(())
    } else {
        Err(invalid(op, "block_k", "32, 64 or 128", block_k))
    }
}

/// The per-row group size for a checkpoint block width `bk` and `cols`
/// input columns: the largest of 128, 64, 32 that divides both (so each
/// group lies in one checkpoint block); `None` if none does.
pub fn row_group(cols: usize, bk: usize) -> Option<usize> {
    BLOCK_KS
        .into_iter()
        .rev()
        .find(|&g| cols > 0 && cols.is_multiple_of(g) && bk > 0 && bk.is_multiple_of(g))
}

/// Expands checkpoint block scales `scale_inv` (`[⌈rows/bn⌉, ⌈cols/bk⌉]`,
/// row-major) to per-row group scales `[rows, cols/group]`; `group` must
/// divide `cols` and `bk` ([`row_group`]).
pub fn expand_scales(
    scale_inv: &[f32],
    rows: usize,
    cols: usize,
    (bn, bk): (usize, usize),
    group: usize,
) -> Result<Vec<f32>> {
    const OP: &str = "fp8::expand_scales";
    if bn == 0 || bk == 0 || group == 0 || !cols.is_multiple_of(group) || !bk.is_multiple_of(group)
    {
        return Err(invalid(
            OP,
            "block, group",
            format!("a group dividing K = {cols} and the block width"),
            format!("block [{bn}, {bk}], group {group}"),
        ));
    }
    let (rb, cb) = (rows.div_ceil(bn), cols.div_ceil(bk));
    let want = rb.checked_mul(cb);
    if want != Some(scale_inv.len()) {
        return Err(invalid(
            OP,
            "scale_inv",
            format!("[{rb}, {cb}] values for [{rows}, {cols}] in blocks [{bn}, {bk}]"),
            scale_inv.len(),
        ));
    }
    let per_row = cols / group;
    let mut out = Vec::new();
    out.try_reserve_exact(rows.saturating_mul(per_row))
        .map_err(|_| invalid(OP, "rows", "scales that fit in memory", rows))?;
    for n in 0..rows {
        let srow = &scale_inv[n / bn * cb..(n / bn + 1) * cb];
        out.extend((0..per_row).map(|j| srow[j * group / bk]));
    }
    Ok(out)
}

/// Dequantizes one row: `codes` (`K` e4m3 bytes) and `scales` (`K/group`)
/// into `out` (`K`): `e4m3(code) · scale`, one f32 product.
pub fn dequantize_row(group: usize, codes: &[u8], scales: &[f32], out: &mut [f32]) -> Result<()> {
    const OP: &str = "fp8::dequantize_row";
    let k = out.len();
    if group == 0 || !k.is_multiple_of(group) {
        return Err(invalid(
            OP,
            "out",
            format!("a multiple of {group} values"),
            k,
        ));
    }
    if codes.len() != k {
        return Err(invalid(OP, "codes", format!("{k} bytes"), codes.len()));
    }
    if scales.len() != k / group {
        return Err(invalid(
            OP,
            "scales",
            format!("{} values for K = {k}", k / group),
            scales.len(),
        ));
    }
    let table = &*E4M3;
    let groups = out.chunks_exact_mut(group).zip(codes.chunks_exact(group));
    for ((o, c), &s) in groups.zip(scales) {
        for (v, &b) in o.iter_mut().zip(c) {
            *v = table[usize::from(b)] * s;
        }
    }
    Ok(())
}

/// The value of an e4m3fn byte (re-exported from [`super::mlxfp`]).
#[inline(always)]
pub fn value(b: u8) -> f32 {
    e4m3_to_f32(b)
}

/// Random codes (no NaN bytes: 0x7F/0xFF become 0x7E/0xFE, ±448) and
/// scales of 2^-14 .. 2^-12 (weights of O(0.01 – 0.1), like a checkpoint's
/// `amax / 448`).
pub fn fill_random(codes: &mut [u8], scales: &mut [u8], rng: &mut impl rand::Rng) {
    rng.fill_bytes(codes);
    for b in codes.iter_mut().filter(|b| **b & 0x7F == 0x7F) {
        *b ^= 1;
    }
    for s in scales.chunks_exact_mut(4) {
        let v = f32::from_bits((113 << 23) | (rng.random::<u32>() >> 8)) * 2.0;
        s.copy_from_slice(&v.to_le_bytes());
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn row_groups() {
        assert_eq!(row_group(7168, 128), Some(128));
        assert_eq!(row_group(160, 128), Some(32));
        assert_eq!(row_group(192, 128), Some(64));
        assert_eq!(row_group(96, 96), Some(32));
        assert_eq!(row_group(100, 128), None);
        assert_eq!(row_group(0, 128), None);
        assert_eq!(row_group(128, 0), None);
    }

    #[test]
    fn expansion_follows_the_blocks_with_ragged_edges() {
        // rows 3 in blocks of 2 (2 row blocks), cols 96 in blocks of 64 (2).
        let s = [1.0, 2.0, 3.0, 4.0];
        let e = expand_scales(&s, 3, 96, (2, 64), 32).unwrap();
        assert_eq!(e, [1.0, 1.0, 2.0, 1.0, 1.0, 2.0, 3.0, 3.0, 4.0]);
        assert!(expand_scales(&s[..3], 3, 96, (2, 64), 32).is_err());
        assert!(expand_scales(&s, 3, 96, (2, 64), 64).is_err());
        assert!(expand_scales(&s, 3, 96, (0, 64), 32).is_err());
    }

    #[test]
    fn dequantize_row_is_one_product() {
        let codes: Vec<u8> = (0..64).map(|i| (i * 4 + 1) as u8).collect();
        let scales = [0.5f32, 3.0e-3];
        let mut out = [0f32; 64];
        dequantize_row(32, &codes, &scales, &mut out).unwrap();
        for (k, &o) in out.iter().enumerate() {
            let want = e4m3_to_f32(codes[k]) * scales[k / 32];
            assert_eq!(o.to_bits(), want.to_bits(), "{k}");
        }
        assert!(dequantize_row(32, &codes[..63], &scales, &mut out).is_err());
        assert!(dequantize_row(32, &codes, &scales[..1], &mut out).is_err());
        assert!(dequantize_row(0, &codes, &scales, &mut out).is_err());
    }
}
