//! FP8 block-scaled modules (`quant_method: "fp8"`): `<module>.weight`
//! `F8_E4M3 [N, K]` plus `<module>.weight_scale_inv` `[⌈N/bn⌉, ⌈K/bk⌉]`
//! (f32; bf16/f16 are widened exactly), read as
//! [`WeightFormat::Fp8Block`]: the codes as they are, the block scales
//! expanded per row ([`crate::format::fp8`]).

use super::layout::{Keys, Part};
use super::SafetensorsCheckpoint;
use crate::dtype::DType;
use crate::error::{unsupported, Result};
use crate::format::{fp8, WeightFormat};
use crate::tensor::Tensor;
use ::safetensors::Dtype;

/// How a module's scales are read: the checkpoint's block and the
/// module's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Fp8Part {
    pub block: (usize, usize),
    pub rows: usize,
    pub cols: usize,
    pub group: usize,
}

/// The FP8 part of `module` (`rows × cols`), `None` if the module is not
/// FP8 (no `weight_scale_inv`, weight not `F8_E4M3`); errors for a
/// half-FP8 module or any shape or dtype that does not fit.
pub(super) fn part(
    ck: &SafetensorsCheckpoint,
    module: &str,
    stacked: bool,
    rows: usize,
    cols: usize,
    keys: &Keys,
) -> Result<Option<Part>> {
    let wname = format!("{module}.weight");
    let sname = format!("{module}.weight_scale_inv");
    let w_f8 = ck.get(&wname).is_some_and(|r| r.dtype == Dtype::F8_E4M3);
    let Some(sref) = ck.get(&sname) else {
        if w_f8 {
            return Err(ck.bad(
                &wname,
                format!("F8_E4M3 without its block scales `{sname}` (moekit reads FP8 weights with block scales only)"),
            ));
        }
        return Ok(None);
    };
    let cfg_json = ck.dir.join("config.json");
    let Some(cfg) = ck.cfg.quant.fp8 else {
        return Err(ck.bad(
            &sname,
            format!(
                "present, but {} has no `quantization_config` with `quant_method` = \"fp8\"",
                cfg_json.display()
            ),
        ));
    };
    let (wd, wshape) = {
        let r = ck
            .get(&wname)
            .ok_or_else(|| ck.missing(&wname, &format!("`{sname}` exists")))?;
        (r.dtype, r.shape.clone())
    };
    if wd != Dtype::F8_E4M3 {
        return Err(ck.bad(
            &wname,
            format!("dtype {wd}, expected F8_E4M3 (`{sname}` exists)"),
        ));
    }
    if stacked {
        return Err(unsupported(
            "moe_block",
            format!(
                "{}: `{sname}`: FP8 block scales of stacked experts (only the Hugging Face per-expert layout is read)",
                ck.file_of(&sname).display()
            ),
        ));
    }
    let dims = format!(
        "rows {} = {rows}, columns {} = {cols} in {}",
        keys.rows,
        keys.cols,
        cfg_json.display()
    );
    if wshape != [rows, cols] {
        return Err(ck.bad(
            &wname,
            format!("F8_E4M3 {wshape:?}, expected [{rows}, {cols}] ({dims})"),
        ));
    }
    let (bn, bk) = cfg.block;
    let want = [rows.div_ceil(bn), cols.div_ceil(bk)];
    let sd = sref.dtype;
    if sref.shape != want || !matches!(sd, Dtype::F32 | Dtype::BF16 | Dtype::F16) {
        return Err(ck.bad(
            &sname,
            format!(
                "{sd} {:?}, expected f32 {want:?}: [⌈{rows}/{bn}⌉, ⌈{cols}/{bk}⌉] for weight [{rows}, {cols}] in blocks `quantization_config.weight_block_size` = [{bn}, {bk}]",
                sref.shape
            ),
        ));
    }
    let Some(group) = fp8::row_group(cols, bk) else {
        return Err(unsupported(
            "moe_block",
            format!(
                "{}: `{wname}`: {cols} columns in blocks of {bk} (moekit needs K and the block width to share a multiple of 32)",
                ck.file_of(&wname).display()
            ),
        ));
    };
    let format = WeightFormat::Fp8Block { block_k: group };
    Ok(Some(Part {
        format,
        names: vec![wname, sname],
        specs: vec![
            (DType::U8, vec![rows, cols]),
            (DType::F32, vec![rows, cols / group]),
        ],
        fp8: Some(Fp8Part {
            block: cfg.block,
            rows,
            cols,
            group,
        }),
        global_scale: None,
    }))
}

/// The module's scales expanded per row: `f32 [rows, cols/group]`.
pub(super) fn scales(ck: &SafetensorsCheckpoint, name: &str, p: &Fp8Part) -> Result<Vec<f32>> {
    let s = ck.load(name)?.to_f32_vec().map_err(|e| ck.bad(name, e))?;
    fp8::expand_scales(&s, p.rows, p.cols, p.block, p.group).map_err(|e| ck.bad(name, e))
}

/// [`scales`] as a tensor.
pub(super) fn scales_tensor(ck: &SafetensorsCheckpoint, name: &str, p: &Fp8Part) -> Result<Tensor> {
    Tensor::from_slice(&scales(ck, name, p)?, &[p.rows, p.cols / p.group])
}
