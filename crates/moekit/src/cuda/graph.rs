//! CUDA graphs: record everything a closure enqueues on a device's stream
//! once, then replay it with a single launch.
//!
//! Inputs are read and outputs written at the addresses used during capture:
//! allocate them before capturing, and between replays copy new inputs into
//! the same tensors ([`Tensor::copy_from`](crate::Tensor::copy_from)).

use super::CudaDevice;
use crate::error::{cuda_err, Error, Result};
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::CudaGraph;
use std::sync::Arc;

/// An instantiated, replayable graph.
pub struct Graph {
    graph: CudaGraph,
    dev: Arc<CudaDevice>,
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Graph(cuda:{})", self.dev.ordinal())
    }
}

/// Captures the work `f` enqueues on `dev`'s stream. Fails if `f` fails or
/// does anything a graph cannot hold (a host synchronization, for one).
pub fn capture(dev: &Arc<CudaDevice>, f: impl FnOnce() -> Result<()>) -> Result<Graph> {
    dev.stream()
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .map_err(cuda_err("begin_capture"))?;
    let r = f();
    // Always end the capture, so the stream is usable again after an error.
    let g = dev
        .stream()
        .end_capture(CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)
        .map_err(cuda_err("end_capture"));
    r?;
    let graph = g?.ok_or_else(|| Error::NoCuda("stream capture produced no graph".into()))?;
    Ok(Graph {
        graph,
        dev: dev.clone(),
    })
}

impl Graph {
    /// Enqueues one replay on the device's stream.
    pub fn replay(&self) -> Result<()> {
        self.graph.launch().map_err(cuda_err("graph launch"))
    }

    /// The device.
    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.dev
    }
}
