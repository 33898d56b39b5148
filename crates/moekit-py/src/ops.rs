//! Functional ops in the vocabulary inference engines use: routing,
//! vLLM-style `fused_experts` over weights of any moekit format, and the
//! quantizers that make such weights from float tensors.

use crate::dlpack::{import, Array, Kind};
use crate::{err, on_stream, parse_device, parse_dtype, streams, MoekitError};
use half::{bf16, f16};
use moekit::format::{affine, ggml, storage_shapes, QuantWeights};
use moekit::ops::act::GateUp;
use moekit::ops::route::{GroupMask, RouterConfig, RouterKind, Routing, Scoring};
use moekit::{DType, Device, Tensor, WeightFormat};
use pyo3::prelude::*;

/// `[E, N, K]` expert weights (one `[N, K]` matrix per expert, rows = output
/// features) in any moekit format, on a device.
#[pyclass(module = "moekit._moekit", frozen)]
#[derive(Clone)]
pub struct Experts {
    pub(crate) w: QuantWeights,
}

#[pymethods]
impl Experts {
    /// Wraps tensors already in a moekit format (e.g. an MLX checkpoint's
    /// `weight`/`scales`/`biases` or a GGUF tensor's blocks) as
    /// `shape = (E, N, K)` experts: `format` as in `moekit bench --format`
    /// (`affine4-g64`, `q4_k`, `bf16`, …); `data`/`scales`/`biases` with the
    /// element counts and types the format stores (see `storage_shapes`).
    /// Copied to moekit's memory on the data's device.
    #[staticmethod]
    #[pyo3(signature = (format, shape, data, scales=None, biases=None))]
    fn from_parts(
        format: &str,
        shape: (usize, usize, usize),
        data: &Bound<'_, PyAny>,
        scales: Option<&Bound<'_, PyAny>>,
        biases: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Experts> {
        let f = WeightFormat::parse(format).map_err(err)?;
        let owned = |o: &Bound<'_, PyAny>, what: &str| -> PyResult<Tensor> {
            let t = crate::dlpack::import_raw(o, what)?;
            // An owned copy: the holder outlives the caller's arrays.
            deep_copy(&t).map_err(err)
        };
        let (e, n, k) = shape;
        let w = QuantWeights::new(
            f,
            e,
            n,
            k,
            owned(data, "data")?,
            scales.map(|s| owned(s, "scales")).transpose()?,
            biases.map(|b| owned(b, "biases")).transpose()?,
        )
        .map_err(err)?;
        Ok(Experts { w })
    }

    /// Random `shape = (E, N, K)` weights in `format` (seeded; what `moekit
    /// bench` runs on), on the CPU: for benchmarks and tests.
    #[staticmethod]
    #[pyo3(signature = (format, shape, seed=0, scale_dtype="float16"))]
    fn random(
        py: Python<'_>,
        format: &str,
        shape: (usize, usize, usize),
        seed: u64,
        scale_dtype: &str,
    ) -> PyResult<Experts> {
        let f = WeightFormat::parse(format).map_err(err)?;
        let sd = parse_dtype("Experts.random: scale_dtype", scale_dtype)?;
        let (e, n, k) = shape;
        let w = py
            .detach(|| moekit::format::random::random_weights(f, e, n, k, sd, seed, &|| {}))
            .map_err(err)?;
        Ok(Experts { w })
    }

    /// This holder's weights on `device` (`cpu`, `cuda`, `cuda:N`).
    fn to(&self, py: Python<'_>, device: &str) -> PyResult<Experts> {
        let d = parse_device("Experts.to: device", device)?;
        let w = py.detach(|| self.w.to_device(d)).map_err(err)?;
        Ok(Experts { w })
    }

    /// The weights as float32 `[E, N, K]` on the CPU (dequantized).
    fn dequantize(&self, py: Python<'_>) -> PyResult<Array> {
        let w = &self.w;
        let all = py
            .detach(|| -> moekit::Result<Vec<f32>> {
                let w = w.to_device(Device::Cpu)?;
                let mut v = Vec::with_capacity(w.n_experts() * w.rows() * w.cols());
                for e in 0..w.n_experts() {
                    v.extend(w.dequantize_expert(e)?);
                }
                Ok(v)
            })
            .map_err(err)?;
        let t = Tensor::from_f32(&all, &[w.n_experts(), w.rows(), w.cols()], DType::F32)
            .map_err(err)?;
        Ok(Array::new(t, None))
    }

    /// The stored tensors `(data, scales, biases)` (None where the format
    /// has none), as `Array`s on the holder's device.
    fn parts(&self) -> (Array, Option<Array>, Option<Array>) {
        let a = |t: &Tensor| Array::new(t.clone(), None);
        (
            a(self.w.data()),
            self.w.scales().map(a),
            self.w.biases().map(a),
        )
    }

