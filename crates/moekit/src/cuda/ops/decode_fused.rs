//! When one token's gate/up and down run as one launch
//! (`decode_fused_mma`, `kernels/decode_fused.cuh`): the conditions, in one
//! place, and the launch's dynamic shared memory (the block's down rows).

use std::sync::atomic::{AtomicU8, Ordering};

/// Words of the fused kernel's flags (`FUSED_FLAGS`): an arrival word per
/// grid row (`FUSED_ROWS`), the routing published, the blocks done. They
/// sit at the end of the device's tile tickets, past every tile ticket the
/// launch uses.
pub(super) const FUSED_FLAGS: usize = 66;
/// Grid rows the flags cover (`FUSED_ROWS`).
const FUSED_ROWS: usize = 64;
/// Dynamic shared memory a fused block may take for its down rows: two
/// blocks an SM must fit (with the 16 KiB reduction buffer and the routing
/// scratch) for the grid to run in one wave.
const FUSED_SMEM: usize = 80 * 1024;
/// Rows of one down tile (`MMA_TILE`).
const TILE: usize = 16;

thread_local! {
    /// Whether this thread's last decode call launched `decode_fused_mma`.
    static LAST: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Records whether this thread's decode call fused (for [`last_fused`]).
pub(super) fn note(fused: bool) {
    LAST.with(|c| c.set(fused));
}

/// Whether this thread's last decode call on the GPU ran gate/up and down
/// as one launch (tests check that the case they meant to cover did).
pub fn last_fused() -> bool {
    LAST.with(|c| c.get())
}

/// A test's choice (0: the knob decides, 1: off, 2: on where it applies).
static FORCED: AtomicU8 = AtomicU8::new(0);

/// Forces the fused launch off, or on wherever [`fused_smem`]'s conditions
/// hold (`None`: the `MOEKIT_DECODE_FUSED` knob decides), so that tests can
/// compare both in one process.
pub fn force_fused(on: Option<bool>) {
    FORCED.store(
        match on {
            None => 0,
            Some(false) => 1,
            Some(true) => 2,
        },
        Ordering::Relaxed,
    );
}

/// `MOEKIT_DECODE_FUSED=0|1` (read once; default off: measured no faster
/// than the two launches, bench/results/h200/2026-11-30_s27), unless a test
/// forces it.
fn knob() -> bool {
    match FORCED.load(Ordering::Relaxed) {
        1 => return false,
        2 => return true,
        _ => {}
    }
    static ENV: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *ENV.get_or_init(|| crate::cuda::ops::env_knob("MOEKIT_DECODE_FUSED", 0..=1, 0)) == 1
}

/// What decides whether a call fuses.
pub(super) struct FusedCase<'a> {
    /// Tokens, and whether the gate/up blocks route them (`fold_route`).
    pub t: usize,
    pub fold: bool,
    /// The rule selects its experts on the raw logits (`selects_on_logits`:
    /// the gate/up blocks run `select_expert`).
    pub selects_on_logits: bool,
    /// Compute capability major of the device.
    pub arch_major: u32,
    /// C++ types of gate/up's and down's format, and of the activations.
    pub gate_up_format: &'a str,
    pub down_format: &'a str,
    pub activation: &'a str,
    /// Bytes of one down row and of its scales (0 without), routed and (if
    /// any) shared, and down's longest K.
    pub down_row_bytes: &'a [(usize, usize)],
    pub down_k: usize,
    /// H, top-k, the grid (x blocks, rows) and the SM count.
    pub hidden: usize,
    pub top_k: usize,
    pub max_active: usize,
    pub grid: (usize, usize),
    pub sms: usize,
}

