//! The fused decode path (`cuda::ops::decode`, three or four launches) against the
//! CPU and the general CUDA path, plus its determinism and batch invariance.

use crate::common::*;
use moekit::cpu::{with_act_mode, ActMode};
use moekit::format::random::random_weights;
use moekit::format::GgmlType;
use moekit::moe::{MoeBlock, MoeBlockParts, MoePath, MoeTrace, SharedExpert};
use moekit::ops::act::GateUp;
use moekit::ops::route::{GroupMask, RouterConfig, RouterKind, Scoring};
use moekit::{Backend, DType, Device, Tensor, WeightFormat};

fn rules(e: usize) -> Vec<RouterKind> {
    let scale: Vec<f32> = (0..e).map(|i| 0.5 + (i % 7) as f32 * 0.1).collect();
    let bias: Vec<f32> = (0..e).map(|i| ((i * 37) % 11) as f32 * 0.01).collect();
    vec![
        RouterKind::SoftmaxTopK {
            norm_topk_prob: true,
        },
        RouterKind::SoftmaxTopK {
            norm_topk_prob: false,
        },
        RouterKind::TopKSoftmax,
        RouterKind::Gemma4 {
            per_expert_scale: scale,
        },
        RouterKind::Grouped {
            scoring: Scoring::Sigmoid,
            bias: Some(bias.clone()),
            n_group: 4,
            topk_group: 2,
            dropped_groups: GroupMask::Zero,
            norm_topk_prob: true,
            routed_scaling_factor: 2.5,
        },
        RouterKind::Grouped {
            scoring: Scoring::Softmax,
            bias: None,
            n_group: 1,
            topk_group: 1,
            dropped_groups: GroupMask::Zero,
            norm_topk_prob: false,
            routed_scaling_factor: 1.0,
        },
    ]
    .into_iter()
    // Every kept key negative (bias ≤ -1.4 < -sigmoid): the two masks of
    // dropped groups choose different experts (mlx-lm's 0.0 picks dropped
    // experts, llama.cpp's −∞ only kept ones).
    .chain(
        [GroupMask::Zero, GroupMask::NegInf].map(|dropped_groups| RouterKind::Grouped {
            scoring: Scoring::Sigmoid,
            bias: Some(bias.iter().map(|b| b - 1.5).collect()),
            n_group: 8,
            topk_group: 3,
            dropped_groups,
            norm_topk_prob: true,
            routed_scaling_factor: 1.5,
        }),
    )
    .collect()
}

struct Shape {
    e: usize,
    k: usize,
    h: usize,
    i: usize,
    si: usize,
    fused: bool,
    gated: bool,
}

fn block(f: WeightFormat, s: &Shape, kind: RouterKind) -> MoeBlock {
    mixed_block(f, f, s, kind)
}

/// A block whose gate/up matrices (routed and shared) are of format `f` and
/// down matrices of `fd` (a GGUF `_M` mix: Q4_K gate/up, Q6_K down).
fn mixed_block(f: WeightFormat, fd: WeightFormat, s: &Shape, kind: RouterKind) -> MoeBlock {
    let rw = |fmt, n, r, c, seed| random_weights(fmt, n, r, c, DType::Bf16, seed, &|| {}).unwrap();
    let gu = |n, i, seed| {
        if s.fused {
            GateUp::fused(rw(f, n, 2 * i, s.h, seed)).unwrap()
        } else {
            GateUp::separate(rw(f, n, i, s.h, seed), rw(f, n, i, s.h, seed + 1)).unwrap()
        }
    };
    let router = WeightFormat::Dense(DType::F32);
    MoeBlock::new(MoeBlockParts {
        router: RouterConfig {
            kind,
            n_experts: s.e,
            top_k: s.k,
        },
        router_weight: rw(router, 1, s.e, s.h, 1),
        gate_up: gu(s.e, s.i, 2),
        down: rw(fd, s.e, s.h, s.i, 4),
        shared: (s.si > 0).then(|| SharedExpert {
            gate_up: gu(1, s.si, 5),
            down: rw(fd, 1, s.h, s.si, 7),
            gate: s.gated.then(|| rw(router, 1, 1, s.h, 8)),
        }),
        ffn: Default::default(),
    })
    .unwrap()
}

