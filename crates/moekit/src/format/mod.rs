//! Weight formats: block layouts, (de)quantization — the single source of truth.
//!
//! * [`affine`]: MLX affine quantization (`mx.quantize`): 2/3/4/5/6/8 bits,
//!   group size 32/64/128, codes packed LSB-first into `u32` along K, per-group
//!   scale and bias; plus mlx-native's unpacked `u8` code layout.
//! * [`ggml`]: GGUF block quantization (Q4_0 … Q6_K, IQ4_NL, IQ4_XS, MXFP4,
//!   the IQ1–IQ3 grid types, TQ1_0, TQ2_0) with `#[repr(C)]` blocks.
//! * [`mlxfp`]: MLX's microscaled floating-point modes `mxfp4`, `nvfp4` and
//!   `mxfp8` (packed `u32` codes, `u8` e8m0/e4m3 scales, no biases).
//! * [`fp8`]: FP8 block-scaled weights of the Hugging Face DeepSeek-V3 /
//!   Kimi-K2 / MiniMax-M2 checkpoints (`u8` e4m3 codes, `f32` block scales
//!   expanded per row).
//! * Dense f32/f16/bf16.
//!
//! [`QuantWeights`] holds one weight matrix per expert (`[E, N, K]`, N output
//! rows, K input columns) in any of these formats, validated once at
//! construction; a crate-private row decoder then dequantizes rows without
//! further checks.

pub mod affine;
pub mod fp8;
pub mod ggml;
pub mod mlxfp;
pub mod random;
pub(crate) mod rows;

use crate::dtype::DType;
use crate::error::{ensure, invalid, Result};
use crate::tensor::Tensor;
use std::fmt;

pub use ggml::GgmlType;
pub use mlxfp::MlxFpMode;
pub(crate) use rows::{RawRow, RowDecoder, ScaleRow};

/// MLX affine quantization parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AffineParams {
    /// Bits per weight: 2, 3, 4, 5, 6 or 8.
    pub bits: u32,
    /// Weights per scale/bias group: 32, 64 or 128.
    pub group_size: usize,
}

/// How an expert weight matrix is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    /// Unquantized f32, f16 or bf16: `data` is `[E, N, K]` of that dtype.
    Dense(DType),
    /// MLX packed affine: `data` is `u32 [E, N, K·bits/32]`, `scales` and
    /// `biases` are `[E, N, K/group_size]` in f32, f16 or bf16.
    Affine(AffineParams),
    /// mlx-native unpacked affine: `data` is `u8 [E, N, K]` (one code per
    /// byte, up to 8 bits), `scales`/`biases` `f32 [E, N, K/group_size]`.
    AffineU8 {
        /// Weights per group.
        group_size: usize,
    },
    /// GGUF blocks: `data` is `u8 [E, N, (K/block)·type_size]`.
    Ggml(GgmlType),
    /// MLX microscaled floats (`mode="mxfp4" | "nvfp4" | "mxfp8"`): `data` is
    /// `u32 [E, N, K·bits/32]`, `scales` `u8 [E, N, K/group_size]` (e8m0, or
    /// e4m3 for nvfp4), no `biases`; see [`mlxfp`].
    MlxFp(MlxFpMode),
    /// FP8 block-scaled (`quant_method: "fp8"`, DeepSeek-V3 style): `data`
    /// is `u8 [E, N, K]` (e4m3fn codes), `scales` `f32 [E, N, K/block_k]`
    /// (the checkpoint's `[⌈N/128⌉, ⌈K/128⌉]` block scales expanded per
    /// row), no `biases`; see [`fp8`].
    Fp8Block {
        /// Columns per scale: 32, 64 or 128.
        block_k: usize,
    },
}

