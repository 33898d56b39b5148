//! The GGUF container (v2 and v3, little-endian): header, metadata, tensor
//! infos, and zero-copy views of tensor data.
//!
//! ```text
//! "GGUF" | version u32 | n_tensors u64 | n_kv u64
//! n_kv × (key: string, type: u32, value)
//! n_tensors × (name: string, n_dims: u32, ne: n_dims × u64, ggml_type: u32, offset: u64)
//! padding to `general.alignment` (default 32) | tensor data (offsets relative to here)
//! ```
//!
//! Strings are a `u64` byte length then the bytes; arrays are an element type
//! (`u32`), a `u64` count, then the elements (arrays may nest).
//!
//! **Hostile input.** Every length and count is checked against the bytes that
//! remain before anything is allocated (a count of `n` elements needs at least
//! `n ×` the smallest encoding of one element), arrays nest at most
//! [`MAX_ARRAY_DEPTH`] deep, all offset arithmetic is checked, and every
//! tensor's byte range must lie inside the file. A corrupt file therefore gives
//! an [`Error::BadFile`] naming the byte offset and the key or tensor being
//! read. Arrays are stored by element type ([`Array`]), so metadata memory is
//! at most about 3× the metadata's bytes (strings: 24 bytes of `String` per
//! ≥ 8 encoded bytes; nested arrays: 32 bytes per ≥ 12).

use super::value::{Array, Value};
use crate::error::{Error, Result};
use crate::format::{GgmlType, WeightFormat};
use crate::tensor::Bytes;
use crate::DType;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Immutable shared file bytes: a memory map or an in-memory buffer.
pub type SharedBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// Alignment of the data section when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: usize = 32;
/// Deepest nesting of metadata arrays accepted (arrays of arrays of ...).
pub const MAX_ARRAY_DEPTH: usize = 8;
/// Most dimensions of a tensor (`GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;

/// A ggml tensor type as stored in GGUF tensor infos (`enum ggml_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorType {
    /// The `ggml_type` value.
    pub id: u32,
    /// Lower-case name (`f32`, `q4_k`, `iq2_xxs`, ...).
    pub name: &'static str,
    /// Elements per block (1 for plain types).
    pub block_size: usize,
    /// Bytes per block.
    pub type_size: usize,
}

const fn tt(id: u32, name: &'static str, block_size: usize, type_size: usize) -> TensorType {
    TensorType {
        id,
        name,
        block_size,
        type_size,
    }
}

/// Every `ggml_type` a GGUF file may hold (ggml.h; ids 4, 5, 31–33, 36–38 are
/// retired). Sizes follow ggml's `type_traits`.
const TENSOR_TYPES: [TensorType; 34] = [
    tt(0, "f32", 1, 4),
    tt(1, "f16", 1, 2),
    tt(2, "q4_0", 32, 18),
    tt(3, "q4_1", 32, 20),
    tt(6, "q5_0", 32, 22),
    tt(7, "q5_1", 32, 24),
    tt(8, "q8_0", 32, 34),
    tt(9, "q8_1", 32, 36),
    tt(10, "q2_k", 256, 84),
    tt(11, "q3_k", 256, 110),
    tt(12, "q4_k", 256, 144),
    tt(13, "q5_k", 256, 176),
    tt(14, "q6_k", 256, 210),
    tt(15, "q8_k", 256, 292),
    tt(16, "iq2_xxs", 256, 66),
    tt(17, "iq2_xs", 256, 74),
    tt(18, "iq3_xxs", 256, 98),
    tt(19, "iq1_s", 256, 50),
    tt(20, "iq4_nl", 32, 18),
    tt(21, "iq3_s", 256, 110),
    tt(22, "iq2_s", 256, 82),
    tt(23, "iq4_xs", 256, 136),
    tt(24, "i8", 1, 1),
    tt(25, "i16", 1, 2),
    tt(26, "i32", 1, 4),
    tt(27, "i64", 1, 8),
    tt(28, "f64", 1, 8),
    tt(29, "iq1_m", 256, 56),
    tt(30, "bf16", 1, 2),
    tt(34, "tq1_0", 256, 54),
    tt(35, "tq2_0", 256, 66),
    tt(39, "mxfp4", 32, 17),
    tt(40, "nvfp4", 64, 36),
    tt(41, "q1_0", 128, 18),
];