/// The decode path on `dev` against the CPU's f32 forward of `cpu` at `x`:
/// asserts the output NMSE within x's dtype's bound (f32 1e-9, 16-bit
/// 1e-3) and returns (decode, CPU) for callers that also compare the routing.
fn decode_vs_cpu(cpu: &MoeBlock, dev: &MoeBlock, x: &Tensor, what: &str) -> (MoeTrace, MoeTrace) {
    let want = with_act_mode(ActMode::F32, || cpu.forward_on(Backend::CpuFast, x)).unwrap();
    let got = dev
        .forward_with(Backend::Cuda, MoePath::Decode, &x.to_device(gpu()).unwrap())
        .unwrap();
    let e = nmse(&host_f32(&got.out), &want.out.to_f32_vec().unwrap());
    let b = if x.dtype() == DType::F32 { 1e-9 } else { 1e-3 };
    assert!(e <= b, "{what} {}: NMSE {e:e}", x.dtype());
    (got, want)
}

fn run(b: &MoeBlock, path: MoePath, x: &Tensor) -> Vec<f32> {
    host_f32(
        &b.forward_with(Backend::Cuda, path, &x.to_device(gpu()).unwrap())
            .unwrap()
            .out,
    )
}

#[test]
fn decode_matches_cpu_for_every_format() {
    for f in WeightFormat::all() {
        decode_matches_cpu(f);
    }
}

/// GGUF NVFP4 (64-weight blocks) alone, for runs that filter on it.
#[test]
fn nvfp4_decode_matches_cpu() {
    decode_matches_cpu(WeightFormat::Ggml(GgmlType::NVFP4));
}

/// The decode path of a block of format `f` (E = 32, k = 4, a shared
/// expert) against the CPU at T = 1, 3 and 64, f32 and bf16 activations.
fn decode_matches_cpu(f: WeightFormat) {
    let s = Shape {
        e: 32,
        k: 4,
        h: 512,
        i: 256,
        si: 256,
        fused: false,
        gated: true,
    };
    let cpu = block(
        f,
        &s,
        RouterKind::SoftmaxTopK {
            norm_topk_prob: true,
        },
    );
    let dev = cpu.to_device(gpu()).unwrap();
    for t in [1, 3, 64] {
        for dt in [DType::F32, DType::Bf16] {
            let x = random(&[t, s.h], dt, t as u64 + 10);
            decode_vs_cpu(&cpu, &dev, &x, &format!("{f} T={t}"));
        }
    }
}

/// Hidden sizes whose x rows are not whole 16-byte words (bf16: H % 8 ≠ 0;
/// f32: H % 4 ≠ 0) take the router matvec's one-chunk-at-a-time loop
/// (kernels/decode.cu `route_dots<…, false>`); every other test's rows are
/// aligned. Same routing as the CPU's, outputs within the format test's bounds.
#[test]
fn router_matvec_takes_unaligned_rows() {
    for h in [258, 260] {
        let s = Shape {
            e: 32,
            k: 4,
            h,
            i: 96,
            si: 64,
            fused: false,
            gated: true,
        };
        let cpu = block(
            WeightFormat::Dense(DType::Bf16),
            &s,
            RouterKind::SoftmaxTopK {
                norm_topk_prob: true,
            },
        );
        let dev = cpu.to_device(gpu()).unwrap();
        for t in [1, 3, 9] {
            for dt in [DType::F32, DType::Bf16] {
                let x = random(&[t, s.h], dt, t as u64 + 20);
                let (got, trace) = decode_vs_cpu(&cpu, &dev, &x, &format!("H={h} T={t}"));
                if dt == DType::F32 {
                    let ids = got.routing.ids.to_device(Device::Cpu).unwrap();
                    assert_eq!(
                        ids.as_slice::<u32>().unwrap(),
                        trace.routing.ids.as_slice::<u32>().unwrap(),
                        "H={h} T={t}: expert ids"
                    );
                }
            }
        }
    }
}

