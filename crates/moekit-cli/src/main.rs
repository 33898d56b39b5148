//! The `moekit` command-line tool.
//!
//! * `moekit run` — runs one MoE layer of a real checkpoint (the main job).
//! * `moekit inspect` — shows what a checkpoint holds.
//! * `moekit bench` — times whole MoE blocks of real model shapes on synthetic
//!   weights against the machine's measured memory bandwidth.

#![deny(clippy::unwrap_used, clippy::expect_used)]

mod bench;
mod presets;
mod run;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "moekit",
    version,
    about = "Mixture-of-Experts layers of quantized LLMs at the speed limit of the hardware"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Time the MoE block of a model preset on synthetic weights.
    Bench(bench::BenchArgs),
    /// Run one MoE layer of a GGUF file or safetensors directory.
    Run(run::RunArgs),
    /// Show a checkpoint's architecture, MoE config and tensors.
    Inspect(run::InspectArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Bench(a) => bench::run(&a),
        Cmd::Run(a) => run::run(&a),
        Cmd::Inspect(a) => run::inspect(&a),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("moekit: error: {e}");
            ExitCode::FAILURE
        }
    }
}
