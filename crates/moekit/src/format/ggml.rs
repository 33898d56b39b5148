//! GGUF block quantization. (STUB — being implemented; signatures are the contract.)

use crate::error::{unsupported, Result};

/// GGML block types moekit supports.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    /// 32 weights, f16 d, 4-bit.
    Q4_0,
    /// 32 weights, f16 d and m, 4-bit.
    Q4_1,
    /// 32 weights, f16 d, 5-bit.
    Q5_0,
    /// 32 weights, f16 d and m, 5-bit.
    Q5_1,
    /// 32 weights, f16 d, 8-bit.
    Q8_0,
    /// K-quant super-block of 256, 2-bit.
    Q2_K,
    /// K-quant super-block of 256, 3-bit.
    Q3_K,
    /// K-quant super-block of 256, 4-bit.
    Q4_K,
    /// K-quant super-block of 256, 5-bit.
    Q5_K,
    /// K-quant super-block of 256, 6-bit.
    Q6_K,
}

impl GgmlType {
    /// Every supported type.
    pub const ALL: [GgmlType; 10] = [
        GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
        GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K,
    ];
    /// Weights per block.
    pub const fn block_size(self) -> usize {
        match self {
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0 => 32,
            _ => 256,
        }
    }
    /// Bytes per block.
    pub const fn type_size(self) -> usize {
        match self {
            GgmlType::Q4_0 => 18,
            GgmlType::Q4_1 => 20,
            GgmlType::Q5_0 => 22,
            GgmlType::Q5_1 => 24,
            GgmlType::Q8_0 => 34,
            GgmlType::Q2_K => 84,
            GgmlType::Q3_K => 110,
            GgmlType::Q4_K => 144,
            GgmlType::Q5_K => 176,
            GgmlType::Q6_K => 210,
        }
    }
    /// Lower-case name (`q4_0`, `q4_k`).
    pub const fn name(self) -> &'static str {
        match self {
            GgmlType::Q4_0 => "q4_0",
            GgmlType::Q4_1 => "q4_1",
            GgmlType::Q5_0 => "q5_0",
            GgmlType::Q5_1 => "q5_1",
            GgmlType::Q8_0 => "q8_0",
            GgmlType::Q2_K => "q2_k",
            GgmlType::Q3_K => "q3_k",
            GgmlType::Q4_K => "q4_k",
            GgmlType::Q5_K => "q5_k",
            GgmlType::Q6_K => "q6_k",
        }
    }
    /// Parses a name (case-insensitive).
    pub fn parse(s: &str) -> Option<GgmlType> {
        GgmlType::ALL.into_iter().find(|t| t.name().eq_ignore_ascii_case(s))
    }
}

/// Dequantizes one row of whole blocks: `bytes.len() == out.len()/block_size·type_size`.
pub fn dequantize_row(_ty: GgmlType, _bytes: &[u8], _out: &mut [f32]) -> Result<()> {
    Err(unsupported("ggml::dequantize_row", "not implemented yet"))
}
