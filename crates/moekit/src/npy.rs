//! Minimal `.npy` (NumPy format v1/v2/v3) reading and writing, C order, little-endian.
//!
//! Used for the CLI's `--input`/`--output` and for the committed test fixtures.
//! bfloat16, which NumPy lacks, travels as `<u2` raw bits ([`NpyArray::to_f32`]
//! does not guess: call [`NpyArray::bf16_bits_to_f32`]).

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use half::{bf16, f16};
use std::path::Path;

/// Element type of an `.npy` array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NpyDType {
    /// `<f4`
    F32,
    /// `<f2`
    F16,
    /// `<f8`
    F64,
    /// `|u1`
    U8,
    /// `<u2` (also bf16 bits)
    U16,
    /// `<u4`
    U32,
    /// `<i4`
    I32,
    /// `<i8`
    I64,
}

impl NpyDType {
    fn size(self) -> usize {
        match self {
            NpyDType::U8 => 1,
            NpyDType::F16 | NpyDType::U16 => 2,
            NpyDType::F32 | NpyDType::U32 | NpyDType::I32 => 4,
            NpyDType::F64 | NpyDType::I64 => 8,
        }
    }
    fn descr(self) -> &'static str {
        match self {
            NpyDType::F32 => "<f4",
            NpyDType::F16 => "<f2",
            NpyDType::F64 => "<f8",
            NpyDType::U8 => "|u1",
            NpyDType::U16 => "<u2",
            NpyDType::U32 => "<u4",
            NpyDType::I32 => "<i4",
            NpyDType::I64 => "<i8",
        }
    }
    fn from_descr(d: &str) -> Option<NpyDType> {
        Some(match d {
            "<f4" => NpyDType::F32,
            "<f2" => NpyDType::F16,
            "<f8" => NpyDType::F64,
            "|u1" | "<u1" => NpyDType::U8,
            "<u2" => NpyDType::U16,
            "<u4" => NpyDType::U32,
            "<i4" => NpyDType::I32,
            "<i8" => NpyDType::I64,
            _ => return None,
        })
    }
}

/// A parsed `.npy` array.
#[derive(Debug, Clone)]
pub struct NpyArray {
    /// Element type.
    pub dtype: NpyDType,
    /// Shape (C order).
    pub shape: Vec<usize>,
    /// Raw little-endian element bytes.
    pub data: Vec<u8>,
}

fn bad(path: &Path, msg: impl Into<String>) -> Error {
    Error::BadFile {
        path: path.to_path_buf(),
        msg: msg.into(),
    }
}

/// Extracts the value text after `'key':` in a header dict.
fn header_field<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    let pos = header.find(&format!("'{key}'"))?;
    let rest = header[pos + key.len() + 2..].trim_start();
    rest.strip_prefix(':').map(str::trim_start)
}

