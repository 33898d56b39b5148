//! Shared helpers of the GPU tests.
#![allow(dead_code)]

use moekit::cpu::{with_act_mode, ActMode};
use moekit::moe::MoeBlock;
use moekit::ops::sort::{expert_sort_on, ExpertSort};
use moekit::testing::cuda::tc_gemm::TcRows;
use moekit::{Backend, DType, Device, Tensor};
use rand::{Rng, SeedableRng};

/// The GPU under test; panics (fails the test) without one.
pub fn gpu() -> Device {
    match moekit::cuda::available() {
        Ok(_) => Device::Cuda(0),
        Err(e) => panic!("GPU test needs a CUDA device: {e}"),
    }
}

/// NMSE as ggml's test-backend-ops; panics on a non-finite value (a NaN
/// left in a poisoned output means an element was never written).
pub fn nmse(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len(), "length");
    let (mut num, mut den) = (0f64, 0f64);
    for (i, (&a, &b)) in got.iter().zip(want).enumerate() {
        assert!(
            a.is_finite(),
            "element {i} not finite ({a}): unwritten or overflow"
        );
        num += (a as f64 - b as f64).powi(2);
        den += (b as f64).powi(2);
    }
    if den == 0.0 {
        num
    } else {
        num / den
    }
}

/// NMSE bound for an output of `dtype` compared with an f32 CPU result.
pub fn bound(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-9,
        DType::F16 => 1e-5,
        _ => 1e-4, // bf16: 8 bits of mantissa
    }
}

pub fn rng(seed: u64) -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(seed)
}

/// Random values in [-1, 1) as a CPU tensor of `dtype`.
pub fn random(shape: &[usize], dtype: DType, seed: u64) -> Tensor {
    let mut r = rng(seed);
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|_| r.random::<f32>() * 2.0 - 1.0).collect();
    Tensor::from_f32(&v, shape, dtype).unwrap()
}

/// A NaN-filled tensor of `dtype` on the GPU (u32 tensors get 0xFFFFFFFF).
pub fn poisoned(shape: &[usize], dtype: DType) -> Tensor {
    let n: usize = shape.iter().product();
    let t = match dtype {
        DType::U32 => Tensor::from_slice(&vec![u32::MAX; n], shape).unwrap(),
        d => Tensor::from_f32(&vec![f32::NAN; n], shape, d).unwrap(),
    };
    t.to_device(gpu()).unwrap()
}

/// f32 values of a tensor on any device.
pub fn host_f32(t: &Tensor) -> Vec<f32> {
    t.to_device(Device::Cpu).unwrap().to_f32_vec().unwrap()
}

/// The block's output on the fast CPU backend with f32 activations (the
/// reference of the block tests; the default 8-bit activation path is
/// checked against it on the CPU, tests/cpu_q8_path.rs).
pub fn cpu_forward(b: &MoeBlock, x: &Tensor) -> Vec<f32> {
    with_act_mode(ActMode::F32, || b.forward_on(Backend::CpuFast, x))
        .unwrap()
        .out
        .to_f32_vec()
        .unwrap()
}

/// Token counts every op is tested at.
pub const TOKENS: [usize; 6] = [1, 2, 7, 64, 333, 4096];

/// A random routing of `t` tokens × `k` slots over `e` experts (experts in
/// `empty` get none; with `one`, every slot goes to one expert), sorted on the CPU.
pub fn sort_of(t: usize, k: usize, e: usize, empty: &[usize], one: bool, seed: u64) -> ExpertSort {
    let mut r = rng(seed);
    let live: Vec<u32> = (0..e as u32)
        .filter(|x| !empty.contains(&(*x as usize)))
        .collect();
    let ids: Vec<u32> = (0..t * k)
        .map(|i| {
            if one {
                live[0]
            } else {
                live[(r.random_range(0..live.len()) + i) % live.len()]
            }
        })
        .collect();
    let ids = Tensor::from_slice(&ids, &[t, k]).unwrap();
    expert_sort_on(Backend::CpuReference, &ids, e).unwrap()
}

/// An expert sort with expert j holding `counts[j]` of the tokens (k = 1),
/// the tokens shuffled over the experts.
pub fn sort_of_counts(counts: &[usize], seed: u64) -> ExpertSort {
    use rand::seq::SliceRandom;
    let mut ids: Vec<u32> = counts
        .iter()
        .enumerate()
        .flat_map(|(e, &c)| std::iter::repeat_n(e as u32, c))
        .collect();
    ids.shuffle(&mut rng(seed));
    let t = ids.len();
    let ids = Tensor::from_slice(&ids, &[t, 1]).unwrap();
    expert_sort_on(Backend::CpuReference, &ids, counts.len()).unwrap()
}

/// The bad row mappings a grouped GEMM must report and not follow, for 4
/// experts and K = 128: three bad offset lists over 16 sorted rows of
/// `x16`, then 16 gathered slots (k = 2) over `x8` with slot 3 past T·k.
/// `run(x, rows, out)` runs the GEMM into a poisoned `[16, 64]` output;
/// each case must leave an error.
pub fn check_bad_rows(run: &dyn Fn(&Tensor, TcRows<'_>, &Tensor)) {
    let dev = moekit::cuda::device(0).unwrap();
    let x16 = random(&[16, 128], DType::Bf16, 2).to_device(gpu()).unwrap();
    for off in [[0u32, 8, 4, 16, 16], [0, 4, 8, 12, 1000], [3, 4, 8, 12, 16]] {
        let o = Tensor::from_slice(&off, &[5])
            .unwrap()
            .to_device(gpu())
            .unwrap();
        run(&x16, TcRows::Sorted(&o), &poisoned(&[16, 64], DType::Bf16));
        assert!(dev.check_errors().is_err(), "offsets {off:?} not reported");
    }
    let o = Tensor::from_slice(&[0u32, 16, 16, 16, 16], &[5])
        .unwrap()
        .to_device(gpu())
        .unwrap();
    let mut s: Vec<u32> = (0..16).collect();
    s[3] = 1 << 30;
    let s = Tensor::from_slice(&s, &[16])
        .unwrap()
        .to_device(gpu())
        .unwrap();
    let x8 = random(&[8, 128], DType::Bf16, 2).to_device(gpu()).unwrap();
    let rows = TcRows::Gathered {
        offsets: &o,
        sorted: &s,
        top_k: 2,
    };
    run(&x8, rows, &poisoned(&[16, 64], DType::Bf16));
    assert!(dev.check_errors().is_err(), "a slot past T·k not reported");
}

/// A token's output alone equals its row in the batch: `run` maps x
/// (`[T, K]` on the host) to its output `[T, n]` (f32, host); tokens 0,
/// T / 2 and T − 1 are each run alone.
pub fn check_alone_equals_batch(x: &Tensor, n: usize, run: &dyn Fn(&Tensor) -> Vec<f32>) {
    let (t, kk) = (x.shape()[0], x.shape()[1]);
    let full = run(x);
    let rows = x.to_f32_vec().unwrap();
    for i in [0, t / 2, t - 1] {
        let one = Tensor::from_f32(&rows[i * kk..(i + 1) * kk], &[1, kk], x.dtype()).unwrap();
        assert_eq!(run(&one), full[i * n..(i + 1) * n].to_vec(), "token {i}");
    }
}