/// The fused launch's dynamic shared memory (bytes of the largest run of
/// down rows a block copies), or `None` where the two launches run:
/// - the knob is on, sm_90+ (bulk copies, mbarrier transaction counts);
/// - T = 1, folded routing by a rule that selects on the logits (each
///   block knows its expert alone; the k chosen experts are distinct, so
///   the grid's rows with down work are k, + the shared expert);
/// - gate/up and down in one format (one instance per format), whose
///   decoder reads plain loads (not dense weights of the activation type,
///   read through the read-only path);
/// - every block's copies in shared memory within [`FUSED_SMEM`]: its run
///   of down rows, their scales and biases (each copied from the 16-byte
///   word holding its first byte: up to 16 bytes more) and its token's act
///   row (`FusedSmem`);
/// - the grid fits the GPU at once at two blocks an SM (blocks wait on
///   each other), its rows the flags, and H's tiles the tile tickets below
///   the flags.
pub(super) fn fused_smem(c: &FusedCase) -> Option<usize> {
    let dense_of_t = c.gate_up_format == format!("moekit::FmtDense<{}>", c.activation);
    let tiles = c.hidden.div_ceil(TILE);
    let run = tiles.div_ceil(c.grid.0.max(1)) * TILE;
    let row = c.down_row_bytes.iter().map(|r| r.0).max().unwrap_or(0);
    let aux = c.down_row_bytes.iter().map(|r| r.1).max().unwrap_or(0);
    let room = |n: usize| (n + 31) / 16 * 16;
    let smem = room(run * row) + if aux > 0 { 2 * room(run * aux) } else { 0 } + c.down_k * 2;
    let ok = knob()
        && c.arch_major >= 9
        && c.t == 1
        && c.fold
        && c.selects_on_logits
        && c.max_active == c.top_k
        && c.gate_up_format == c.down_format
        && !dense_of_t
        && row > 0
        && smem <= FUSED_SMEM
        && c.grid.0 * c.grid.1 <= 2 * c.sms
        && c.grid.1 <= FUSED_ROWS
        && tiles + FUSED_FLAGS <= crate::cuda::TILE_TICKETS;
    ok.then_some(smem)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qwen3<'a>(rows: &'a [(usize, usize)]) -> FusedCase<'a> {
        FusedCase {
            t: 1,
            fold: true,
            selects_on_logits: true,
            arch_major: 9,
            gate_up_format: "moekit::FmtAffine<4, __half>",
            down_format: "moekit::FmtAffine<4, __half>",
            activation: "__nv_bfloat16",
            down_row_bytes: rows,
            down_k: 768,
            hidden: 2048,
            top_k: 8,
            max_active: 8,
            grid: (24, 10),
            sms: 132,
        }
    }

    #[test]
    fn fuses_qwen3_affine4_and_names_each_refusal() {
        force_fused(Some(true));
        let rows = [(384, 24)];
        // 128 tiles over 24 blocks: runs of 6 tiles, 96 rows of 384 bytes
        // and of 24 bytes of scales and of biases (each + 16: a copy starts
        // at the word holding its first byte), then 768 bf16 of act.
        let aff = (96 * 384 + 16) + 2 * (96 * 24 + 16) + 768 * 2;
        assert_eq!(fused_smem(&qwen3(&rows)), Some(aff));
        // Q6_K rows (630 bytes: not whole words, no scale tensors) fuse too.
        assert_eq!(
            fused_smem(&qwen3(&[(630, 0)])),
            Some(96 * 630 + 16 + 768 * 2)
        );
        let refused: Vec<(&str, FusedCase)> = vec![
            (
                "T = 2",
                FusedCase {
                    t: 2,
                    ..qwen3(&rows)
                },
            ),
            (
                "no fold",
                FusedCase {
                    fold: false,
                    ..qwen3(&rows)
                },
            ),
            (
                "grouped rule",
                FusedCase {
                    selects_on_logits: false,
                    ..qwen3(&rows)
                },
            ),
            (
                "sm_80",
                FusedCase {
                    arch_major: 8,
                    ..qwen3(&rows)
                },
            ),
            (
                "mixed formats",
                FusedCase {
                    down_format: "moekit::FmtQ6_K",
                    ..qwen3(&rows)
                },
            ),
            (
                "dense of T",
                FusedCase {
                    gate_up_format: "moekit::FmtDense<__nv_bfloat16>",
                    down_format: "moekit::FmtDense<__nv_bfloat16>",
                    ..qwen3(&rows)
                },
            ),
            (
                "two waves",
                FusedCase {
                    grid: (24, 12),
                    ..qwen3(&rows)
                },
            ),
            (
                "fewer experts than k",
                FusedCase {
                    max_active: 4,
                    ..qwen3(&rows)
                },
            ),
        ];
        for (why, c) in &refused {
            assert_eq!(fused_smem(c), None, "{why}");
        }
        // Too many bytes a block.
        assert_eq!(
            fused_smem(&qwen3(&[(1536, 0)])),
            None,
            "f16 down rows: 144 KiB a block"
        );
        force_fused(Some(false));
        assert_eq!(fused_smem(&qwen3(&rows)), None, "forced off");
        force_fused(None);
    }
}