#[test]
fn decode_matches_cpu_for_every_rule_and_layout() {
    for (fused, si, gated) in [(false, 0, false), (true, 512, false), (true, 256, true)] {
        let s = Shape {
            e: 64,
            k: 6,
            h: 256,
            i: 256,
            si,
            fused,
            gated,
        };
        for kind in rules(s.e) {
            let cpu = block(WeightFormat::parse("q4_k").unwrap(), &s, kind.clone());
            let dev = cpu.to_device(gpu()).unwrap();
            for t in [1, 2, 7, 33, 64] {
                let x = random(&[t, s.h], DType::F32, t as u64);
                let trace =
                    with_act_mode(ActMode::F32, || cpu.forward_on(Backend::CpuFast, &x)).unwrap();
                let got = dev
                    .forward_with(Backend::Cuda, MoePath::Decode, &x.to_device(gpu()).unwrap())
                    .unwrap();
                let e = nmse(&host_f32(&got.out), &trace.out.to_f32_vec().unwrap());
                assert!(
                    e <= 1e-9,
                    "{kind:?} fused={fused} shared={si} T={t}: NMSE {e:e}"
                );
                let ids = got.routing.ids.to_device(Device::Cpu).unwrap();
                assert_eq!(
                    ids.as_slice::<u32>().unwrap(),
                    trace.routing.ids.as_slice::<u32>().unwrap(),
                    "{kind:?} T={t}: expert ids"
                );
            }
        }
    }
}

#[test]
fn decode_keeps_mixed_format_layers() {
    // Gate/up in one format and down in another stay on the decode path
    // with 16-bit activations (the tensor-core kernels take each side's
    // format); with f32 activations the CUDA-core kernels refuse them.
    let s = Shape {
        e: 32,
        k: 4,
        h: 512,
        i: 256,
        si: 256,
        fused: true,
        gated: true,
    };
    for (g, d) in [
        ("q4_k", "q6_k"),
        ("q4_k", "q8_0"),
        ("affine4", "affine8"),
        ("q3_k", "q5_k"),
        ("iq4_xs", "mxfp4"),
        ("mxfp4", "iq4_nl"),
        ("iq2_xxs", "iq1_m"),
        ("iq3_s", "tq1_0"),
        ("mlx-mxfp4", "mlx-mxfp8"),
        ("mlx-nvfp4", "q8_0"),
        ("fp8-b128", "fp8-b32"),
        ("q4_k", "fp8-b128"),
    ] {
        let (fg, fd) = (
            WeightFormat::parse(g).unwrap(),
            WeightFormat::parse(d).unwrap(),
        );
        let cpu = mixed_block(
            fg,
            fd,
            &s,
            RouterKind::SoftmaxTopK {
                norm_topk_prob: true,
            },
        );
        let dev = cpu.to_device(gpu()).unwrap();
        for t in [1, 5, 16, 40] {
            for dt in [DType::Bf16, DType::F16] {
                let x = random(&[t, s.h], dt, t as u64 + 3);
                let want = cpu_forward(&cpu, &x);
                let e = nmse(&run(&dev, MoePath::Decode, &x), &want);
                assert!(e <= 1e-3, "{g}+{d} T={t} {dt}: NMSE {e:e}");
            }
        }
        let x = random(&[2, s.h], DType::F32, 1);
        let r = dev.forward_with(Backend::Cuda, MoePath::Decode, &x.to_device(gpu()).unwrap());
        if g.starts_with("fp8") && d.starts_with("fp8") {
            // FP8 blocks of 128 and 32 columns are one CUDA-core decoder
            // (the block is a runtime group shift): the pair runs there.
            let e = nmse(&host_f32(&r.unwrap().out), &cpu_forward(&cpu, &x));
            assert!(e <= 1e-9, "{g}+{d} f32: NMSE {e:e}");
        } else {
            let err = r.unwrap_err().to_string();
            assert!(err.contains("differ in format"), "{g}+{d}: {err}");
        }
    }
}