    /// The format's name (`affine4-g64`, `q4_k`, `bf16`, …).
    #[getter]
    fn format(&self) -> String {
        self.w.format().to_string()
    }
    /// `(E, N, K)`.
    #[getter]
    fn shape(&self) -> (usize, usize, usize) {
        (self.w.n_experts(), self.w.rows(), self.w.cols())
    }
    /// `cpu` or `cuda:N`.
    #[getter]
    fn device(&self) -> String {
        self.w.device().to_string()
    }
    /// Bytes of storage per expert.
    #[getter]
    fn bytes_per_expert(&self) -> usize {
        self.w.bytes_per_expert()
    }

    fn __repr__(&self) -> String {
        let (e, n, k) = self.shape();
        format!(
            "moekit.Experts(format={}, shape=({e}, {n}, {k}), device={})",
            self.format(),
            self.device()
        )
    }
}

/// An owned copy of a CPU or CUDA tensor (views of caller memory are not
/// kept by weight holders).
fn deep_copy(t: &Tensor) -> moekit::Result<Tensor> {
    match t.device() {
        Device::Cpu => {
            Tensor::from_bytes(t.dtype(), t.shape(), moekit::Bytes::copy_from(t.bytes()?))
        }
        d => {
            let mut o = Tensor::zeros_on(t.dtype(), t.shape(), d)?;
            o.copy_from(t)?;
            Ok(o)
        }
    }
}

/// Weights for `fused_experts`: an `Experts` holder, or a float tensor
/// `[E, N, K]` used in place as dense weights.
fn weights_of(o: &Bound<'_, PyAny>, what: &str, stream: Option<usize>) -> PyResult<QuantWeights> {
    if let Ok(e) = o.cast::<Experts>() {
        return Ok(e.get().w.clone());
    }
    let t = import(o, what, Kind::Float, stream)?;
    let [e, n, k] = t.shape() else {
        return Err(MoekitError::new_err(format!(
            "{what}: a float tensor of shape [E, N, K] or a moekit.Experts (got shape {:?})",
            t.shape()
        )));
    };
    let (e, n, k) = (*e, *n, *k);
    QuantWeights::new(WeightFormat::Dense(t.dtype()), e, n, k, t, None, None).map_err(err)
}

/// vLLM's `fused_experts`: `out[t] = Σ_j topk_weights[t,j] · w2_e(silu(g) · u)`
/// with `[g; u] = w13_e · x[t]`, `e = topk_ids[t,j]`, summed in slot order.
///
/// `x [T, H]` (f32/f16/bf16); `w13 [E, 2I, H]` (gate rows, then up rows)
/// and `w2 [E, H, I]`: `Experts` in any format, or float tensors; `topk_weights
/// float32 [T, k]`, `topk_ids int32/uint32 [T, k]`; all on one device.
/// With `out` writes it (in place on CUDA's tensor-core path) and returns
/// None, else returns a new `Array`. `stream`: the CUDA stream to run on.
#[pyfunction]
#[pyo3(signature = (x, w13, w2, topk_weights, topk_ids, out=None, stream=None))]
#[allow(clippy::too_many_arguments)]
pub fn fused_experts(
    py: Python<'_>,
    x: &Bound<'_, PyAny>,
    w13: &Bound<'_, PyAny>,
    w2: &Bound<'_, PyAny>,
    topk_weights: &Bound<'_, PyAny>,
    topk_ids: &Bound<'_, PyAny>,
    out: Option<&Bound<'_, PyAny>>,
    stream: Option<usize>,
) -> PyResult<Option<Array>> {
    let (s, ready) = streams(crate::dlpack::device_hint(x)?, stream)?;
    let x = import(x, "x", Kind::Float, ready)?;
    let gate_up = GateUp::fused(weights_of(w13, "w13", ready)?).map_err(err)?;
    let down = weights_of(w2, "w2", ready)?;
    let routing = Routing {
        ids: import(topk_ids, "topk_ids", Kind::Ids, ready)?,
        weights: import(topk_weights, "topk_weights", Kind::F32, ready)?,
    };
    let mut out = out
        .map(|o| import(o, "out", Kind::Float, ready))
        .transpose()?;
    let device = x.device();
    let had_out = out.is_some();
    let y = py
        .detach(|| {
            on_stream(device, stream, || {
                moekit::moe::routed_experts(&gate_up, &down, &x, &routing, out.as_mut())
            })
        })
        .map_err(err)?;
    Ok((!had_out).then_some(Array::new(y, s)))
}