impl TensorType {
    /// The type with `ggml_type` value `id`, if it is a known one.
    pub fn from_id(id: u32) -> Option<TensorType> {
        TENSOR_TYPES.iter().copied().find(|t| t.id == id)
    }

    /// The moekit weight format of this type: dense f32/f16/bf16 or a supported
    /// GGML block type; `None` for the rest (Q1_0, Q8_K, integers, ...).
    pub fn weight_format(&self) -> Option<WeightFormat> {
        match self.id {
            0 => Some(WeightFormat::Dense(DType::F32)),
            1 => Some(WeightFormat::Dense(DType::F16)),
            30 => Some(WeightFormat::Dense(DType::Bf16)),
            id => GgmlType::from_ggml_type_id(id).map(WeightFormat::Ggml),
        }
    }
}

/// One tensor's entry in the tensor-info table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Name (`blk.0.ffn_down_exps.weight`).
    pub name: String,
    /// ggml `ne`: dimensions **innermost first** (`ne[0]` is the row length K).
    pub ne: Vec<usize>,
    /// Element type.
    pub ty: TensorType,
    /// Offset of the data from the start of the file (data section + offset).
    pub start: usize,
    /// Size of the data in bytes.
    pub nbytes: usize,
}

impl TensorInfo {
    /// The shape outermost first, as numpy shows it (`ne` reversed).
    pub fn shape(&self) -> Vec<usize> {
        self.ne.iter().rev().copied().collect()
    }
}

/// A parsed GGUF file over shared bytes.
pub struct GgufFile {
    path: PathBuf,
    data: SharedBytes,
    version: u32,
    alignment: usize,
    data_offset: usize,
    metadata: Vec<(String, Value)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("n_kv", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .finish()
    }
}

/// A bounds-checked little-endian cursor; errors are plain messages that
/// [`GgufFile::parse`] turns into [`Error::BadFile`].
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

type Msg<T> = std::result::Result<T, String>;

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    fn take(&mut self, n: usize, what: &str) -> Msg<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        match end.and_then(|e| self.buf.get(self.pos..e).map(|s| (s, e))) {
            Some((s, e)) => {
                self.pos = e;
                Ok(s)
            }
            None => Err(format!(
                "truncated at byte {}: {what} needs {n} bytes, {} remain",
                self.pos,
                self.remaining()
            )),
        }
    }

    fn array<const N: usize>(&mut self, what: &str) -> Msg<[u8; N]> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> Msg<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Msg<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A `u64` count of items each at least `min_size` bytes long; errors if
    /// the remaining bytes cannot hold that many.
    fn count(&mut self, min_size: usize, what: &str) -> Msg<usize> {
        let at = self.pos;
        let n = self.u64(what)?;
        let fits = usize::try_from(n).ok().filter(|&n| {
            n.checked_mul(min_size.max(1))
                .is_some_and(|b| b <= self.remaining())
        });
        fits.ok_or_else(|| {
            format!(
                "{what} at byte {at} is {n}, but only {} bytes remain (each needs ≥ {min_size})",
                self.remaining()
            )
        })
    }

    fn string(&mut self, what: &str) -> Msg<String> {
        let n = self.count(1, &format!("length of {what}"))?;
        Ok(String::from_utf8_lossy(self.take(n, what)?).into_owned())
    }
}

/// Smallest encoding of one value of GGUF type `ty`; `None` if unknown.
fn min_value_size(ty: u32) -> Option<usize> {
    Some(match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        9 => 12,
        _ => return None,
    })
}

