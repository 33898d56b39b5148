//! Interop with other CUDA libraries: a caller's stream (`cuda::with_stream`),
//! memory another library owns (`CudaBytes::from_borrowed`), outputs written
//! in place (`MoeBlock::forward_into`), and the routed experts alone for a
//! routing computed elsewhere (`moe::routed_experts`).

use crate::common::*;
use moekit::cuda::CudaBytes;
use moekit::format::random::random_weights;
use moekit::moe::{routed_experts, MoeBlock, MoeBlockParts};
use moekit::ops::act::GateUp;
use moekit::ops::route::{RouterConfig, RouterKind, Routing};
use moekit::{Backend, DType, Tensor, WeightFormat};

fn block(format: &str, e: usize, k: usize, h: usize, i: usize) -> MoeBlock {
    let f = WeightFormat::parse(format).unwrap();
    let rw = |f, n, r, c, s| random_weights(f, n, r, c, DType::Bf16, s, &|| {}).unwrap();
    MoeBlock::new(MoeBlockParts {
        router: RouterConfig {
            kind: RouterKind::SoftmaxTopK {
                norm_topk_prob: true,
            },
            n_experts: e,
            top_k: k,
        },
        router_weight: rw(WeightFormat::Dense(DType::F32), 1, e, h, 1),
        gate_up: GateUp::separate(rw(f, e, i, h, 2), rw(f, e, i, h, 3)).unwrap(),
        down: rw(f, e, h, i, 4),
        shared: None,
        ffn: Default::default(),
    })
    .unwrap()
}

#[test]
fn forward_into_writes_in_place_what_forward_returns() {
    let b = block("affine4", 16, 4, 256, 128).to_device(gpu()).unwrap();
    // T = 1 and 8: the decode path; 100: tensor cores; f32: CUDA cores.
    for (t, dt) in [
        (1, DType::Bf16),
        (8, DType::Bf16),
        (100, DType::Bf16),
        (8, DType::F32),
    ] {
        let x = random(&[t, 256], dt, t as u64).to_device(gpu()).unwrap();
        let want = host_f32(&b.forward(&x).unwrap());
        let mut out = poisoned(&[t, 256], dt);
        b.forward_into(&x, &mut out).unwrap();
        assert_eq!(host_f32(&out), want, "T={t} {dt}");
    }
    // A wrong output is an error, not a write.
    let x = random(&[2, 256], DType::Bf16, 9).to_device(gpu()).unwrap();
    let mut wrong = poisoned(&[3, 256], DType::Bf16);
    assert!(b.forward_into(&x, &mut wrong).is_err());
}

#[test]
fn work_runs_on_a_borrowed_stream_and_into_borrowed_memory() {
    let dev = moekit::cuda::device(0).unwrap();
    let b = block("q4_0", 16, 4, 256, 128).to_device(gpu()).unwrap();
    let other = dev.context().new_stream().unwrap();
    for t in [1, 100] {
        let x = random(&[t, 256], DType::Bf16, 3).to_device(gpu()).unwrap();
        let want = host_f32(&b.forward(&x).unwrap());
        dev.synchronize().unwrap();
        // Memory another library allocated (here a cudarc slice the owner keeps).
        let slice = other.alloc_zeros::<u8>(t * 256 * 2).unwrap();
        let (ptr, len) = {
            use cudarc::driver::DevicePtr;
            let (p, _g) = slice.device_ptr(&other);
            (p, t * 256 * 2)
        };
        // SAFETY: `slice` (the owner) keeps `len` bytes at `ptr` alive.
        let bytes = unsafe { CudaBytes::from_borrowed(&dev, ptr, len, Box::new(slice)) };
        let mut out = Tensor::from_cuda_bytes(DType::Bf16, &[t, 256], bytes).unwrap();
        // SAFETY: `other` is a stream of this device's context, alive throughout.
        unsafe {
            moekit::cuda::with_stream(&dev, other.cu_stream(), || {
                assert_eq!(dev.stream().cu_stream(), other.cu_stream());
                b.forward_into(&x, &mut out)
            })
        }
        .unwrap();
        assert_ne!(
            dev.stream().cu_stream(),
            other.cu_stream(),
            "the override ends with the call"
        );
        other.synchronize().unwrap();
        assert_eq!(host_f32(&out), want, "T={t}");
    }
}

#[test]
fn routed_experts_match_the_cpu_for_a_given_routing() {
    let cpu = block("q8_0", 16, 4, 256, 128);
    let dev = cpu.to_device(gpu()).unwrap();
    let p = dev.parts();
    for t in [3, 100] {
        let x = random(&[t, 256], DType::Bf16, t as u64);
        let r = cpu.forward_on(Backend::CpuFast, &x).unwrap().routing;
        let want = host_f32(
            &routed_experts(&cpu.parts().gate_up, &cpu.parts().down, &x, &r, None).unwrap(),
        );
        let rd = Routing {
            ids: r.ids.to_device(gpu()).unwrap(),
            weights: r.weights.to_device(gpu()).unwrap(),
        };
        let xd = x.to_device(gpu()).unwrap();
        let mut out = poisoned(&[t, 256], DType::Bf16);
        routed_experts(&p.gate_up, &p.down, &xd, &rd, Some(&mut out)).unwrap();
        let e = nmse(&host_f32(&out), &want);
        assert!(e <= 1e-3, "T={t}: NMSE {e:e}");
    }
    // An out-of-range id: skipped rows, reported by the device's error word.
    let x = random(&[2, 256], DType::Bf16, 5).to_device(gpu()).unwrap();
    let bad = Routing {
        ids: Tensor::from_slice(&[0u32, 16, 1, 2], &[2, 2])
            .unwrap()
            .to_device(gpu())
            .unwrap(),
        weights: Tensor::from_slice(&[0.5f32; 4], &[2, 2])
            .unwrap()
            .to_device(gpu())
            .unwrap(),
    };
    let _ = routed_experts(&p.gate_up, &p.down, &x, &bad, None).unwrap();
    let err = moekit::cuda::device(0).unwrap().check_errors().unwrap_err();
    assert!(err.to_string().contains("expert id"), "{err}");
}