impl WeightFormat {
    /// Parses a command-line name: `f32`, `f16`, `bf16`, `q4_0` … `q6_k`,
    /// `iq4_nl`, `iq4_xs`, `mxfp4`, `iq2_xxs` … `iq1_m`, `tq1_0`, `tq2_0`,
    /// `affine4` (group 64) or `affine4-g32`, `affine-u8-g64`, `mlx-mxfp4`,
    /// `mlx-nvfp4`, `mlx-mxfp8` (MLX's modes; plain `mxfp4` is GGUF's),
    /// `fp8-b128` (or `-b64`, `-b32`; plain `fp8` is `fp8-b128`).
    pub fn parse(s: &str) -> Result<WeightFormat> {
        let l = s.to_ascii_lowercase();
        if let Some(d) = DType::parse(&l).filter(|d| d.is_float()) {
            return Ok(WeightFormat::Dense(d));
        }
        if let Some(t) = GgmlType::parse(&l) {
            return Ok(WeightFormat::Ggml(t));
        }
        if let Some(m) = l.strip_prefix("mlx-").and_then(MlxFpMode::from_mlx_name) {
            return Ok(WeightFormat::MlxFp(m));
        }
        if l == "fp8" {
            return Ok(WeightFormat::Fp8Block { block_k: 128 });
        }
        if let Some(b) = l.strip_prefix("fp8-b") {
            let f = WeightFormat::Fp8Block {
                block_k: b.parse::<usize>().unwrap_or(0),
            };
            f.validate("format")?;
            return Ok(f);
        }
        let bad = || {
            invalid(
                "format",
                "format",
                "f32|f16|bf16|q4_0|q4_1|q5_0|q5_1|q8_0|q2_k..q6_k|iq4_nl|iq4_xs|mxfp4|iq2_xxs|iq2_xs|iq2_s|iq3_xxs|iq3_s|iq1_s|iq1_m|tq1_0|tq2_0|affine<bits>[-g<group>]|affine-u8[-g<group>]|mlx-mxfp4|mlx-nvfp4|mlx-mxfp8|fp8-b128|fp8-b64|fp8-b32",
                s,
            )
        };
        let (head, group) = match l.split_once("-g") {
            Some((h, g)) => (h, g.parse::<usize>().map_err(|_| bad())?),
            None => (l.as_str(), 64),
        };
        let f = if head == "affine-u8" {
            WeightFormat::AffineU8 { group_size: group }
        } else if let Some(b) = head.strip_prefix("affine") {
            let bits = b.parse::<u32>().map_err(|_| bad())?;
            WeightFormat::Affine(AffineParams {
                bits,
                group_size: group,
            })
        } else {
            return Err(bad());
        };
        f.validate("format")?;
        Ok(f)
    }

    /// Checks the format's parameters (bits, group size, dense dtype).
    pub fn validate(&self, op: &'static str) -> Result<()> {
        match *self {
            WeightFormat::Dense(d) => ensure(d.is_float(), op, "format", "f32, f16 or bf16", d),
            WeightFormat::Affine(p) => affine::check_params(op, p.bits, p.group_size),
            WeightFormat::AffineU8 { group_size } => affine::check_params(op, 8, group_size),
            WeightFormat::Ggml(_) | WeightFormat::MlxFp(_) => Ok(()),
            WeightFormat::Fp8Block { block_k } => fp8::check_block_k(op, block_k),
        }
    }

    /// The K granularity: group size or GGUF block size (1 for dense; 32
    /// for the MLX fp modes, nvfp4's groups of 16 included, as the CUDA
    /// decoders read 32 codes at a time).
    pub fn k_granularity(&self) -> usize {
        match *self {
            WeightFormat::Dense(_) => 1,
            WeightFormat::Affine(p) => p.group_size,
            WeightFormat::AffineU8 { group_size } => group_size,
            WeightFormat::Ggml(t) => t.block_size(),
            WeightFormat::MlxFp(_) => 32,
            WeightFormat::Fp8Block { block_k } => block_k,
        }
    }

    /// Whether the format stores a `biases` tensor (MLX affine).
    pub fn has_biases(&self) -> bool {
        matches!(
            self,
            WeightFormat::Affine(_) | WeightFormat::AffineU8 { .. }
        )
    }

    /// Every format the foundation supports, with scales in f16 for affine.
    pub fn all() -> Vec<WeightFormat> {
        let mut v = vec![
            WeightFormat::Dense(DType::F32),
            WeightFormat::Dense(DType::F16),
            WeightFormat::Dense(DType::Bf16),
        ];
        for bits in affine::SUPPORTED_BITS {
            for group_size in affine::SUPPORTED_GROUP_SIZES {
                v.push(WeightFormat::Affine(AffineParams { bits, group_size }));
            }
        }
        for group_size in affine::SUPPORTED_GROUP_SIZES {
            v.push(WeightFormat::AffineU8 { group_size });
        }
        v.extend(GgmlType::ALL.iter().map(|&t| WeightFormat::Ggml(t)));
        v.extend(MlxFpMode::ALL.map(WeightFormat::MlxFp));
        v.extend(fp8::BLOCK_KS.map(|block_k| WeightFormat::Fp8Block { block_k }));
        v
    }
}

impl fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WeightFormat::Dense(d) => write!(f, "{d}"),
            WeightFormat::Affine(p) => write!(f, "affine{}-g{}", p.bits, p.group_size),
            WeightFormat::AffineU8 { group_size } => write!(f, "affine-u8-g{group_size}"),
            WeightFormat::Ggml(t) => f.write_str(t.name()),
            WeightFormat::MlxFp(m) => write!(f, "mlx-{m}"),
            WeightFormat::Fp8Block { block_k } => write!(f, "fp8-b{block_k}"),
        }
    }
}