fn read_value(r: &mut Reader<'_>, ty: u32, depth: usize, what: &str) -> Msg<Value> {
    Ok(match ty {
        0 => Value::U8(u8::from_le_bytes(r.array(what)?)),
        1 => Value::I8(i8::from_le_bytes(r.array(what)?)),
        2 => Value::U16(u16::from_le_bytes(r.array(what)?)),
        3 => Value::I16(i16::from_le_bytes(r.array(what)?)),
        4 => Value::U32(u32::from_le_bytes(r.array(what)?)),
        5 => Value::I32(i32::from_le_bytes(r.array(what)?)),
        6 => Value::F32(f32::from_le_bytes(r.array(what)?)),
        7 => Value::Bool(u8::from_le_bytes(r.array(what)?) != 0),
        8 => Value::String(r.string(what)?),
        9 => Value::Array(read_array(r, depth, what)?),
        10 => Value::U64(u64::from_le_bytes(r.array(what)?)),
        11 => Value::I64(i64::from_le_bytes(r.array(what)?)),
        12 => Value::F64(f64::from_le_bytes(r.array(what)?)),
        _ => return Err(format!("{what}: unknown value type {ty}")),
    })
}

/// A name read from the file as it appears in messages: control characters
/// escaped, at most 64 characters (a corrupt length can make a "name" of
/// megabytes).
fn shown(name: &str) -> String {
    const MAX: usize = 64;
    let mut out: String = name
        .chars()
        .take(MAX)
        .flat_map(char::escape_debug)
        .collect();
    if name.chars().nth(MAX).is_some() {
        out.push_str(&format!("… ({} bytes)", name.len()));
    }
    out
}

/// Most items a count read from the file pre-allocates; past that, vectors
/// grow as items are actually read, so a header's claimed count (checked only
/// against the file's size, which a sparse file makes huge) allocates nothing
/// the file has not shown it holds.
const PREALLOC: usize = 1024;

/// `n` items read by `one` (the caller has checked that `n` items fit).
fn many<T>(n: usize, mut one: impl FnMut() -> Msg<T>) -> Msg<Vec<T>> {
    let mut items = Vec::with_capacity(n.min(PREALLOC));
    for _ in 0..n {
        items.push(one()?);
    }
    Ok(items)
}

/// An array's element type, count and elements; `depth` arrays enclose it.
fn read_array(r: &mut Reader<'_>, depth: usize, what: &str) -> Msg<Array> {
    if depth >= MAX_ARRAY_DEPTH {
        return Err(format!(
            "{what}: arrays nested deeper than {MAX_ARRAY_DEPTH}"
        ));
    }
    let ety = r.u32(what)?;
    let min =
        min_value_size(ety).ok_or_else(|| format!("{what}: unknown array element type {ety}"))?;
    let n = r.count(min, &format!("element count of {what}"))?;
    Ok(match ety {
        0 => Array::U8(many(n, || Ok(u8::from_le_bytes(r.array(what)?)))?),
        1 => Array::I8(many(n, || Ok(i8::from_le_bytes(r.array(what)?)))?),
        2 => Array::U16(many(n, || Ok(u16::from_le_bytes(r.array(what)?)))?),
        3 => Array::I16(many(n, || Ok(i16::from_le_bytes(r.array(what)?)))?),
        4 => Array::U32(many(n, || Ok(u32::from_le_bytes(r.array(what)?)))?),
        5 => Array::I32(many(n, || Ok(i32::from_le_bytes(r.array(what)?)))?),
        6 => Array::F32(many(n, || Ok(f32::from_le_bytes(r.array(what)?)))?),
        7 => Array::Bool(many(n, || Ok(u8::from_le_bytes(r.array(what)?) != 0))?),
        8 => Array::String(many(n, || r.string(what))?),
        9 => Array::Array(many(n, || read_array(r, depth + 1, what))?),
        10 => Array::U64(many(n, || Ok(u64::from_le_bytes(r.array(what)?)))?),
        11 => Array::I64(many(n, || Ok(i64::from_le_bytes(r.array(what)?)))?),
        12 => Array::F64(many(n, || Ok(f64::from_le_bytes(r.array(what)?)))?),
        _ => return Err(format!("{what}: unknown array element type {ety}")),
    })
}

/// Tensor info as read, before the data section is known.
struct RawInfo {
    name: String,
    ne: Vec<usize>,
    ty: TensorType,
    offset: u64,
}

