//! Host-side interop: memory another library owns (`Bytes::external`)
//! written in place by `forward_into`, and `moe::routed_experts` (vLLM's
//! `fused_experts`) against the block's own experts and with bad arguments.

use moekit::format::random::random_weights;
use moekit::moe::{routed_experts, MoeBlock, MoeBlockParts};
use moekit::ops::act::GateUp;
use moekit::ops::route::{RouterConfig, RouterKind, Routing};
use moekit::{Backend, Bytes, DType, MoePath, Tensor, WeightFormat};

fn block(format: &str) -> MoeBlock {
    let f = WeightFormat::parse(format).unwrap();
    let rw = |f, n, r, c, s| random_weights(f, n, r, c, DType::Bf16, s, &|| {}).unwrap();
    let (e, h, i) = (8, 128, 64);
    MoeBlock::new(MoeBlockParts {
        router: RouterConfig {
            kind: RouterKind::TopKSoftmax,
            n_experts: e,
            top_k: 2,
        },
        router_weight: rw(WeightFormat::Dense(DType::F32), 1, e, h, 1),
        gate_up: GateUp::separate(rw(f, e, i, h, 2), rw(f, e, i, h, 3)).unwrap(),
        down: rw(f, e, h, i, 4),
        shared: None,
        ffn: Default::default(),
    })
    .unwrap()
}

fn x(t: usize) -> Tensor {
    let v: Vec<f32> = (0..t * 128)
        .map(|j| ((j * 37 % 101) as f32 / 50.0) - 1.0)
        .collect();
    Tensor::from_f32(&v, &[t, 128], DType::F32).unwrap()
}

#[test]
fn forward_into_writes_external_host_memory_in_place() {
    let b = block("q4_0");
    let x = x(5);
    let want = b.forward(&x).unwrap().to_f32_vec().unwrap();
    let mut mem = vec![f32::NAN; 5 * 128];
    let ptr = mem.as_mut_ptr() as *mut u8;
    // SAFETY: `mem` outlives `out` and nothing else touches it meanwhile.
    let bytes = unsafe { Bytes::external(ptr, 5 * 128 * 4, Box::new(())) };
    let mut out = Tensor::from_bytes(DType::F32, &[5, 128], bytes).unwrap();
    let view = out.clone();
    b.forward_into(&x, &mut out).unwrap();
    drop(out);
    assert_eq!(mem, want);
    // A clone is a read-only view: writing it copies, the memory stays.
    let mut v = view;
    v.copy_from(&Tensor::zeros(DType::F32, &[5, 128])).unwrap();
    assert_eq!(mem, want);
    assert!(v.to_f32_vec().unwrap().iter().all(|&z| z == 0.0));
}

#[test]
fn routed_experts_equal_the_blocks_experts_on_its_routing() {
    for format in ["affine4", "q8_0", "f32"] {
        let b = block(format);
        let p = b.parts();
        let x = x(7);
        for backend in [Backend::CpuReference, Backend::CpuFast] {
            let tr = b.forward_with(backend, MoePath::General, &x).unwrap();
            // The public op picks the backend of x's device (the fast CPU path).
            if backend == Backend::CpuFast {
                let y = routed_experts(&p.gate_up, &p.down, &x, &tr.routing, None).unwrap();
                assert_eq!(
                    y.to_f32_vec().unwrap(),
                    tr.out.to_f32_vec().unwrap(),
                    "{format}"
                );
                let mut out = Tensor::zeros(DType::F32, &[7, 128]);
                routed_experts(&p.gate_up, &p.down, &x, &tr.routing, Some(&mut out)).unwrap();
                assert_eq!(
                    out.to_f32_vec().unwrap(),
                    tr.out.to_f32_vec().unwrap(),
                    "{format}"
                );
            }
        }
    }
}

#[test]
fn routed_experts_refuse_bad_arguments() {
    let b = block("q8_0");
    let p = b.parts();
    let x = x(2);
    let r = |ids: &[u32], w: &[f32], shape: &[usize]| Routing {
        ids: Tensor::from_slice(ids, shape).unwrap(),
        weights: Tensor::from_slice(w, shape).unwrap(),
    };
    let err = |x: &Tensor, rt: &Routing| {
        routed_experts(&p.gate_up, &p.down, x, rt, None)
            .unwrap_err()
            .to_string()
    };
    // An expert id out of range.
    assert!(err(&x, &r(&[0, 8, 1, 2], &[0.5; 4], &[2, 2])).contains("8"));
    // ids for another T, weights of another shape, x of another width.
    assert!(err(&x, &r(&[0, 1, 2], &[0.5; 3], &[3, 1])).contains("routing.ids"));
    let bad_w = Routing {
        ids: Tensor::from_slice(&[0u32, 1, 2, 3], &[2, 2]).unwrap(),
        weights: Tensor::from_slice(&[0.5f32; 2], &[2, 1]).unwrap(),
    };
    assert!(err(&x, &bad_w).contains("routing.weights"));
    let wide = Tensor::zeros(DType::F32, &[2, 64]);
    assert!(err(&wide, &r(&[0, 1, 2, 3], &[0.5; 4], &[2, 2])).contains("x"));
    // down of another block's shape.
    let other = block("q8_0");
    let small = random_weights(
        WeightFormat::parse("q8_0").unwrap(),
        8,
        128,
        32,
        DType::Bf16,
        9,
        &|| {},
    )
    .unwrap();
    let e = routed_experts(
        &other.parts().gate_up,
        &small,
        &x,
        &r(&[0, 1, 2, 3], &[0.5; 4], &[2, 2]),
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("down"), "{e}");
}
