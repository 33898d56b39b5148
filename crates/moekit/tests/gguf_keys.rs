//! A GGUF file's size keys must agree with its tensors' shapes: each test
//! edits one key of a committed fixture and expects an error naming the file,
//! the key, the tensor and both values.

mod common_util;

use common_util::fixture;
use moekit::load::gguf::{GgufCheckpoint, SharedBytes};
use std::path::Path;
use std::sync::Arc;

fn read(name: &str) -> Vec<u8> {
    std::fs::read(fixture(&format!("gguf/{name}.gguf"))).expect("fixture")
}

/// Sets the integer metadata value of `key` (u32, i32, u64 or i64) to `v`.
fn set_key(bytes: &mut [u8], key: &str, v: u64) {
    let mut pat = (key.len() as u64).to_le_bytes().to_vec();
    pat.extend_from_slice(key.as_bytes());
    let at = bytes
        .windows(pat.len())
        .position(|w| w == pat.as_slice())
        .unwrap_or_else(|| panic!("key {key} not in the fixture"))
        + pat.len();
    let ty = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
    let val = at + 4;
    match ty {
        4 | 5 => bytes[val..val + 4].copy_from_slice(&(v as u32).to_le_bytes()),
        10 | 11 => bytes[val..val + 8].copy_from_slice(&v.to_le_bytes()),
        t => panic!("{key} has GGUF type {t}"),
    }
}

/// The error of opening `bytes` (named `edited.gguf`).
fn open_err(bytes: Vec<u8>) -> String {
    match GgufCheckpoint::parse(Arc::new(bytes) as SharedBytes, Path::new("edited.gguf")) {
        Ok(_) => panic!("a mismatched size key was accepted"),
        Err(e) => e.to_string(),
    }
}

fn edited(name: &str, key: &str, v: u64) -> String {
    let mut b = read(name);
    set_key(&mut b, key, v);
    open_err(b)
}

fn has_all(e: &str, parts: &[&str]) {
    for p in parts {
        assert!(e.contains(p), "error lacks {p:?}: {e}");
    }
}

#[test]
fn fixtures_agree_with_their_keys() {
    for name in ["qwen3moe_f32", "qwen3next_fused_q8_0", "deepseek2_v3"] {
        GgufCheckpoint::parse(Arc::new(read(name)) as SharedBytes, Path::new("f.gguf"))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn router_sizes_are_checked() {
    let e = edited("qwen3moe_f32", "qwen3moe.expert_count", 8);
    has_all(
        &e,
        &[
            "edited.gguf",
            "`qwen3moe.expert_count` = 8",
            "`blk.0.ffn_gate_inp.weight`",
            "ne[1] (experts) = 4",
        ],
    );
    let e = edited("qwen3moe_f32", "qwen3moe.embedding_length", 128);
    has_all(
        &e,
        &[
            "`qwen3moe.embedding_length` = 128",
            "`blk.0.ffn_gate_inp.weight`",
            "= 256",
        ],
    );
}

#[test]
fn expert_and_shared_intermediate_sizes_are_checked() {
    let e = edited("qwen3moe_f32", "qwen3moe.expert_feed_forward_length", 5);
    has_all(
        &e,
        &[
            "`qwen3moe.expert_feed_forward_length` = 5",
            "`blk.0.ffn_gate_exps.weight`",
            "= 4",
        ],
    );
    let e = edited(
        "qwen3next_fused_q8_0",
        "qwen3next.expert_feed_forward_length",
        64,
    );
    has_all(
        &e,
        &["`blk.0.ffn_gate_up_exps.weight`", "ne[1] / 2", "= 32"],
    );
    let e = edited("mixtral_per_expert", "llama.expert_feed_forward_length", 16);
    has_all(&e, &["`blk.0.ffn_gate.0.weight`", "= 32"]);
    let e = edited(
        "qwen2moe_q4_0",
        "qwen2moe.expert_shared_feed_forward_length",
        64,
    );
    has_all(
        &e,
        &[
            "`qwen2moe.expert_shared_feed_forward_length` = 64",
            "`blk.0.ffn_gate_shexp.weight`",
            "= 32",
        ],
    );
}

#[test]
fn top_k_and_groups_are_checked() {
    for k in [0, 5] {
        let e = edited("qwen3moe_f32", "qwen3moe.expert_used_count", k);
        has_all(
            &e,
            &[
                &format!("`qwen3moe.expert_used_count` = {k}"),
                "`blk.0.ffn_gate_inp.weight`",
                "1..=4",
            ],
        );
    }
    let e = edited("deepseek2_v3", "deepseek2.expert_group_count", 3);
    has_all(
        &e,
        &[
            "`deepseek2.expert_group_count` = 3",
            "8 experts",
            "ffn_gate_inp",
        ],
    );
    let e = edited("deepseek2_v3", "deepseek2.expert_group_used_count", 5);
    has_all(
        &e,
        &[
            "`deepseek2.expert_group_used_count` = 5",
            "`deepseek2.expert_group_count` = 4",
        ],
    );
    let mut b = read("deepseek2_v3");
    set_key(&mut b, "deepseek2.expert_used_count", 5);
    let e = open_err(b);
    has_all(&e, &["`deepseek2.expert_used_count` = 5", "hold only 4"]);
}