impl NpyArray {
    /// Parses `.npy` bytes; `path` names the file in errors.
    pub fn parse(bytes: &[u8], path: &Path) -> Result<NpyArray> {
        if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
            return Err(bad(path, "not an .npy file (bad magic)"));
        }
        let (hlen, hstart) = match bytes[6] {
            1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10usize),
            2 | 3 if bytes.len() >= 12 => (
                u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
                12,
            ),
            v => return Err(bad(path, format!("unsupported .npy version {v}"))),
        };
        let header = bytes
            .get(hstart..hstart.saturating_add(hlen))
            .ok_or_else(|| bad(path, "truncated .npy header"))?;
        let header = std::str::from_utf8(header).map_err(|_| bad(path, "non-UTF-8 .npy header"))?;
        let descr = header_field(header, "descr")
            .and_then(|s| s.strip_prefix('\''))
            .and_then(|s| s.split('\'').next())
            .ok_or_else(|| bad(path, "no descr in .npy header"))?;
        let dtype = NpyDType::from_descr(descr)
            .ok_or_else(|| bad(path, format!("unsupported .npy dtype {descr:?}")))?;
        let fortran = header_field(header, "fortran_order")
            .ok_or_else(|| bad(path, "no fortran_order in .npy header"))?;
        if fortran.starts_with("True") {
            return Err(bad(
                path,
                "Fortran-order .npy arrays are not supported; save in C order",
            ));
        }
        let shape_txt = header_field(header, "shape")
            .and_then(|s| s.strip_prefix('('))
            .and_then(|s| s.split(')').next())
            .ok_or_else(|| bad(path, "no shape in .npy header"))?;
        let mut shape = Vec::new();
        for part in shape_txt
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
        {
            shape.push(
                part.parse::<usize>()
                    .map_err(|_| bad(path, format!("bad .npy shape entry {part:?}")))?,
            );
        }
        let numel = shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| bad(path, "shape overflows"))?;
        let need = numel
            .checked_mul(dtype.size())
            .ok_or_else(|| bad(path, "shape overflows"))?;
        let data = &bytes[hstart + hlen..];
        if data.len() != need {
            return Err(bad(
                path,
                format!(
                    "data is {} bytes, shape {shape:?} of {descr} needs {need}",
                    data.len()
                ),
            ));
        }
        Ok(NpyArray {
            dtype,
            shape,
            data: data.to_vec(),
        })
    }

    /// Reads an `.npy` file.
    pub fn read(path: impl AsRef<Path>) -> Result<NpyArray> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        NpyArray::parse(&bytes, path)
    }

    /// Serializes to `.npy` (v1) bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let shape = match self.shape.len() {
            1 => format!("({},)", self.shape[0]),
            _ => format!(
                "({})",
                self.shape
                    .iter()
                    .map(|d| d.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        let mut header = format!(
            "{{'descr': '{}', 'fortran_order': False, 'shape': {shape}, }}",
            self.dtype.descr()
        );
        while (10 + header.len() + 1) % 64 != 0 {
            header.push(' ');
        }
        header.push('\n');
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend_from_slice(&(header.len() as u16).to_le_bytes());
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(&self.data);
        out
    }

    /// Writes an `.npy` file.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        std::fs::write(path, self.to_bytes()).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })
    }

    /// An f32 array.
    pub fn from_f32(data: &[f32], shape: &[usize]) -> NpyArray {
        NpyArray {
            dtype: NpyDType::F32,
            shape: shape.to_vec(),
            data: bytemuck::cast_slice(data).to_vec(),
        }
    }

    fn words<const N: usize>(&self) -> impl Iterator<Item = [u8; N]> + '_ {
        self.data.chunks_exact(N).map(|c| {
            let mut a = [0u8; N];
            a.copy_from_slice(c);
            a
        })
    }

    /// Values as f32 (from f32, f16 or f64 arrays).
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        Ok(match self.dtype {
            NpyDType::F32 => self.words::<4>().map(f32::from_le_bytes).collect(),
            NpyDType::F16 => self
                .words::<2>()
                .map(|b| f16::from_le_bytes(b).to_f32())
                .collect(),
            NpyDType::F64 => self
                .words::<8>()
                .map(|b| f64::from_le_bytes(b) as f32)
                .collect(),
            d => {
                return Err(crate::error::invalid(
                    "npy_to_f32",
                    "dtype",
                    "f32, f16 or f64",
                    format!("{d:?}"),
                ))
            }
        })
    }

    /// Interprets a `<u2` array as bfloat16 bits.
    pub fn bf16_bits_to_f32(&self) -> Result<Vec<f32>> {
        crate::error::ensure(
            self.dtype == NpyDType::U16,
            "npy_bf16_bits_to_f32",
            "dtype",
            "U16",
            format!("{:?}", self.dtype),
        )?;
        Ok(self
            .words::<2>()
            .map(|b| bf16::from_bits(u16::from_le_bytes(b)).to_f32())
            .collect())
    }

    /// Values as u32 (from u8, u16, u32, i32 ≥ 0 or i64 ≥ 0 arrays).
    pub fn to_u32(&self) -> Result<Vec<u32>> {
        let neg =
            || crate::error::invalid("npy_to_u32", "values", "non-negative", "a negative value");
        Ok(match self.dtype {
            NpyDType::U8 => self.data.iter().map(|&b| b as u32).collect(),
            NpyDType::U16 => self
                .words::<2>()
                .map(|b| u16::from_le_bytes(b) as u32)
                .collect(),
            NpyDType::U32 => self.words::<4>().map(u32::from_le_bytes).collect(),
            NpyDType::I32 => self
                .words::<4>()
                .map(|b| u32::try_from(i32::from_le_bytes(b)).map_err(|_| neg()))
                .collect::<Result<_>>()?,
            NpyDType::I64 => self
                .words::<8>()
                .map(|b| u32::try_from(i64::from_le_bytes(b)).map_err(|_| neg()))
                .collect::<Result<_>>()?,
            d => {
                return Err(crate::error::invalid(
                    "npy_to_u32",
                    "dtype",
                    "an integer dtype",
                    format!("{d:?}"),
                ))
            }
        })
    }

    /// A CPU tensor of the array (f32/f16 → that dtype, u8/u32/i32 likewise,
    /// `<u2` → bf16 bits).
    pub fn to_tensor(&self) -> Result<Tensor> {
        let dtype = match self.dtype {
            NpyDType::F32 => DType::F32,
            NpyDType::F16 => DType::F16,
            NpyDType::U16 => DType::Bf16,
            NpyDType::U8 => DType::U8,
            NpyDType::U32 => DType::U32,
            NpyDType::I32 => DType::I32,
            d => {
                return Err(crate::error::invalid(
                    "npy_to_tensor",
                    "dtype",
                    "f32, f16, u16, u8, u32 or i32",
                    format!("{d:?}"),
                ))
            }
        };
        Tensor::from_bytes(
            dtype,
            &self.shape,
            crate::tensor::Bytes::copy_from(&self.data),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip() {
        let a = NpyArray::from_f32(&[1.0, -2.5, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
        let b = NpyArray::parse(&a.to_bytes(), Path::new("x.npy")).unwrap();
        assert_eq!(b.shape, vec![2, 3]);
        assert_eq!(b.to_f32().unwrap(), vec![1.0, -2.5, 3.0, 4.0, 5.0, 6.0]);
        let one = NpyArray::from_f32(&[7.0], &[1]);
        assert_eq!(
            NpyArray::parse(&one.to_bytes(), Path::new("y"))
                .unwrap()
                .shape,
            vec![1]
        );
    }

    #[test]
    fn rejects_truncated_and_garbage() {
        let a = NpyArray::from_f32(&[1.0, 2.0], &[2]).to_bytes();
        for cut in 0..a.len() {
            assert!(NpyArray::parse(&a[..cut], Path::new("t.npy")).is_err());
        }
        assert!(NpyArray::parse(b"hello world", Path::new("g.npy")).is_err());
    }

    /// What a header claims (its own length, the shape) is checked against
    /// the bytes present before anything is allocated.
    #[test]
    fn header_claims_beyond_the_file_are_refused() {
        let mut v2 = b"\x93NUMPY\x02\x00".to_vec();
        v2.extend_from_slice(&u32::MAX.to_le_bytes());
        v2.extend_from_slice(b"{'descr': '<f4'}");
        let e = NpyArray::parse(&v2, Path::new("h.npy")).unwrap_err();
        assert!(e.to_string().contains("truncated .npy header"), "{e}");
        let mut a = NpyArray::from_f32(&[1.0, 2.0], &[2]);
        a.shape = vec![1 << 40, 1 << 20];
        let e = NpyArray::parse(&a.to_bytes(), Path::new("s.npy")).unwrap_err();
        assert!(e.to_string().contains("data is 8 bytes"), "{e}");
        a.shape = vec![1 << 40, 1 << 40];
        let e = NpyArray::parse(&a.to_bytes(), Path::new("o.npy")).unwrap_err();
        assert!(e.to_string().contains("shape overflows"), "{e}");
    }
}