#[test]
fn decode_and_general_cuda_paths_agree() {
    let s = Shape {
        e: 128,
        k: 8,
        h: 2048,
        i: 768,
        si: 0,
        fused: false,
        gated: false,
    };
    for f in ["affine4", "q4_k", "q8_0", "bf16"] {
        let b = block(
            WeightFormat::parse(f).unwrap(),
            &s,
            RouterKind::SoftmaxTopK {
                norm_topk_prob: true,
            },
        )
        .to_device(gpu())
        .unwrap();
        for t in [1, 16, 64] {
            let x = random(&[t, s.h], DType::Bf16, 3);
            let e = nmse(
                &run(&b, MoePath::Decode, &x),
                &run(&b, MoePath::General, &x),
            );
            assert!(e <= 1e-4, "{f} T={t}: decode vs general NMSE {e:e}");
        }
    }
}

#[test]
fn decode_is_deterministic_and_batch_invariant() {
    let s = Shape {
        e: 128,
        k: 8,
        h: 2048,
        i: 768,
        si: 512,
        fused: false,
        gated: true,
    };
    for f in ["affine4", "q4_k"] {
        let b = block(
            WeightFormat::parse(f).unwrap(),
            &s,
            RouterKind::SoftmaxTopK {
                norm_topk_prob: true,
            },
        )
        .to_device(gpu())
        .unwrap();
        let batch = random(&[64, s.h], DType::Bf16, 9);
        let full = run(&b, MoePath::Decode, &batch);
        for _ in 0..3 {
            assert_eq!(
                run(&b, MoePath::Decode, &batch),
                full,
                "{f}: repeated runs differ"
            );
        }
        let rows = batch.to_f32_vec().unwrap();
        for t in [0, 17, 63] {
            let one =
                Tensor::from_f32(&rows[t * s.h..(t + 1) * s.h], &[1, s.h], DType::Bf16).unwrap();
            assert_eq!(
                run(&b, MoePath::Decode, &one),
                full[t * s.h..(t + 1) * s.h],
                "{f}: token {t} alone differs from inside the batch"
            );
        }
    }
}

/// T = 1 routed by every gate/up block itself (`fold_route`, the default)
/// and by the routing launch's last block give the same bits: output, ids
/// and weights, for every rule, a shared expert, dense and quantized
/// experts, and E = 512 (beyond the fold: both runs take the tail).
#[test]
fn gate_up_blocks_route_as_the_routing_tail_does() {
    use moekit::testing::cuda::decode::force_fold;
    for (e, k) in [(64, 6), (512, 10)] {
        let s = Shape {
            e,
            k,
            h: 512,
            i: 256,
            si: 512,
            fused: false,
            gated: true,
        };
        for f in ["affine4", "q4_k", "bf16"] {
            for kind in rules(s.e) {
                let dev = block(WeightFormat::parse(f).unwrap(), &s, kind.clone())
                    .to_device(gpu())
                    .unwrap();
                for seed in 0..3u64 {
                    let x = random(&[1, s.h], DType::Bf16, 70 + seed)
                        .to_device(gpu())
                        .unwrap();
                    let mut got = Vec::new();
                    for fold in [true, false] {
                        force_fold(Some(fold));
                        let r = dev.forward_with(Backend::Cuda, MoePath::Decode, &x);
                        force_fold(None);
                        let r = r.unwrap();
                        got.push((
                            host_f32(&r.out),
                            r.routing
                                .ids
                                .to_device(Device::Cpu)
                                .unwrap()
                                .as_slice::<u32>()
                                .unwrap()
                                .to_vec(),
                            host_f32(&r.routing.weights),
                        ));
                    }
                    assert_eq!(
                        got[0], got[1],
                        "{f} E={e} {kind:?} seed {seed}: fold vs tail"
                    );
                }
            }
        }
    }
}

