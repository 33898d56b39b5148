//! Hugging Face experts stored other than one matrix per expert and
//! projection: fused gate+up `[E, 2I, H]` (Qwen3.5, Granite, Gemma-4),
//! transposed `[E, H, 2I]` / `[E, I, H]` (Llama-4), and OpenAI's MXFP4
//! `*_blocks` / `*_scales` with gate and up rows interleaved (gpt-oss).

use super::layout::Keys;
use super::SafetensorsCheckpoint;
use crate::dtype::DType;
use crate::error::Result;
use crate::format::{QuantWeights, WeightFormat};
use crate::tensor::{Bytes, Tensor};

/// The dtype of `name`, checked to be a float `[E, rows, cols]`; `why`
/// explains the expected shape in the error.
fn float_tensor(
    ck: &SafetensorsCheckpoint,
    name: &str,
    [e, rows, cols]: [usize; 3],
    why: impl FnOnce() -> String,
) -> Result<DType> {
    let (d, got) = ck.info(name)?;
    if !d.is_float() || got != [e, rows, cols] {
        return Err(ck.bad(
            name,
            format!(
                "{d} {got:?}, expected a float [{e}, {rows}, {cols}] ({})",
                why()
            ),
        ));
    }
    Ok(d)
}

/// A Hugging Face fused expert tensor `name` (a float `[E, rows, cols]`,
/// stored as it is: these files are not mlx-quantized).
pub(super) fn fused_dense(
    ck: &SafetensorsCheckpoint,
    name: &str,
    [e, rows, cols]: [usize; 3],
    k: &Keys,
) -> Result<QuantWeights> {
    let d = float_tensor(ck, name, [e, rows, cols], || {
        format!(
            "experts `{}` = {e}, rows {} = {rows}, columns {} = {cols} in {}",
            ck.cfg.keys.experts,
            k.rows,
            k.cols,
            ck.dir.join("config.json").display()
        )
    })?;
    QuantWeights::new(
        WeightFormat::Dense(d),
        e,
        rows,
        cols,
        ck.load(name)?,
        None,
        None,
    )
    .map_err(|err| ck.bad(name, err))
}

/// How the columns of a transposed tensor are split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Columns {
    /// One matrix (down).
    Whole,
    /// Gate columns, then up columns (Llama-4).
    Halves,
    /// Gate and up columns interleaved, gate first (gpt-oss).
    Interleaved,
}

/// Hugging Face transposed experts: `name` a float `[E, a, b]`, read once;
/// returns its columns as matrices `[E, n, a]` (transposed, copied): the
/// whole tensor (n = b), or gate and up (n = b / 2) as `columns` says.
pub(super) fn transposed_dense(
    ck: &SafetensorsCheckpoint,
    name: &str,
    [e, a, b]: [usize; 3],
    columns: Columns,
) -> Result<Vec<QuantWeights>> {
    let d = float_tensor(ck, name, [e, a, b], || {
        format!(
            "`{}` = {e}; Hugging Face stores these experts transposed",
            ck.cfg.keys.experts
        )
    })?;
    let src = ck.raw(name)?;
    let sz = d.size();
    if src.len() != e * a * b * sz {
        return Err(ck.bad(
            name,
            format!("{} bytes for {e}·{a}·{b} values of {d}", src.len()),
        ));
    }
    // Part p's column r is stored column col0(p) + r · stride.
    let (parts, n, stride) = match columns {
        Columns::Whole => (1, b, 1),
        Columns::Halves => (2, b / 2, 1),
        Columns::Interleaved => (2, b / 2, 2),
    };
    (0..parts)
        .map(|part| {
            let col0 = if columns == Columns::Halves {
                part * n
            } else {
                part
            };
            // Written in place: one allocation, no second copy.
            let mut bytes = Bytes::zeroed(e * n * a * sz);
            let out = bytes.make_mut();
            for x in 0..e {
                for r in 0..n {
                    for c in 0..a {
                        let from = ((x * a + c) * b + col0 + r * stride) * sz;
                        let to = ((x * n + r) * a + c) * sz;
                        out[to..to + sz].copy_from_slice(&src[from..from + sz]);
                    }
                }
            }
            let data = Tensor::from_bytes(d, &[e, n, a], bytes)?;
            QuantWeights::new(WeightFormat::Dense(d), e, n, a, data, None, None)
                .map_err(|err| ck.bad(name, err))
        })
        .collect()
}

/// `{name}_blocks` (u8 `[E, rows, cols / 32, 16]`) and `{name}_scales` (u8
/// `[E, rows, cols / 32]`): MXFP4 as OpenAI stores it, the bytes of MLX's
/// `mode="mxfp4"` (mlx-lm views the blocks as uint32). With `interleaved`,
/// rows `2n` and `2n + 1` are gate and up row `n` (`rows` = 2I): returns
/// [gate, up]; else [the matrix].
pub(super) fn mxfp4_blocks(
    ck: &SafetensorsCheckpoint,
    name: &str,
    [e, rows, cols]: [usize; 3],
    interleaved: bool,
) -> Result<Vec<QuantWeights>> {
    let (bn, sn) = (format!("{name}_blocks"), format!("{name}_scales"));
    for (t, want) in [
        (&bn, vec![e, rows, cols / 32, 16]),
        (&sn, vec![e, rows, cols / 32]),
    ] {
        let (d, got) = ck.info(t)?;
        if d != DType::U8 || got != want.as_slice() || cols % 32 != 0 {
            return Err(ck.bad(
                t,
                format!("{d} {got:?}, expected u8 {want:?} (MXFP4 of {e} experts × {rows} rows × {cols} columns)"),
            ));
        }
    }
    let (blocks, scales) = (ck.load(&bn)?, ck.load(&sn)?);
    let (bb, sb) = (blocks.bytes()?, scales.bytes()?);
    let (row_b, row_s) = (cols / 2, cols / 32);
    let parts = if interleaved { 2 } else { 1 };
    let n = rows / parts;
    (0..parts)
        .map(|which| {
            let pick = |src: &[u8], per: usize| {
                // Row `r` of part `which` goes to the part's next row (e·n of
                // them: `rows` is 2I when interleaved). `per` is 0 only when
                // there are no bytes, and then no chunk is written.
                let mut v = Bytes::zeroed(e * n * per);
                let rows_out = v.make_mut().chunks_exact_mut(per.max(1));
                for (o, r) in rows_out.zip((0..e * rows).filter(|r| r % parts == which)) {
                    o.copy_from_slice(&src[r * per..(r + 1) * per]);
                }
                v
            };
            let data = Tensor::from_bytes(DType::U32, &[e, n, cols / 8], pick(bb, row_b))?;
            let sc = Tensor::from_bytes(DType::U8, &[e, n, row_s], pick(sb, row_s))?;
            let f = WeightFormat::MlxFp(crate::format::MlxFpMode::Mxfp4);
            QuantWeights::new(f, e, n, cols, data, Some(sc), None).map_err(|err| ck.bad(&bn, err))
        })
        .collect()
}
