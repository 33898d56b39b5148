//! Runs one MoE layer of a checkpoint on the CPU and prints what came out.
//!
//! ```text
//! cargo run --release -p moekit --example run_layer -- [PATH] [LAYER] [TOKENS]
//! ```
//!
//! `PATH` is a `.gguf` file or a safetensors directory (default: a small
//! Qwen3-MoE fixture of this repository); `LAYER` a transformer block with an
//! MoE layer (default: the first); `TOKENS` the number of input rows
//! (default 4). The input is deterministic, `x[t, j] = 0.5·sin(0.37·(t·H + j))`,
//! standing in for the rows the attention block and its norm would hand over;
//! the output is the layer's contribution to the residual stream.
//!
//! Prints the checkpoint's MoE configuration, the output shape, and a
//! checksum (sum and sum of absolute values of the output) that is the same
//! on every run.

use moekit::{open, DType, Tensor};
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/gguf/qwen3moe_kquant.gguf")
    });
    let ckpt = open(&path)?;
    let s = ckpt.summary();
    let layer = match args.next() {
        Some(l) => l.parse()?,
        None => *s
            .moe_layers
            .first()
            .ok_or("the checkpoint has no MoE layer")?,
    };
    let tokens: usize = match args.next() {
        Some(t) => t.parse()?,
        None => 4,
    };
    println!("{}: {} ({})", path.display(), s.arch, ckpt.file_format());
    println!(
        "  E = {} experts, k = {}, H = {}, I = {}, router: {}",
        s.n_experts, s.top_k, s.hidden, s.intermediate, s.router
    );

    // Builds the block on the CPU: the expert weights stay zero-copy views of
    // the mapped file. `block.to_device(Device::Cuda(0))` would move it.
    let block = ckpt.moe_block(layer, &|_done, _total| {})?;
    let h = block.hidden();
    let x: Vec<f32> = (0..tokens * h)
        .map(|i| 0.5 * (0.37 * i as f32).sin())
        .collect();
    let x = Tensor::from_f32(&x, &[tokens, h], DType::F32)?;

    let t0 = std::time::Instant::now();
    let y = block.forward(&x)?;
    let ms = t0.elapsed().as_secs_f64() * 1e3;

    let v = y.to_f32_vec()?;
    let sum: f64 = v.iter().map(|&a| a as f64).sum();
    let abs: f64 = v.iter().map(|&a| a.abs() as f64).sum();
    println!(
        "layer {layer}: input {:?} -> output {:?} {} in {ms:.1} ms",
        x.shape(),
        y.shape(),
        y.dtype()
    );
    println!("checksum: sum = {sum:.6e}, sum|y| = {abs:.6e}");
    Ok(())
}