#[test]
fn decode_path_is_refused_where_it_does_not_apply() {
    let s = Shape {
        e: 8,
        k: 2,
        h: 256,
        i: 64,
        si: 0,
        fused: false,
        gated: false,
    };
    let b = block(
        WeightFormat::parse("q8_0").unwrap(),
        &s,
        RouterKind::TopKSoftmax,
    )
    .to_device(gpu())
    .unwrap();
    let x = random(&[65, s.h], DType::F32, 1).to_device(gpu()).unwrap();
    let e = b
        .forward_with(Backend::Cuda, MoePath::Decode, &x)
        .unwrap_err()
        .to_string();
    assert!(e.contains("path"), "{e}");
    // Auto falls back to the general path above 64 tokens.
    assert_eq!(b.forward(&x).unwrap().shape(), &[65, s.h]);
}

/// A reduced sweep for compute-sanitizer (memcheck, racecheck; run by
/// `SANITIZE=1 bash gpu-bundle/run.sh decode::sanitizer_sweep`): every
/// routing rule, the gated shared expert, the tensor-core (16-bit) and
/// CUDA-core (f32) expert kernels, T = 1 and 5, on small shapes.
#[test]
fn sanitizer_sweep() {
    let s = Shape {
        e: 16,
        k: 4,
        h: 256,
        i: 256,
        si: 256,
        fused: false,
        gated: true,
    };
    for f in ["q4_k", "affine4", "q8_0", "bf16"] {
        for kind in rules(s.e) {
            let cpu = block(WeightFormat::parse(f).unwrap(), &s, kind.clone());
            let dev = cpu.to_device(gpu()).unwrap();
            for t in [1, 5] {
                for dt in [DType::F32, DType::Bf16] {
                    let x = random(&[t, s.h], dt, t as u64 + 20);
                    let want = cpu_forward(&cpu, &x);
                    let e = nmse(&run(&dev, MoePath::Decode, &x), &want);
                    let b = if dt == DType::F32 { 1e-9 } else { 1e-3 };
                    assert!(e <= b, "{f} {kind:?} T={t} {dt}: NMSE {e:e}");
                }
            }
        }
    }
}

/// The tensor-core expert kernels with long K (8192: 64 spans, 8 warps of 8
/// spans each) on gate/up (h = 8192) and on down (i = 8192), and the shared
/// expert's 12 tokens (two n-tiles): against the CPU, and each token alone
/// against the batch. Also run under compute-sanitizer
/// (`SANITIZE=1 … decode::long_k`).
#[test]
fn long_k_and_two_n_tiles_match_cpu() {
    for (h, i) in [(8192, 256), (256, 8192)] {
        let s = Shape {
            e: 8,
            k: 2,
            h,
            i,
            si: 256,
            fused: false,
            gated: true,
        };
        for f in ["affine4", "q4_k", "q4_0", "q8_0"] {
            let kind = RouterKind::SoftmaxTopK {
                norm_topk_prob: true,
            };
            let cpu = block(WeightFormat::parse(f).unwrap(), &s, kind);
            let dev = cpu.to_device(gpu()).unwrap();
            let x = random(&[12, s.h], DType::Bf16, 31);
            let got = run(&dev, MoePath::Decode, &x);
            let e = nmse(&got, &cpu_forward(&cpu, &x));
            assert!(e <= 1e-3, "{f} h={h} i={i}: NMSE {e:e}");
            let rows = x.to_f32_vec().unwrap();
            for t in [0, 11] {
                let one =
                    Tensor::from_f32(&rows[t * h..(t + 1) * h], &[1, h], DType::Bf16).unwrap();
                assert_eq!(
                    run(&dev, MoePath::Decode, &one),
                    got[t * h..(t + 1) * h],
                    "{f} h={h} i={i}: token {t} alone differs from inside the batch"
                );
            }
        }
    }
}
