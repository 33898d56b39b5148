//! GGUF block formats against gguf-py (`gguf.quants`, see
//! `scripts/fixtures/ggml.py`, which writes `fixtures/ggml/`).
//!
//! Thresholds: dequantization must equal gguf-py *bit for bit* in f32
//! (compared as `u32` bits), quantization *byte for byte*.

use moekit::format::ggml::{dequantize_row, quantize_row, GgmlType};
use moekit::npy::{NpyArray, NpyDType};
use moekit::Error;
use std::path::PathBuf;

fn fixture(name: &str) -> NpyArray {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/ggml")
        .join(name);
    NpyArray::read(&path).unwrap_or_else(|e| panic!("{e} (run scripts/fixtures/ggml.py)"))
}

const QUANTIZABLE: [GgmlType; 5] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
];

#[test]
fn dequantize_matches_gguf_py_bit_for_bit() -> moekit::Result<()> {
    for ty in GgmlType::ALL {
        let blocks = fixture(&format!("{}_blocks.npy", ty.name()));
        assert_eq!(blocks.dtype, NpyDType::U8);
        assert_eq!(blocks.shape[1], ty.type_size(), "{ty}");
        let want = fixture(&format!("{}_deq.npy", ty.name())).to_f32()?;
        assert_eq!(want.len(), blocks.shape[0] * ty.block_size(), "{ty}");
        // A fixture of constant values would prove little: the oracle varies.
        assert!(want.iter().any(|&v| v != want[0]), "{ty}");

        // Whole fixture as one row, then block by block (row of one block).
        let mut got = vec![f32::NAN; want.len()];
        dequantize_row(ty, &blocks.data, &mut got)?;
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want), "{ty}: whole row");

        let mut one = vec![0f32; ty.block_size()];
        for (b, (bytes, want)) in blocks
            .data
            .chunks_exact(ty.type_size())
            .zip(want.chunks_exact(ty.block_size()))
            .enumerate()
        {
            dequantize_row(ty, bytes, &mut one)?;
            assert_eq!(bits(&one), bits(want), "{ty}: block {b}");
        }
    }
    Ok(())
}

#[test]
fn dequantize_unaligned_row_matches_gguf_py() -> moekit::Result<()> {
    for ty in GgmlType::ALL {
        let blocks = fixture(&format!("{}_blocks.npy", ty.name()));
        let want = fixture(&format!("{}_deq.npy", ty.name())).to_f32()?;
        let mut shifted = vec![0u8; blocks.data.len() + 1];
        shifted[1..].copy_from_slice(&blocks.data);
        let mut got = vec![0f32; want.len()];
        dequantize_row(ty, &shifted[1..], &mut got)?;
        assert!(
            got.iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{ty}"
        );
    }
    Ok(())
}

#[test]
fn quantize_matches_gguf_py_byte_for_byte() -> moekit::Result<()> {
    for ty in QUANTIZABLE {
        let src = fixture(&format!("{}_qsrc.npy", ty.name())).to_f32()?;
        let want = fixture(&format!("{}_qout.npy", ty.name()));
        assert_eq!(want.dtype, NpyDType::U8);
        assert_eq!(want.data.len(), src.len() / 32 * ty.type_size(), "{ty}");
        let mut got = vec![0u8; want.data.len()];
        quantize_row(ty, &src, &mut got)?;
        for (b, (g, w)) in got
            .chunks_exact(ty.type_size())
            .zip(want.data.chunks_exact(ty.type_size()))
            .enumerate()
        {
            assert_eq!(
                g,
                w,
                "{ty}: block {b}, input {:?}",
                &src[b * 32..(b + 1) * 32]
            );
        }
    }
    Ok(())
}

/// Asserts `r` is `Error::Invalid` naming `op` and `arg`.
fn assert_invalid(r: moekit::Result<()>, op: &str, arg: &str) {
    match r {
        Err(Error::Invalid { op: o, arg: a, .. }) => {
            assert_eq!((o, a), (op, arg));
        }
        other => panic!("expected Invalid {op}/{arg}, got {other:?}"),
    }
}

#[test]
fn wrong_lengths_are_rejected() -> moekit::Result<()> {
    for ty in GgmlType::ALL {
        let (bs, ts) = (ty.block_size(), ty.type_size());
        let bytes = vec![0u8; 2 * ts];
        // out not a multiple of the block size.
        assert_invalid(
            dequantize_row(ty, &bytes, &mut vec![0f32; 2 * bs - 1]),
            "ggml_dequantize_row",
            "out",
        );
        // bytes for 2 blocks, out for 1 or 3.
        assert_invalid(
            dequantize_row(ty, &bytes, &mut vec![0f32; bs]),
            "ggml_dequantize_row",
            "bytes",
        );
        assert_invalid(
            dequantize_row(ty, &bytes, &mut vec![0f32; 3 * bs]),
            "ggml_dequantize_row",
            "bytes",
        );
        assert_invalid(
            dequantize_row(ty, &bytes[1..], &mut vec![0f32; 2 * bs]),
            "ggml_dequantize_row",
            "bytes",
        );
        // Empty row is fine.
        dequantize_row(ty, &[], &mut [])?;

        let mut out = vec![0u8; 2 * ts];
        assert_invalid(
            quantize_row(ty, &vec![0f32; 2 * bs + 1], &mut out),
            "ggml_quantize_row",
            "src",
        );
        assert_invalid(
            quantize_row(ty, &vec![0f32; bs], &mut out),
            "ggml_quantize_row",
            "out",
        );
    }
    let Err(e) = dequantize_row(GgmlType::Q4_K, &[0u8; 10], &mut [0f32; 256]) else {
        panic!("10 bytes for a Q4_K block accepted");
    };
    let msg = e.to_string();
    assert!(msg.contains("144 bytes") && msg.contains("got 10"), "{msg}");
    Ok(())
}

#[test]
fn quantize_k_types_is_unsupported() {
    let mut out = vec![0u8; GgmlType::Q6_K.type_size()];
    let r = quantize_row(GgmlType::Q6_K, &[0.5; 256], &mut out);
    assert!(
        matches!(
            r,
            Err(Error::Unsupported {
                op: "ggml_quantize_row",
                ..
            })
        ),
        "{r:?}"
    );
}