fn read_tensor_info(r: &mut Reader<'_>, i: usize) -> Msg<RawInfo> {
    let name = r.string(&format!("name of tensor {i}"))?;
    let what = format!("tensor info of `{}`", shown(&name));
    let n_dims = r.u32(&what)? as usize;
    if n_dims > MAX_DIMS {
        return Err(format!("{what}: {n_dims} dimensions (at most {MAX_DIMS})"));
    }
    let mut ne = Vec::with_capacity(n_dims);
    for _ in 0..n_dims {
        let d = r.u64(&what)?;
        let d = usize::try_from(d)
            .ok()
            .filter(|&d| d as u64 <= i64::MAX as u64)
            .ok_or_else(|| format!("{what}: dimension {d} is too large"))?;
        ne.push(d);
    }
    let id = r.u32(&what)?;
    let ty = TensorType::from_id(id).ok_or_else(|| format!("{what}: unknown ggml type id {id}"))?;
    let offset = r.u64(&what)?;
    Ok(RawInfo {
        name,
        ne,
        ty,
        offset,
    })
}

/// Byte size of a tensor of type `ty` and dimensions `ne`, checked.
fn tensor_nbytes(ty: TensorType, ne: &[usize]) -> Msg<usize> {
    let ne0 = ne.first().copied().unwrap_or(1);
    if ne0 % ty.block_size != 0 {
        return Err(format!(
            "row length ne[0] = {ne0} is not a multiple of the {} block size {}",
            ty.name, ty.block_size
        ));
    }
    let rows = ne.iter().skip(1).try_fold(1usize, |a, &d| a.checked_mul(d));
    let row_bytes = (ne0 / ty.block_size).checked_mul(ty.type_size);
    rows.zip(row_bytes)
        .and_then(|(r, b)| r.checked_mul(b))
        .ok_or_else(|| format!("dimensions {ne:?} overflow the address space"))
}