/// The routing-rule keywords that `route(...)` and `Layer.from_parts(...)`
/// share, by name.
pub(crate) struct RuleArgs<'a> {
    pub rule: &'a str,
    pub norm_topk_prob: bool,
    pub bias: Option<Vec<f32>>,
    pub n_group: usize,
    pub topk_group: usize,
    pub routed_scaling_factor: f32,
    pub per_expert_scale: Option<Vec<f32>>,
    pub dropped_groups: &'a str,
}

impl RuleArgs<'_> {
    /// The router kind these keywords name, or the error naming the keyword.
    pub(crate) fn kind(self) -> PyResult<RouterKind> {
        let rule = self.rule;
        let dropped_groups = match self.dropped_groups {
            "zero" => GroupMask::Zero,
            "neg_inf" => GroupMask::NegInf,
            other => {
                return Err(MoekitError::new_err(format!(
                    "route: dropped_groups {other:?} (expected \"zero\" (mlx-lm) or \"neg_inf\" (llama.cpp))"
                )))
            }
        };
        Ok(match rule {
            "softmax_topk" => RouterKind::SoftmaxTopK {
                norm_topk_prob: self.norm_topk_prob,
            },
            "topk_softmax" => RouterKind::TopKSoftmax,
            "gemma4" => RouterKind::Gemma4 {
                per_expert_scale: self.per_expert_scale.ok_or_else(|| {
                    MoekitError::new_err("route: rule \"gemma4\" needs per_expert_scale (one float per expert)")
                })?,
            },
            "grouped_softmax" | "grouped_sigmoid" => RouterKind::Grouped {
                scoring: if rule == "grouped_sigmoid" {
                    Scoring::Sigmoid
                } else {
                    Scoring::Softmax
                },
                bias: self.bias,
                n_group: self.n_group,
                topk_group: self.topk_group,
                dropped_groups,
                norm_topk_prob: self.norm_topk_prob,
                routed_scaling_factor: self.routed_scaling_factor,
            },
            other => {
                return Err(MoekitError::new_err(format!(
                    "route: rule {other:?} (expected softmax_topk, topk_softmax, gemma4, grouped_softmax or grouped_sigmoid)"
                )))
            }
        })
    }
}

/// Routes router logits `[T, E]` (float, CPU or CUDA): returns
/// `(topk_weights float32 [T, k], topk_ids int32 [T, k])` as `Array`s, as
/// vLLM's `fused_topk` does.
///
/// Rules (`rule`): `softmax_topk` (Qwen3-MoE with `norm_topk_prob`,
/// Qwen2-MoE and Qwen3-Next without), `topk_softmax` (Mixtral, gpt-oss),
/// `gemma4` (needs `per_expert_scale`), `grouped_softmax` (DeepSeek-V2),
/// `grouped_sigmoid` (DeepSeek-V3, GLM-4-MoE: `bias` =
/// `e_score_correction_bias`, `n_group`, `topk_group`,
/// `routed_scaling_factor`). Grouped rules: `dropped_groups` is the selection
/// key of the experts of the groups not kept, `"zero"` (mlx-lm: still
/// selectable, and ahead of kept experts whose biased score is negative) or
/// `"neg_inf"` (llama.cpp: never selected).
#[pyfunction]
#[pyo3(signature = (logits, top_k, rule="softmax_topk", norm_topk_prob=true, bias=None, n_group=1, topk_group=1, routed_scaling_factor=1.0, per_expert_scale=None, stream=None, dropped_groups="zero"))]
#[allow(clippy::too_many_arguments)]
pub fn route(
    py: Python<'_>,
    logits: &Bound<'_, PyAny>,
    top_k: usize,
    rule: &str,
    norm_topk_prob: bool,
    bias: Option<Vec<f32>>,
    n_group: usize,
    topk_group: usize,
    routed_scaling_factor: f32,
    per_expert_scale: Option<Vec<f32>>,
    stream: Option<usize>,
    dropped_groups: &str,
) -> PyResult<(Array, Array)> {
    let kind = RuleArgs {
        rule,
        norm_topk_prob,
        bias,
        n_group,
        topk_group,
        routed_scaling_factor,
        per_expert_scale,
        dropped_groups,
    }
    .kind()?;
    let (s, ready) = streams(crate::dlpack::device_hint(logits)?, stream)?;
    let logits = import(logits, "logits", Kind::Float, ready)?;
    let n_experts = logits.shape().get(1).copied().unwrap_or(0);
    let cfg = RouterConfig {
        kind,
        n_experts,
        top_k,
    };
    let device = logits.device();
    let r = py
        .detach(|| on_stream(device, stream, || moekit::ops::route::route(&logits, &cfg)))
        .map_err(err)?;
    let ids = crate::dlpack::ids_as_i32(r.ids).map_err(err)?;
    Ok((Array::new(r.weights, s), Array::new(ids, s)))
}

