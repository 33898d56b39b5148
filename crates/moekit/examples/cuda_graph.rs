//! Loads one MoE layer to a CUDA GPU, captures its forward pass in a CUDA
//! graph, replays the graph with new inputs and times the replays.
//!
//! ```text
//! cargo run --release -p moekit --example cuda_graph -- [PATH] [LAYER] [TOKENS]
//! ```
//!
//! Arguments as for the `run_layer` example (default: a small Qwen3-MoE
//! fixture, its first MoE layer, 4 tokens). Activations are bf16. Without a
//! CUDA device it prints why and exits 0.
//!
//! A graph reads its inputs and writes its outputs at the addresses used
//! during capture: the input and output tensors are allocated once, and each
//! new input is copied into the same input tensor before a replay.

use moekit::cuda::{self, bench, graph};
use moekit::{open, DType, Device, Tensor};
use std::path::PathBuf;

fn input(tokens: usize, h: usize, seed: usize) -> moekit::Result<Tensor> {
    let x: Vec<f32> = (0..tokens * h)
        .map(|i| 0.5 * (0.37 * (i + seed * 7919) as f32).sin())
        .collect();
    Tensor::from_f32(&x, &[tokens, h], DType::Bf16)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if let Err(why) = cuda::available() {
        println!("no CUDA device: {why}; nothing to run");
        return Ok(());
    }
    let mut args = std::env::args().skip(1);
    let path = args.next().map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/gguf/qwen3moe_kquant.gguf")
    });
    let ckpt = open(&path)?;
    let layer = match args.next() {
        Some(l) => l.parse()?,
        None => *ckpt
            .summary()
            .moe_layers
            .first()
            .ok_or("the checkpoint has no MoE layer")?,
    };
    let tokens: usize = match args.next() {
        Some(t) => t.parse()?,
        None => 4,
    };

    let dev = cuda::device(0)?;
    let gpu = Device::Cuda(0);
    println!("{} ({:?})", dev.name(), dev.arch());
    let block = ckpt.moe_block(layer, &|_, _| {})?.to_device(gpu)?;
    let h = block.hidden();

    // Fixed input and output buffers on the device.
    let mut x = input(tokens, h, 0)?.to_device(gpu)?;
    let mut out = Tensor::zeros_on(DType::Bf16, &[tokens, h], gpu)?;
    let step = |x: &Tensor, out: &mut Tensor| -> moekit::Result<()> {
        let y = block.forward(x)?;
        out.copy_from(&y)
    };

    // Warm-up outside the capture: compiles (or loads from the disk cache)
    // every kernel the forward needs.
    step(&x, &mut out)?;
    dev.synchronize()?;
    let before = cuda::launch_count();
    step(&x, &mut out)?;
    let launches = cuda::launch_count() - before;
    let eager_ms = bench::time_ms(&dev, 50, || step(&x, &mut out))?;

    let g = graph::capture(&dev, || step(&x, &mut out))?;

    // Replays see new inputs copied into `x`; check one against an eager run.
    let x1 = input(tokens, h, 1)?;
    x.copy_from(&x1.to_device(gpu)?)?;
    g.replay()?;
    let replayed = out.to_device(Device::Cpu)?.to_f32_vec()?;
    let eager = block.forward(&x)?.to_device(Device::Cpu)?.to_f32_vec()?;
    let diff = replayed
        .iter()
        .zip(&eager)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);

    let graph_ms = bench::time_ms(&dev, 200, || g.replay())?;
    println!("layer {layer}: {tokens} tokens x H = {h}, {launches} kernel launches per forward");
    println!("eager forward: {eager_ms:.4} ms (median of 50)");
    println!("graph replay:  {graph_ms:.4} ms (median of 200)");
    println!("max |replay - eager| on a new input: {diff:.3e}");
    Ok(())
}
