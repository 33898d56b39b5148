//! Checkpoints and their MoE layers as Python objects.

use crate::dlpack::{import, Array, Kind};
use crate::ops::Experts;
use crate::{err, on_stream, parse_device, parse_dtype, streams, MoekitError};
use moekit::format::QuantWeights;
use moekit::moe::{MoeBlockParts, SharedExpert};
use moekit::ops::act::GateUp;
use moekit::{DType, Device, MoeBlock, MoePath, Tensor, WeightFormat};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::PathBuf;

/// A GGUF file or safetensors directory, opened (memory-mapped).
#[pyclass(module = "moekit._moekit", unsendable)]
pub struct Checkpoint {
    path: PathBuf,
    inner: Box<dyn moekit::Checkpoint>,
}

/// Opens a `.gguf` file or a safetensors directory.
#[pyfunction]
pub fn open(path: PathBuf) -> PyResult<Checkpoint> {
    let inner = moekit::open(&path).map_err(err)?;
    Ok(Checkpoint { path, inner })
}

#[pymethods]
impl Checkpoint {
    /// The MoE configuration: a dict with `arch`, `n_layers`, `moe_layers`,
    /// `n_experts`, `top_k`, `hidden`, `intermediate`, `router`, `shared`,
    /// `file_format`.
    #[getter]
    fn summary<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.summary();
        let d = PyDict::new(py);
        d.set_item("file_format", self.inner.file_format())?;
        d.set_item("arch", &s.arch)?;
        d.set_item("n_layers", s.n_layers)?;
        d.set_item("moe_layers", s.moe_layers.clone())?;
        d.set_item("n_experts", s.n_experts)?;
        d.set_item("top_k", s.top_k)?;
        d.set_item("hidden", s.hidden)?;
        d.set_item("intermediate", s.intermediate)?;
        d.set_item("router", &s.router)?;
        d.set_item("shared", s.shared.clone())?;
        Ok(d)
    }

    /// Indices of the transformer blocks that have an MoE layer.
    #[getter]
    fn moe_layers(&self) -> Vec<usize> {
        self.inner.summary().moe_layers.clone()
    }

    /// Every tensor: a list of `(name, format, shape, bytes)`.
    fn tensors(&self) -> Vec<(String, String, Vec<usize>, usize)> {
        self.inner
            .tensors()
            .into_iter()
            .map(|t| (t.name, t.format, t.shape, t.bytes))
            .collect()
    }

    /// The MoE layer of transformer block `layer` on `device` (`cpu`,
    /// `cuda`, `cuda:N`). `dtype` (`float32`, `float16`, `bfloat16`)
    /// converts the dense (unquantized) expert weights to that type;
    /// quantized experts and the router keep theirs. None keeps the file's.
    #[pyo3(signature = (layer, device="cpu", dtype=None))]
    fn moe_layer(
        &self,
        py: Python<'_>,
        layer: usize,
        device: &str,
        dtype: Option<&str>,
    ) -> PyResult<Layer> {
        let device = parse_device("moe_layer: device", device)?;
        let dtype = dtype.map(|d| parse_dtype("moe_layer", d)).transpose()?;
        let block = self.inner.moe_block(layer, &|_, _| {}).map_err(err)?;
        let block = match dtype {
            Some(d) => with_dense_dtype(&block, d).map_err(err)?,
            None => block,
        };
        let block = py.detach(|| block.to_device(device)).map_err(err)?;
        Ok(Layer {
            block,
            device,
            layer,
        })
    }

    fn __repr__(&self) -> String {
        let s = self.inner.summary();
        format!(
            "moekit.Checkpoint({:?}, arch={}, moe_layers={}, experts={} top-{}, hidden={})",
            self.path.display().to_string(),
            s.arch,
            s.moe_layers.len(),
            s.n_experts,
            s.top_k,
            s.hidden
        )
    }
}

/// `w` with dense float weights converted to `d` (other formats as they are).
fn to_dense_dtype(w: &QuantWeights, d: DType) -> moekit::Result<QuantWeights> {
    match w.format() {
        WeightFormat::Dense(f) if f != d => QuantWeights::new(
            WeightFormat::Dense(d),
            w.n_experts(),
            w.rows(),
            w.cols(),
            w.data().to_dtype(d)?,
            None,
            None,
        ),
        _ => Ok(w.clone()),
    }
}

fn gate_up_dtype(g: &GateUp, d: DType) -> moekit::Result<GateUp> {
    match g {
        GateUp::Separate { gate, up } => {
            GateUp::separate(to_dense_dtype(gate, d)?, to_dense_dtype(up, d)?)
        }
        GateUp::Fused(w) => GateUp::fused(to_dense_dtype(w, d)?),
    }
}

