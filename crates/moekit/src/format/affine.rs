//! MLX affine quantization. (STUB — being implemented; signatures are the contract.)

use crate::dtype::Float;
use crate::error::{ensure, unsupported, Result};

/// Bit widths `mx.quantize` supports.
pub const SUPPORTED_BITS: [u32; 6] = [2, 3, 4, 5, 6, 8];
/// Group sizes supported.
pub const SUPPORTED_GROUP_SIZES: [usize; 3] = [32, 64, 128];

/// Checks bits and group size.
pub fn check_params(op: &'static str, bits: u32, group_size: usize) -> Result<()> {
    ensure(SUPPORTED_BITS.contains(&bits), op, "bits", "2, 3, 4, 5, 6 or 8", bits)?;
    ensure(SUPPORTED_GROUP_SIZES.contains(&group_size), op, "group_size", "32, 64 or 128", group_size)
}

/// Output of [`quantize`]: packed words `[rows, cols·bits/32]`, scales and biases `[rows, cols/group_size]`.
#[derive(Debug, Clone, PartialEq)]
pub struct AffineQuantized<S> {
    /// Packed codes.
    pub packed: Vec<u32>,
    /// Per-group scales.
    pub scales: Vec<S>,
    /// Per-group biases.
    pub biases: Vec<S>,
}

/// Quantizes a row-major `[rows, cols]` matrix exactly as `mx.quantize` does.
pub fn quantize<S: Float>(_w: &[f32], _rows: usize, _cols: usize, _bits: u32, _group_size: usize) -> Result<AffineQuantized<S>> {
    Err(unsupported("affine::quantize", "not implemented yet"))
}

/// Dequantizes one packed row: `out[k] = scale[g]·q[k] + bias[g]`.
pub fn dequantize_row<S: Float>(_bits: u32, _group_size: usize, _packed: &[u32], _scales: &[S], _biases: &[S], _out: &mut [f32]) -> Result<()> {
    Err(unsupported("affine::dequantize_row", "not implemented yet"))
}

/// Dequantizes one row of mlx-native's unpacked layout (one `u8` code per weight).
pub fn dequantize_u8_row(_group_size: usize, _codes: &[u8], _scales: &[f32], _biases: &[f32], _out: &mut [f32]) -> Result<()> {
    Err(unsupported("affine::dequantize_u8_row", "not implemented yet"))
}
