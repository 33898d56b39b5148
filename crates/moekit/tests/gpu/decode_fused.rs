//! One token's gate/up and down in one launch (`decode_fused_mma`,
//! `kernels/decode_fused.cuh`) against the two launches it replaces (the
//! same bits) and the CPU, and refused where it does not apply.

use crate::common::*;
use moekit::format::random::random_weights;
use moekit::moe::{MoeBlock, MoeBlockParts, MoePath, SharedExpert};
use moekit::ops::act::GateUp;
use moekit::ops::route::{RouterConfig, RouterKind};
use moekit::testing::cuda::decode::{force_fused, last_fused};
use moekit::{Backend, DType, Device, WeightFormat};

struct Shape {
    e: usize,
    k: usize,
    h: usize,
    i: usize,
    si: usize,
}

fn block(f: &str, fd: &str, s: &Shape, kind: RouterKind) -> MoeBlock {
    let (f, fd) = (
        WeightFormat::parse(f).unwrap(),
        WeightFormat::parse(fd).unwrap(),
    );
    let rw = |fmt, n, r, c, seed| random_weights(fmt, n, r, c, DType::Bf16, seed, &|| {}).unwrap();
    let router = WeightFormat::Dense(DType::F32);
    MoeBlock::new(MoeBlockParts {
        router: RouterConfig {
            kind,
            n_experts: s.e,
            top_k: s.k,
        },
        router_weight: rw(router, 1, s.e, s.h, 1),
        gate_up: GateUp::separate(rw(f, s.e, s.i, s.h, 2), rw(f, s.e, s.i, s.h, 3)).unwrap(),
        down: rw(fd, s.e, s.h, s.i, 4),
        shared: (s.si > 0).then(|| SharedExpert {
            gate_up: GateUp::separate(rw(f, 1, s.si, s.h, 5), rw(f, 1, s.si, s.h, 6)).unwrap(),
            down: rw(fd, 1, s.h, s.si, 7),
            gate: Some(rw(router, 1, 1, s.h, 8)),
        }),
        ffn: Default::default(),
    })
    .unwrap()
}

/// (output, routing ids, routing weights) of one decode call, and whether it fused.
type Run = (Vec<f32>, Vec<u32>, Vec<f32>);
fn run(b: &MoeBlock, x: &moekit::Tensor, fused: bool) -> (Run, bool) {
    force_fused(Some(fused));
    let r = b.forward_with(Backend::Cuda, MoePath::Decode, x);
    let did = last_fused();
    force_fused(None);
    let r = r.unwrap();
    let ids = r.routing.ids.to_device(Device::Cpu).unwrap();
    (
        (
            host_f32(&r.out),
            ids.as_slice::<u32>().unwrap().to_vec(),
            host_f32(&r.routing.weights),
        ),
        did,
    )
}

/// qwen3-30b-a3b's shape (E = 128, k = 8, H = 2048, I = 768) and a small
/// one with a gated shared expert wider than the routed ones, in every
/// weight format family, for each rule that selects on the logits: the
/// fused launch gives the two launches' bits (output and routing), matches
/// the CPU, and gives them again when replayed (its flags and tickets are
/// back at zero after each launch).
#[test]
fn fused_launch_gives_the_two_launch_bits() {
    let shapes = [
        Shape {
            e: 128,
            k: 8,
            h: 2048,
            i: 768,
            si: 0,
        },
        Shape {
            e: 64,
            k: 6,
            h: 512,
            i: 256,
            si: 512,
        },
    ];
    let kinds = [
        RouterKind::SoftmaxTopK {
            norm_topk_prob: true,
        },
        RouterKind::TopKSoftmax,
        RouterKind::Gemma4 {
            per_expert_scale: (0..128).map(|i| 0.5 + (i % 7) as f32 * 0.1).collect(),
        },
    ];
    let formats = [
        "affine4", "affine8", "q4_k", "q6_k", "q8_0", "q4_0", "iq4_xs", "mxfp4",
    ];
    for (si, s) in shapes.iter().enumerate() {
        for f in formats {
            for (ki, kind) in kinds.iter().enumerate() {
                // The small shape takes every rule; qwen3's shape its own.
                if si == 0 && ki > 0 {
                    continue;
                }
                let kind = match kind {
                    RouterKind::Gemma4 { per_expert_scale } => RouterKind::Gemma4 {
                        per_expert_scale: per_expert_scale[..s.e].to_vec(),
                    },
                    k => k.clone(),
                };
                let cpu = block(f, f, s, kind);
                let dev = cpu.to_device(gpu()).unwrap();
                let x = random(&[1, s.h], DType::Bf16, 40 + si as u64);
                let xd = x.to_device(gpu()).unwrap();
                let (two, fused_two) = run(&dev, &xd, false);
                assert!(!fused_two, "{f}: forced off, yet fused");
                let (one, fused_one) = run(&dev, &xd, true);
                assert!(fused_one, "{f} shape {si}: the fused launch did not apply");
                assert_eq!(one, two, "{f} shape {si} rule {ki}: fused vs two launches");
                let (again, _) = run(&dev, &xd, true);
                assert_eq!(again, one, "{f} shape {si}: a second fused launch differs");
                let e = nmse(&one.0, &cpu_forward(&cpu, &x));
                assert!(e <= 1e-3, "{f} shape {si}: NMSE {e:e} against the CPU");
            }
        }
    }
}

/// Where it does not apply the two launches run: T = 2, a mixed-format
/// layer (Q4_K gate/up, Q6_K down), dense weights of the activation type.
#[test]
fn fused_launch_is_refused_where_it_does_not_apply() {
    let s = Shape {
        e: 64,
        k: 6,
        h: 512,
        i: 256,
        si: 0,
    };
    let kind = RouterKind::SoftmaxTopK {
        norm_topk_prob: true,
    };
    for (f, fd, t) in [
        ("q4_k", "q4_k", 2),
        ("q4_k", "q6_k", 1),
        ("bf16", "bf16", 1),
    ] {
        let dev = block(f, fd, &s, kind.clone()).to_device(gpu()).unwrap();
        let x = random(&[t, s.h], DType::Bf16, 3).to_device(gpu()).unwrap();
        let (_, did) = run(&dev, &x, true);
        assert!(!did, "{f}/{fd} T={t}: fused where it should not");
    }
}

/// A reduced sweep for compute-sanitizer (`SANITIZE=1 bash gpu-bundle/run.sh
/// decode_fused::sanitizer_sweep`): the fused launch with and without a
/// shared expert, K-quant and affine rows, against the CPU.
#[test]
fn sanitizer_sweep() {
    for si in [0, 256] {
        let s = Shape {
            e: 16,
            k: 4,
            h: 256,
            i: 256,
            si,
        };
        for f in ["q4_k", "affine4"] {
            let cpu = block(
                f,
                f,
                &s,
                RouterKind::SoftmaxTopK {
                    norm_topk_prob: true,
                },
            );
            let dev = cpu.to_device(gpu()).unwrap();
            let x = random(&[1, s.h], DType::Bf16, 7);
            let (one, did) = run(&dev, &x.to_device(gpu()).unwrap(), true);
            assert!(did, "{f} si={si}: not fused");
            let e = nmse(&one.0, &cpu_forward(&cpu, &x));
            assert!(e <= 1e-3, "{f} si={si}: NMSE {e:e}");
        }
    }
}