/// One weight matrix per expert, `[E, N, K]` logically, in any [`WeightFormat`].
#[derive(Debug, Clone)]
pub struct QuantWeights {
    format: WeightFormat,
    n_experts: usize,
    rows: usize,
    cols: usize,
    data: Tensor,
    scales: Option<Tensor>,
    biases: Option<Tensor>,
}

/// Shape of the tensors a [`QuantWeights`] needs: (data dtype, data shape,
/// scales/biases shape if any; [`WeightFormat::has_biases`] says whether
/// there are biases, [`WeightFormat::MlxFp`] has `u8` scales only,
/// [`WeightFormat::Fp8Block`] `f32` scales only).
pub fn storage_shapes(
    format: WeightFormat,
    n_experts: usize,
    rows: usize,
    cols: usize,
) -> Result<(DType, Vec<usize>, Option<Vec<usize>>)> {
    const OP: &str = "QuantWeights";
    format.validate(OP)?;
    let g = format.k_granularity();
    ensure(
        cols > 0 && cols.is_multiple_of(g),
        OP,
        "cols (K)",
        format!("a positive multiple of {g} for {format}"),
        cols,
    )?;
    Ok(match format {
        WeightFormat::Dense(d) => (d, vec![n_experts, rows, cols], None),
        WeightFormat::Affine(p) => (
            DType::U32,
            vec![n_experts, rows, cols * p.bits as usize / 32],
            Some(vec![n_experts, rows, cols / p.group_size]),
        ),
        WeightFormat::AffineU8 { group_size } => (
            DType::U8,
            vec![n_experts, rows, cols],
            Some(vec![n_experts, rows, cols / group_size]),
        ),
        WeightFormat::Ggml(t) => (
            DType::U8,
            vec![n_experts, rows, cols / t.block_size() * t.type_size()],
            None,
        ),
        WeightFormat::MlxFp(m) => (
            DType::U32,
            vec![n_experts, rows, cols * m.bits() as usize / 32],
            Some(vec![n_experts, rows, cols / m.group_size()]),
        ),
        WeightFormat::Fp8Block { block_k } => (
            DType::U8,
            vec![n_experts, rows, cols],
            Some(vec![n_experts, rows, cols / block_k]),
        ),
    })
}

