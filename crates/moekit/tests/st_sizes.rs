//! A safetensors checkpoint's `config.json` sizes must agree with its
//! tensors' shapes: each test edits one key of a committed fixture and
//! expects an error naming the file, the key, the tensor and both values.
//! Also: a header claiming more than the file holds allocates nothing.

mod common_util;

use common_util::fixture;
use moekit::load::safetensors::{self, SafetensorsCheckpoint};
use moekit::load::Checkpoint;
use serde_json::{json, Value};
use std::fs;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A copy of fixture directory `st/<name>`, removed on drop.
struct Case(PathBuf);

impl Case {
    fn new(name: &str) -> Case {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "moekit_st_sizes_{}_{}_{name}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        for e in fs::read_dir(fixture(&format!("st/{name}"))).unwrap() {
            let e = e.unwrap();
            fs::copy(e.path(), dir.join(e.file_name())).unwrap();
        }
        Case(dir)
    }

    fn set(self, key: &str, v: Value) -> Case {
        let p = self.0.join("config.json");
        let mut c: Value = serde_json::from_str(&fs::read_to_string(&p).unwrap()).unwrap();
        c[key] = v;
        fs::write(&p, serde_json::to_string_pretty(&c).unwrap()).unwrap();
        self
    }

    fn open(&self) -> moekit::Result<SafetensorsCheckpoint> {
        safetensors::open(&self.0)
    }

    /// The error of building MoE block 1 (every fixture's reference layer).
    fn block_err(&self) -> String {
        match self.open() {
            Err(e) => panic!("open failed: {e}"),
            Ok(ck) => match ck.moe_block(1, &|_, _| {}) {
                Ok(_) => panic!("a mismatched size was accepted"),
                Err(e) => e.to_string(),
            },
        }
    }
}

impl Drop for Case {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn has_all(e: &str, parts: &[&str]) {
    for p in parts {
        assert!(e.contains(p), "error lacks {p:?}: {e}");
    }
}

#[test]
fn unedited_fixtures_build() {
    for name in [
        "qwen3_moe_mlx_q4",
        "mixtral_hf",
        "qwen2_moe_mlx_q4",
        "deepseek_v2_hf",
    ] {
        let c = Case::new(name);
        let ck = c.open().unwrap();
        ck.moe_block(1, &|_, _| {}).unwrap();
    }
}

#[test]
fn expert_count_and_hidden_size_are_checked_against_the_router() {
    let e = Case::new("qwen3_moe_mlx_q4")
        .set("num_experts", json!(16))
        .block_err();
    has_all(
        &e,
        &[
            "model.safetensors",
            "`model.layers.1.mlp.gate.weight`",
            "[8, 16]",
            "expected u32 [16, 16]",
            "`num_experts` = 16",
            "config.json",
        ],
    );
    let e = Case::new("mixtral_hf")
        .set("hidden_size", json!(128))
        .block_err();
    has_all(
        &e,
        &[
            "`model.layers.1.block_sparse_moe.gate.weight`",
            "bf16 [4, 64]",
            "expected bf16 [4, 128]",
            "`hidden_size` = 128",
        ],
    );
}

#[test]
fn intermediate_sizes_are_checked_against_the_experts() {
    let e = Case::new("qwen3_moe_mlx_q4")
        .set("moe_intermediate_size", json!(32))
        .block_err();
    has_all(
        &e,
        &[
            "`model.layers.1.mlp.switch_mlp.gate_proj.weight`",
            "[8, 64, 8]",
            "[8, 32, 8]",
            "experts `num_experts` = 8",
            "`moe_intermediate_size` = 32",
        ],
    );
    let e = Case::new("qwen2_moe_mlx_q4")
        .set("shared_expert_intermediate_size", json!(32))
        .block_err();
    has_all(
        &e,
        &[
            "shared_expert.gate_proj.weight",
            "`shared_expert_intermediate_size` = 32",
        ],
    );
    let e = Case::new("deepseek_v2_hf")
        .set("n_shared_experts", json!(2))
        .block_err();
    has_all(
        &e,
        &[
            "shared_experts.gate_proj.weight",
            "bf16 [32, 64]",
            "expected bf16 [64, 64]",
            "`n_shared_experts × moe_intermediate_size` = 64",
        ],
    );
}

#[test]
fn per_expert_checkpoints_check_the_expert_count() {
    let e = Case::new("mixtral_hf")
        .set("num_local_experts", json!(3))
        .block_err();
    has_all(
        &e,
        &[
            "`model.layers.1.block_sparse_moe.gate.weight`",
            "bf16 [4, 64]",
            "`num_local_experts` = 3",
        ],
    );
    // Five experts claimed, four stored: the router is [4, H] and says so.
    let e = Case::new("mixtral_hf")
        .set("num_local_experts", json!(5))
        .block_err();
    has_all(&e, &["gate.weight", "`num_local_experts` = 5"]);
}

#[test]
fn top_k_must_not_exceed_the_experts() {
    let c = Case::new("qwen3_moe_mlx_q4").set("num_experts_per_tok", json!(9));
    let e = c.open().map(|_| ()).unwrap_err().to_string();
    has_all(
        &e,
        &[
            "config.json",
            "`num_experts_per_tok`",
            "`num_experts` = 8",
            "got 9",
        ],
    );
    let c = Case::new("qwen3_moe_mlx_q4").set("num_experts_per_tok", json!(0));
    let e = c.open().map(|_| ()).unwrap_err().to_string();
    has_all(&e, &["`num_experts_per_tok`", "got 0"]);
}

#[test]
fn header_lengths_beyond_the_file_are_refused() {
    // The header claims 90 MB (under the safetensors crate's 100 MB cap) in
    // a 1 KB file: refused from the file's size, nothing read or reserved.
    let c = Case::new("mixtral_hf");
    let p = c.0.join("model.safetensors");
    let mut b = (90_000_000u64).to_le_bytes().to_vec();
    b.extend_from_slice(&[b' '; 1024]);
    fs::write(&p, &b).unwrap();
    let e = c.open().map(|_| ()).unwrap_err().to_string();
    has_all(&e, &["model.safetensors", "not a valid safetensors file"]);
    b[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    fs::write(&p, &b).unwrap();
    let e = c.open().map(|_| ()).unwrap_err().to_string();
    has_all(&e, &["model.safetensors", "header"]);
}