impl GgufFile {
    /// Memory-maps and parses the file at `path`.
    pub fn open(path: &Path) -> Result<GgufFile> {
        let io = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and only ever read as plain bytes (every
        // offset is bounds-checked, no pointer is derived from the contents).
        // As for any mmap, the file must not be truncated or modified while
        // mapped; a model file being rewritten under a running reader is the
        // same hazard llama.cpp accepts.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        GgufFile::parse(Arc::new(map), path)
    }

    /// Parses GGUF bytes held in memory; `path` only names the file in errors.
    pub fn parse(data: SharedBytes, path: &Path) -> Result<GgufFile> {
        let bad = |msg: String| Error::BadFile {
            path: path.to_path_buf(),
            msg,
        };
        let buf: &[u8] = (*data).as_ref();
        let mut r = Reader { buf, pos: 0 };
        let magic = r.array::<4>("magic").map_err(bad)?;
        if &magic != b"GGUF" {
            return Err(bad(format!(
                "not a GGUF file (magic {magic:02x?}, want \"GGUF\")"
            )));
        }
        let version = r.u32("version").map_err(bad)?;
        match version {
            2 | 3 => {}
            1 => return Err(bad("GGUF version 1 is not supported (only 2 and 3)".into())),
            v if v.swap_bytes() == 2 || v.swap_bytes() == 3 => {
                return Err(bad(format!(
                    "big-endian GGUF (version {}) is not supported",
                    v.swap_bytes()
                )));
            }
            v => return Err(bad(format!("unknown GGUF version {v} (supported: 2, 3)"))),
        }
        // Each tensor info needs ≥ 24 bytes (empty name, 0 dims); each KV ≥ 13.
        let n_tensors = r.count(24, "tensor count").map_err(bad)?;
        let n_kv = r.count(13, "metadata count").map_err(bad)?;

        let mut metadata = Vec::with_capacity(n_kv.min(PREALLOC));
        let mut key_index = HashMap::with_capacity(n_kv.min(PREALLOC));
        for i in 0..n_kv {
            let key = r
                .string(&format!("key of metadata entry {i}"))
                .map_err(bad)?;
            let what = format!("value of `{}`", shown(&key));
            let ty = r.u32(&what).map_err(bad)?;
            let value = read_value(&mut r, ty, 0, &what).map_err(bad)?;
            if key_index.insert(key.clone(), metadata.len()).is_some() {
                return Err(bad(format!("duplicate metadata key `{}`", shown(&key))));
            }
            metadata.push((key, value));
        }

        // Names are checked unique as they are read: a run of empty infos
        // (zeros) stops at the second, not after `n_tensors` of them.
        let mut raw = Vec::with_capacity(n_tensors.min(PREALLOC));
        let mut tensor_index = HashMap::with_capacity(n_tensors.min(PREALLOC));
        for i in 0..n_tensors {
            let info = read_tensor_info(&mut r, i).map_err(bad)?;
            if tensor_index.insert(info.name.clone(), i).is_some() {
                return Err(bad(format!(
                    "duplicate tensor name `{}`",
                    shown(&info.name)
                )));
            }
            raw.push(info);
        }

        let alignment = match key_index
            .get("general.alignment")
            .and_then(|&i| metadata.get(i))
        {
            None => DEFAULT_ALIGNMENT,
            Some((_, v)) => v
                .as_u64()
                .and_then(|a| usize::try_from(a).ok())
                .filter(|a| a.is_power_of_two() && *a <= 1 << 30)
                .ok_or_else(|| {
                    bad(format!(
                        "general.alignment = {v:?}: want a power of two ≤ 2^30"
                    ))
                })?,
        };
        let data_offset = r
            .pos
            .checked_next_multiple_of(alignment)
            .ok_or_else(|| bad("data offset overflows".into()))?;
        if n_tensors > 0 && data_offset > buf.len() {
            return Err(bad(format!(
                "truncated: the data section starts at byte {data_offset}, the file has {} bytes",
                buf.len()
            )));
        }

        let mut tensors = Vec::with_capacity(raw.len());
        for RawInfo {
            name,
            ne,
            ty,
            offset,
        } in raw
        {
            let at = |m: String| bad(format!("tensor `{}`: {m}", shown(&name)));
            let nbytes = tensor_nbytes(ty, &ne).map_err(at)?;
            if offset % alignment as u64 != 0 {
                return Err(at(format!(
                    "data offset {offset} is not a multiple of the alignment {alignment}"
                )));
            }
            let start = usize::try_from(offset)
                .ok()
                .and_then(|o| o.checked_add(data_offset));
            let end = start.and_then(|s| s.checked_add(nbytes));
            let (start, _) = match (start, end) {
                (Some(s), Some(e)) if e <= buf.len() => (s, e),
                _ => {
                    return Err(at(format!(
                        "data [{offset} + {nbytes} bytes] after the data section at {data_offset} runs past the end of the file ({} bytes)",
                        buf.len()
                    )))
                }
            };
            tensors.push(TensorInfo {
                name,
                ne,
                ty,
                start,
                nbytes,
            });
        }

        Ok(GgufFile {
            path: path.to_path_buf(),
            data,
            version,
            alignment,
            data_offset,
            metadata,
            key_index,
            tensors,
            tensor_index,
        })
    }

    /// The file's path (as given to [`open`](Self::open) or [`parse`](Self::parse)).
    pub fn path(&self) -> &Path {
        &self.path
    }
    /// GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }
    /// Alignment of the data section and of every tensor offset.
    pub fn alignment(&self) -> usize {
        self.alignment
    }
    /// Byte offset of the data section.
    pub fn data_offset(&self) -> usize {
        self.data_offset
    }
    /// Every metadata entry, in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }
    /// The metadata value of `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.key_index
            .get(key)
            .and_then(|&i| self.metadata.get(i))
            .map(|(_, v)| v)
    }
    /// Every tensor info, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }
    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index
            .get(name)
            .and_then(|&i| self.tensors.get(i))
    }
    /// A zero-copy view of a tensor's data.
    pub fn tensor_bytes(&self, t: &TensorInfo) -> Result<Bytes> {
        let end = t.start.saturating_add(t.nbytes);
        Bytes::shared(self.data.clone(), t.start..end)
    }
    /// A zero-copy view of any byte range of the file.
    pub fn bytes(&self, range: std::ops::Range<usize>) -> Result<Bytes> {
        Bytes::shared(self.data.clone(), range)
    }
    /// The whole file's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        (*self.data).as_ref()
    }
}