/// The block with its dense expert weights (routed and shared) in `d`.
fn with_dense_dtype(b: &MoeBlock, d: DType) -> moekit::Result<MoeBlock> {
    let p = b.parts();
    let shared = match &p.shared {
        Some(s) => Some(SharedExpert {
            gate_up: gate_up_dtype(&s.gate_up, d)?,
            down: to_dense_dtype(&s.down, d)?,
            gate: s.gate.clone(),
        }),
        None => None,
    };
    MoeBlock::new(MoeBlockParts {
        router: p.router.clone(),
        router_weight: p.router_weight.clone(),
        gate_up: gate_up_dtype(&p.gate_up, d)?,
        down: to_dense_dtype(&p.down, d)?,
        shared,
        ffn: p.ffn.clone(),
    })
}

fn parse_path(s: &str) -> PyResult<MoePath> {
    match s {
        "auto" => Ok(MoePath::Auto),
        "general" => Ok(MoePath::General),
        "decode" => Ok(MoePath::Decode),
        "tensor_core" | "tc" => Ok(MoePath::TensorCore),
        other => Err(MoekitError::new_err(format!(
            "path: {other:?} (expected auto, general, decode or tensor_core)"
        ))),
    }
}

/// One MoE layer (router, routed experts, shared expert) on a device.
#[pyclass(module = "moekit._moekit", frozen)]
pub struct Layer {
    block: MoeBlock,
    device: Device,
    layer: usize,
}

impl Layer {
    fn check_device(&self, what: &str, t: &Tensor) -> PyResult<()> {
        if t.device() != self.device {
            return Err(MoekitError::new_err(format!(
                "{what}: a tensor on {} but the layer is on {} (move one of them)",
                t.device(),
                self.device
            )));
        }
        Ok(())
    }
}