impl QuantWeights {
    /// Validates and wraps the storage of `n_experts` matrices of `rows × cols`.
    ///
    /// `data` may have any shape with the right element count (e.g. a 2-D
    /// `[N, K]` matrix for a single expert); `scales`/`biases` likewise.
    /// [`storage_shapes`] gives the dtype and shapes a format needs.
    ///
    /// ```
    /// use moekit::format::{affine, storage_shapes, AffineParams};
    /// use moekit::{QuantWeights, Tensor, WeightFormat};
    /// # fn main() -> moekit::Result<()> {
    /// // Two experts of [N, K] = [4, 64] f32 weights, as MLX affine 4-bit, group 64.
    /// let (e, n, k) = (2, 4, 64);
    /// let w: Vec<f32> = (0..e * n * k).map(|i| (i as f32 * 0.1).sin() * 0.05).collect();
    /// let q = affine::quantize::<f32>(&w, e * n, k, 4, 64)?;
    /// let format = WeightFormat::Affine(AffineParams { bits: 4, group_size: 64 });
    /// let (_, shape, sshape) = storage_shapes(format, e, n, k)?;
    /// let sshape = sshape.unwrap_or_default();
    /// let qw = QuantWeights::new(
    ///     format, e, n, k,
    ///     Tensor::from_slice(&q.packed, &shape)?,
    ///     Some(Tensor::from_slice(&q.scales, &sshape)?),
    ///     Some(Tensor::from_slice(&q.biases, &sshape)?),
    /// )?;
    /// let back = qw.dequantize_expert(1)?; // [N, K] f32
    /// assert!((back[0] - w[n * k]).abs() < 0.01);
    /// # Ok(())
    /// # }
    /// ```
    pub fn new(
        format: WeightFormat,
        n_experts: usize,
        rows: usize,
        cols: usize,
        data: Tensor,
        scales: Option<Tensor>,
        biases: Option<Tensor>,
    ) -> Result<QuantWeights> {
        const OP: &str = "QuantWeights";
        ensure(
            n_experts > 0 && rows > 0,
            OP,
            "n_experts, rows",
            "> 0",
            format!("{n_experts}, {rows}"),
        )?;
        let (dtype, shape, sshape) = storage_shapes(format, n_experts, rows, cols)?;
        let numel: usize = shape.iter().product();
        ensure(data.dtype() == dtype, OP, "data dtype", dtype, data.dtype())?;
        ensure(
            data.numel() == numel,
            OP,
            "data",
            format!("{numel} elements ({shape:?}) for {format}"),
            format!("{:?}", data.shape()),
        )?;
        let data = data.reshape(&shape)?;
        let check_aux = |t: Option<Tensor>, arg: &'static str| -> Result<Option<Tensor>> {
            let sshape = if arg == "biases" && !format.has_biases() {
                &None
            } else {
                &sshape
            };
            match (sshape, t) {
                (None, None) => Ok(None),
                (None, Some(_)) => Err(invalid(OP, arg, format!("none for {format}"), "a tensor")),
                (Some(s), None) => Err(invalid(OP, arg, format!("{s:?} for {format}"), "none")),
                (Some(s), Some(t)) => {
                    let n: usize = s.iter().product();
                    ensure(
                        t.numel() == n,
                        OP,
                        arg,
                        format!("{s:?}"),
                        format!("{:?}", t.shape()),
                    )?;
                    let (ok, want) = match format {
                        WeightFormat::AffineU8 { .. } | WeightFormat::Fp8Block { .. } => {
                            (t.dtype() == DType::F32, "f32")
                        }
                        WeightFormat::MlxFp(_) => {
                            (t.dtype() == DType::U8, "u8 (e8m0 or e4m3 bytes)")
                        }
                        _ => (t.dtype().is_float(), "f32, f16 or bf16"),
                    };
                    ensure(ok, OP, arg, want, t.dtype())?;
                    Ok(Some(t.reshape(s)?))
                }
            }
        };
        let scales = check_aux(scales, "scales")?;
        let biases = check_aux(biases, "biases")?;
        if let (Some(s), Some(b)) = (&scales, &biases) {
            ensure(
                s.dtype() == b.dtype(),
                OP,
                "biases dtype",
                s.dtype(),
                b.dtype(),
            )?;
        }
        let devices =
            [Some(&data), scales.as_ref(), biases.as_ref()].map(|t| t.map(|t| t.device()));
        ensure(
            devices.iter().flatten().all(|&d| d == data.device()),
            OP,
            "scales/biases",
            format!("tensors on {} like data", data.device()),
            format!("{devices:?}"),
        )?;
        let w = QuantWeights {
            format,
            n_experts,
            rows,
            cols,
            data,
            scales,
            biases,
        };
        if w.device() == crate::Device::Cpu {
            w.decoder()?; // checks alignment of every typed view once
        }
        Ok(w)
    }

    /// Where the weights live.
    pub fn device(&self) -> crate::Device {
        self.data.device()
    }

    /// A copy of the weights on `device`.
    pub fn to_device(&self, device: crate::Device) -> Result<QuantWeights> {
        let mv = |t: &Option<Tensor>| t.as_ref().map(|t| t.to_device(device)).transpose();
        QuantWeights::new(
            self.format,
            self.n_experts,
            self.rows,
            self.cols,
            self.data.to_device(device)?,
            mv(&self.scales)?,
            mv(&self.biases)?,
        )
    }

    /// Storage format.
    pub fn format(&self) -> WeightFormat {
        self.format
    }
    /// Number of experts E.
    pub fn n_experts(&self) -> usize {
        self.n_experts
    }
    /// Output rows N per expert.
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Input columns K.
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// The packed data tensor.
    pub fn data(&self) -> &Tensor {
        &self.data
    }
    /// Per-group scales (affine and MLX fp formats).
    pub fn scales(&self) -> Option<&Tensor> {
        self.scales.as_ref()
    }
    /// Per-group biases (affine formats).
    pub fn biases(&self) -> Option<&Tensor> {
        self.biases.as_ref()
    }

    /// Bytes of one expert's matrix: data plus scales and biases.
    pub fn bytes_per_expert(&self) -> usize {
        let aux = |t: &Option<Tensor>| t.as_ref().map_or(0, |t| t.nbytes());
        (self.data.nbytes() + aux(&self.scales) + aux(&self.biases)) / self.n_experts
    }

    /// Dequantizes expert `e` into a row-major `[N, K]` f32 matrix.
    pub fn dequantize_expert(&self, e: usize) -> Result<Vec<f32>> {
        ensure(
            e < self.n_experts,
            "dequantize_expert",
            "e",
            format!("< {}", self.n_experts),
            e,
        )?;
        let dec = self.decoder()?;
        let mut out = vec![0f32; self.rows * self.cols];
        for (n, row) in out.chunks_exact_mut(self.cols).enumerate() {
            dec.decode(e, n, row)?;
        }
        Ok(out)
    }
}
