//! Element types of tensors.

use half::{bf16, f16};
use std::fmt;

/// The element type of a [`Tensor`](crate::Tensor).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16.
    Bf16,
    /// Unsigned byte (packed quantized data, GGUF blocks).
    U8,
    /// Unsigned 32-bit integer (expert ids, offsets, MLX packed weights).
    U32,
    /// Signed 32-bit integer.
    I32,
}

impl DType {
    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DType::F16 | DType::Bf16 => 2,
            DType::U8 => 1,
            DType::F32 | DType::U32 | DType::I32 => 4,
        }
    }

    /// Whether this is one of the float activation types (f32, f16, bf16).
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::Bf16)
    }

    /// Lower-case name, as used on the command line (`f32`, `bf16`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
            DType::U8 => "u8",
            DType::U32 => "u32",
            DType::I32 => "i32",
        }
    }

    /// Parses a name produced by [`DType::name`].
    pub fn parse(s: &str) -> Option<DType> {
        Some(match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" => DType::F32,
            "f16" | "float16" => DType::F16,
            "bf16" | "bfloat16" => DType::Bf16,
            "u8" | "uint8" => DType::U8,
            "u32" | "uint32" => DType::U32,
            "i32" | "int32" => DType::I32,
            _ => return None,
        })
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust type that is the element of some [`DType`].
pub trait Element: bytemuck::Pod + Send + Sync + 'static {
    /// The matching dtype.
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $d:ident),*) => { $(impl Element for $t { const DTYPE: DType = DType::$d; })* };
}
element!(f32 => F32, f16 => F16, bf16 => Bf16, u8 => U8, u32 => U32, i32 => I32);

/// A float activation type: computed in f32, stored as itself.
pub trait Float: Element + Copy + Default {
    /// Widen to f32 (exact).
    fn to_f32(self) -> f32;
    /// Round from f32 (round-to-nearest-even).
    fn from_f32(v: f32) -> Self;
}

impl Float for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
}
impl Float for f16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
}
impl Float for bf16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
}