/// Quantizes float weights `w` (`[E, N, K]` or `[N, K]`, CPU) to `format`:
/// MLX affine (`affine4-g64`, `affine8-g32`, …; bit-exact `mx.quantize` of
/// `w` cast to `scale_dtype`, whose type the scales and biases take), MLX's
/// `mlx-mxfp4`, `mlx-nvfp4`, `mlx-mxfp8` (byte-exact `mx.quantize(w,
/// mode=...)` of `w` as f32, MLX 0.32.4; `u8` scales, `scale_dtype` unused;
/// K a multiple of 32), GGUF `q4_0`, `q4_1`, `q5_0`, `q5_1`, `q8_0`
/// (byte-exact gguf-py), or dense `f32`/`f16`/`bf16`. Returns an `Experts`
/// on the CPU (`.to("cuda")` moves it).
#[pyfunction]
#[pyo3(signature = (w, format, scale_dtype="bfloat16"))]
pub fn quantize(
    py: Python<'_>,
    w: &Bound<'_, PyAny>,
    format: &str,
    scale_dtype: &str,
) -> PyResult<Experts> {
    let f = WeightFormat::parse(format).map_err(err)?;
    let sd = parse_dtype("quantize: scale_dtype", scale_dtype)?;
    let t = import(w, "w", Kind::Float, None)?;
    if t.device() != Device::Cpu {
        return Err(MoekitError::new_err(format!(
            "quantize: w is on {}; quantizers run on the CPU (pass w.cpu())",
            t.device()
        )));
    }
    let (e, n, k) = match *t.shape() {
        [e, n, k] => (e, n, k),
        [n, k] => (1, n, k),
        ref s => {
            return Err(MoekitError::new_err(format!(
                "quantize: w has shape {s:?} (expected [E, N, K] or [N, K])"
            )))
        }
    };
    let w = py
        .detach(|| -> moekit::Result<QuantWeights> {
            let v = t.to_f32_vec()?;
            quantize_f32(&v, f, sd, (e, n, k))
        })
        .map_err(err)?;
    Ok(Experts { w })
}

fn quantize_f32(
    v: &[f32],
    f: WeightFormat,
    sd: DType,
    (e, n, k): (usize, usize, usize),
) -> moekit::Result<QuantWeights> {
    let (_, shape, sshape) = storage_shapes(f, e, n, k)?;
    let sshape = sshape.unwrap_or_default();
    match f {
        WeightFormat::Dense(d) => {
            QuantWeights::new(f, e, n, k, Tensor::from_f32(v, &shape, d)?, None, None)
        }
        WeightFormat::Affine(p) => {
            let (packed, s, b) = match sd {
                DType::F32 => {
                    let q = affine::quantize::<f32>(v, e * n, k, p.bits, p.group_size)?;
                    (
                        q.packed,
                        Tensor::from_slice(&q.scales, &sshape)?,
                        Tensor::from_slice(&q.biases, &sshape)?,
                    )
                }
                DType::F16 => {
                    let q = affine::quantize::<f16>(v, e * n, k, p.bits, p.group_size)?;
                    (
                        q.packed,
                        Tensor::from_slice(&q.scales, &sshape)?,
                        Tensor::from_slice(&q.biases, &sshape)?,
                    )
                }
                _ => {
                    let q = affine::quantize::<bf16>(v, e * n, k, p.bits, p.group_size)?;
                    (
                        q.packed,
                        Tensor::from_slice(&q.scales, &sshape)?,
                        Tensor::from_slice(&q.biases, &sshape)?,
                    )
                }
            };
            QuantWeights::new(
                f,
                e,
                n,
                k,
                Tensor::from_slice(&packed, &shape)?,
                Some(s),
                Some(b),
            )
        }
        WeightFormat::Ggml(ty) => {
            let row_bytes = k / ty.block_size() * ty.type_size();
            let mut bytes = vec![0u8; e * n * row_bytes];
            for (src, dst) in v.chunks_exact(k).zip(bytes.chunks_exact_mut(row_bytes)) {
                ggml::quantize_row(ty, src, dst)?;
            }
            QuantWeights::new(f, e, n, k, Tensor::from_slice(&bytes, &shape)?, None, None)
        }
        WeightFormat::MlxFp(mode) => {
            let q = moekit::format::mlxfp::quantize(mode, v, e * n, k)?;
            let (packed, scales) = (
                Tensor::from_slice(&q.packed, &shape)?,
                Tensor::from_slice(&q.scales, &sshape)?,
            );
            QuantWeights::new(f, e, n, k, packed, Some(scales), None)
        }
        other => Err(moekit::Error::Invalid {
            op: "quantize",
            arg: "format",
            expected: "an MLX affine or fp (mlx-mxfp4/-nvfp4/-mxfp8), GGUF \
                       Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 or dense format"
                .into(),
            got: other.to_string(),
        }),
    }
}