#[pymethods]
impl Layer {
    /// A layer from your own weights (`Experts`, all on one device):
    /// `router [1, E, H]`, `gate` and `up` `[E, I, H]` (or `gate_up`
    /// `[E, 2I, H]` with `up=None`), `down [E, H, I]`; routing `rule` with
    /// `top_k` and the rule's parameters as in `moekit.route`. No shared expert.
    #[staticmethod]
    #[pyo3(signature = (router, gate, up, down, top_k, rule="softmax_topk", norm_topk_prob=true, bias=None, n_group=1, topk_group=1, routed_scaling_factor=1.0, per_expert_scale=None, dropped_groups="zero"))]
    #[allow(clippy::too_many_arguments)]
    fn from_parts(
        router: &Experts,
        gate: &Experts,
        up: Option<&Experts>,
        down: &Experts,
        top_k: usize,
        rule: &str,
        norm_topk_prob: bool,
        bias: Option<Vec<f32>>,
        n_group: usize,
        topk_group: usize,
        routed_scaling_factor: f32,
        per_expert_scale: Option<Vec<f32>>,
        dropped_groups: &str,
    ) -> PyResult<Layer> {
        let kind = crate::ops::RuleArgs {
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
        let gate_up = match up {
            Some(u) => GateUp::separate(gate.w.clone(), u.w.clone()),
            None => GateUp::fused(gate.w.clone()),
        }
        .map_err(err)?;
        let n_experts = gate_up.n_experts();
        let block = MoeBlock::new(MoeBlockParts {
            router: moekit::ops::route::RouterConfig {
                kind,
                n_experts,
                top_k,
            },
            router_weight: router.w.clone(),
            gate_up,
            down: down.w.clone(),
            shared: None,
            ffn: Default::default(),
        })
        .map_err(err)?;
        let device = block.device();
        for (what, d) in [("router", router.w.device()), ("gate", gate.w.device())] {
            if d != device {
                return Err(MoekitError::new_err(format!(
                    "Layer.from_parts: {what} is on {d}, down on {device} (put every part on one device)"
                )));
            }
        }
        Ok(Layer {
            block,
            device,
            layer: 0,
        })
    }

    /// Runs the layer on `x [T, hidden]` (f32/f16/bf16, on the layer's
    /// device). With `out` (`[T, hidden]`, x's dtype and device) writes it
    /// in place and returns None — on CUDA without a copy on the fused
    /// paths; else returns a new `Array`. `stream`: the raw CUDA stream to
    /// run on (the caller's current stream); None: moekit's own. `path`
    /// forces an implementation (`auto`, `general`, `decode`,
    /// `tensor_core`).
    #[pyo3(signature = (x, out=None, stream=None, path="auto"))]
    fn forward(
        &self,
        py: Python<'_>,
        x: &Bound<'_, PyAny>,
        out: Option<&Bound<'_, PyAny>>,
        stream: Option<usize>,
        path: &str,
    ) -> PyResult<Option<Array>> {
        let path = parse_path(path)?;
        let (s, ready) = streams(self.device, stream)?;
        let x = import(x, "x", Kind::Float, ready)?;
        self.check_device("x", &x)?;
        let mut out = out
            .map(|o| import(o, "out", Kind::Float, ready))
            .transpose()?;
        if let Some(o) = &out {
            self.check_device("out", o)?;
        }
        let block = &self.block;
        py.detach(|| {
            on_stream(self.device, stream, || match (out.as_mut(), path) {
                (Some(o), MoePath::Auto) => block.forward_into(&x, o).map(|_| None),
                (Some(o), p) => {
                    let backend = moekit::Backend::for_device(x.device())?;
                    let y = block.forward_with(backend, p, &x)?.out;
                    o.copy_from(&y).map(|_| None)
                }
                (None, p) => {
                    let backend = moekit::Backend::for_device(x.device())?;
                    block.forward_with(backend, p, &x).map(|t| Some(t.out))
                }
            })
        })
        .map_err(err)
        .map(|y| y.map(|t| Array::new(t, s)))
    }

    /// Runs the layer and returns `(y, weights, ids)`: the output and the
    /// routing (`float32 [T, k]`, `int32 [T, k]`), as `Array`s.
    #[pyo3(signature = (x, stream=None))]
    fn forward_with_routing(
        &self,
        py: Python<'_>,
        x: &Bound<'_, PyAny>,
        stream: Option<usize>,
    ) -> PyResult<(Array, Array, Array)> {
        let (s, ready) = streams(self.device, stream)?;
        let x = import(x, "x", Kind::Float, ready)?;
        self.check_device("x", &x)?;
        let block = &self.block;
        let tr = py
            .detach(|| {
                on_stream(self.device, stream, || {
                    block.forward_on(moekit::Backend::for_device(x.device())?, &x)
                })
            })
            .map_err(err)?;
        let a = |t| Array::new(t, s);
        let ids = crate::dlpack::ids_as_i32(tr.routing.ids).map_err(err)?;
        Ok((a(tr.out), a(tr.routing.weights), a(ids)))
    }

    /// Which implementation `forward` runs for `tokens` rows of `dtype`, and
    /// why each other one refused: `(path, {path: reason})`.
    #[pyo3(signature = (tokens, dtype="bfloat16"))]
    fn plan(&self, tokens: usize, dtype: &str) -> PyResult<(String, Vec<(String, String)>)> {
        let dtype = parse_dtype("plan", dtype)?;
        let h = self.block.hidden();
        let x = Tensor::zeros_on(dtype, &[tokens, h], self.device).map_err(err)?;
        let backend = moekit::Backend::for_device(self.device).map_err(err)?;
        let p = moekit::plan::plan(self.block.parts(), backend, &x, MoePath::Auto).map_err(err)?;
        let refused = p
            .refused
            .iter()
            .map(|(path, why)| (format!("{path:?}"), why.clone()))
            .collect();
        Ok((format!("{:?}", p.path), refused))
    }

    /// Hidden size.
    #[getter]
    fn hidden(&self) -> usize {
        self.block.hidden()
    }
    /// Number of routed experts.
    #[getter]
    fn n_experts(&self) -> usize {
        self.block.parts().router.n_experts
    }
    /// Experts per token.
    #[getter]
    fn top_k(&self) -> usize {
        self.block.parts().router.top_k
    }
    /// Expert intermediate size.
    #[getter]
    fn intermediate(&self) -> usize {
        self.block.parts().gate_up.intermediate()
    }
    /// `cpu` or `cuda:N`.
    #[getter]
    fn device(&self) -> String {
        self.device.to_string()
    }
    /// The weight formats: `{"router": …, "gate_up": …, "down": …}`.
    #[getter]
    fn formats(&self) -> Vec<(String, String)> {
        let p = self.block.parts();
        let f = |w: &QuantWeights| w.format().to_string();
        let gu = match &p.gate_up {
            GateUp::Separate { gate, up } if gate.format() != up.format() => {
                format!("{} / {}", f(gate), f(up))
            }
            GateUp::Separate { gate, .. } => f(gate),
            GateUp::Fused(w) => f(w),
        };
        vec![
            ("router".into(), f(&p.router_weight)),
            ("gate_up".into(), gu),
            ("down".into(), f(&p.down)),
        ]
    }

    fn __repr__(&self) -> String {
        format!(
            "moekit.Layer(layer={}, experts={} top-{}, hidden={}, intermediate={}, device={})",
            self.layer,
            self.n_experts(),
            self.top_k(),
            self.hidden(),
            self.intermediate(),
            self.device
        )
    }
}
