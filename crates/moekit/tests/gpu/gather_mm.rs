//! Grouped quantized matmul, the fused gate+up+SwiGLU projection and the
//! elementwise SwiGLU on the GPU vs the CPU reference (f64 accumulation), on
//! fresh random weights (`format::random::random_weights`) and activations.
//!
//! * Dequantization is checked **bit for bit** for every format: with one-hot
//!   f32 activation rows the kernel's output is exactly one dequantized
//!   weight (one exact product by 1, sums with exact zeros), compared with
//!   `QuantWeights::dequantize_expert` by `==`.
//! * Products: NMSE against the CPU reference, whose output is rounded to the
//!   activation dtype too. Bounds (`common::bound`): 1e-9 for f32 outputs
//!   (f32 vs f64 accumulation over K ≤ 1280: expected ~1e-13); 1e-5 for f16
//!   (two independent roundings to 11 bits: ≤ ~1e-7); 1e-4 for bf16 (8 bits:
//!   ≤ ~1e-5).
//! * Every format of `WeightFormat::all()` (MLX's mxfp4 / nvfp4 / mxfp8
//!   included) × activation dtype, plain and
//!   fused (both `GateUp` layouts), both row→expert layouts and the single
//!   expert; affine scales also in f32 and bf16; ragged M, N and K (K past the
//!   kernel's 1024-column slab; dense K not a multiple of the 16-byte chunk);
//!   T ∈ `common::TOKENS` (M = 4·T rows; smaller N and K for T ≥ 333); experts
//!   with no rows (first, middle, last), all rows on one expert, M = 0.
//! * Outputs are preallocated and poisoned with NaN; ids ≥ E and bad offsets
//!   must be reported, their rows skipped (left NaN) and the others computed.

use crate::common::*;
use moekit::format::random::random_weights;
use moekit::format::{AffineParams, GgmlType};
use moekit::ops::act::{gather_swiglu_on, swiglu_on, GateUp};
use moekit::ops::gather_mm::{gather_mm_on, qmm_on, RowExperts};
use moekit::testing::cuda::act::swiglu_into;
use moekit::testing::cuda::gather_mm::{gather_mm_into, gather_swiglu_into};
use moekit::{Backend, DType, Device, QuantWeights, Tensor, WeightFormat};
use rand::Rng;

const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::Bf16];

/// Random CPU weights.
fn weights(
    format: WeightFormat,
    e: usize,
    n: usize,
    k: usize,
    scale: DType,
    seed: u64,
) -> QuantWeights {
    random_weights(format, e, n, k, scale, seed, &|| {}).unwrap()
}

/// `target` rounded up to the format's K granularity.
fn round_k(format: WeightFormat, target: usize) -> usize {
    let g = format.k_granularity();
    target.div_ceil(g) * g
}

/// How rows find their expert.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Layout {
    PerRow,
    Sorted,
    Single,
}

/// The row→expert tensor (on the CPU) of `m` rows over `e` experts; experts
/// in `empty` get no rows. `None` for [`Layout::Single`].
fn row_map(layout: Layout, m: usize, e: usize, empty: &[usize], seed: u64) -> Option<Tensor> {
    let mut r = rng(seed);
    let live: Vec<u32> = (0..e as u32)
        .filter(|x| !empty.contains(&(*x as usize)))
        .collect();
    let ids: Vec<u32> = (0..m)
        .map(|_| live[r.random_range(0..live.len())])
        .collect();
    match layout {
        Layout::Single => None,
        Layout::PerRow => Some(Tensor::from_slice(&ids, &[m]).unwrap()),
        Layout::Sorted => {
            let mut off = vec![0u32; e + 1];
            for &i in &ids {
                off[i as usize + 1] += 1;
            }
            for j in 0..e {
                off[j + 1] += off[j];
            }
            Some(Tensor::from_slice(&off, &[e + 1]).unwrap())
        }
    }
}

fn experts(layout: Layout, map: Option<&Tensor>) -> RowExperts<'_> {
    match (layout, map) {
        (Layout::PerRow, Some(t)) => RowExperts::PerRow(t),
        (Layout::Sorted, Some(t)) => RowExperts::Sorted(t),
        _ => RowExperts::Single,
    }
}

/// Operands of one case, on the CPU and on the GPU.
struct Operands {
    x: Tensor,
    x_gpu: Tensor,
    layout: Layout,
    map: Option<Tensor>,
    map_gpu: Option<Tensor>,
}

impl Operands {
    fn new(
        dtype: DType,
        m: usize,
        k: usize,
        e: usize,
        layout: Layout,
        empty: &[usize],
        seed: u64,
    ) -> Operands {
        let x = random(&[m, k], dtype, seed);
        let map = row_map(layout, m, e, empty, seed + 1);
        Operands {
            x_gpu: x.to_device(gpu()).unwrap(),
            map_gpu: map.as_ref().map(|t| t.to_device(gpu()).unwrap()),
            x,
            layout,
            map,
        }
    }
    fn cpu(&self) -> RowExperts<'_> {
        experts(self.layout, self.map.as_ref())
    }
    fn gpu(&self) -> RowExperts<'_> {
        experts(self.layout, self.map_gpu.as_ref())
    }
    fn m(&self) -> usize {
        self.x.shape()[0]
    }
}

/// GPU `gather_mm` into a poisoned output vs the CPU reference.
fn check_mm(w: &QuantWeights, w_gpu: &QuantWeights, o: &Operands, what: &str) {
    let dt = o.x.dtype();
    let want = gather_mm_on(Backend::CpuReference, &o.x, w, o.cpu()).unwrap();
    let out = poisoned(&[o.m(), w.rows()], dt);
    gather_mm_into(&o.x_gpu, w_gpu, o.gpu(), &out).unwrap();
    let e = nmse(&host_f32(&out), &want.to_f32_vec().unwrap());
    assert!(
        e <= bound(dt),
        "gather_mm {what} {dt} {:?}: NMSE {e:e} > {:e}",
        o.layout,
        bound(dt)
    );
}

/// GPU `gather_swiglu` into a poisoned output vs the CPU reference.
fn check_swiglu(w: &GateUp, w_gpu: &GateUp, o: &Operands, what: &str) {
    let dt = o.x.dtype();
    let want = gather_swiglu_on(Backend::CpuReference, &o.x, w, o.cpu()).unwrap();
    let out = poisoned(&[o.m(), w.intermediate()], dt);
    gather_swiglu_into(&o.x_gpu, w_gpu, o.gpu(), &out).unwrap();
    let e = nmse(&host_f32(&out), &want.to_f32_vec().unwrap());
    assert!(
        e <= bound(dt),
        "gather_swiglu {what} {dt} {:?}: NMSE {e:e} > {:e}",
        o.layout,
        bound(dt)
    );
}

/// Gate and up weights of `i` rows each, separate or fused, on the CPU and the GPU.
fn gate_up(
    fused: bool,
    format: WeightFormat,
    e: usize,
    i: usize,
    k: usize,
    scale: DType,
    seed: u64,
) -> (GateUp, GateUp) {
    let dev = gpu();
    if fused {
        let w = weights(format, e, 2 * i, k, scale, seed);
        let g = GateUp::fused(w.to_device(dev).unwrap()).unwrap();
        (GateUp::fused(w).unwrap(), g)
    } else {
        let (g, u) = (
            weights(format, e, i, k, scale, seed),
            weights(format, e, i, k, scale, seed + 1),
        );
        let gg = GateUp::separate(g.to_device(dev).unwrap(), u.to_device(dev).unwrap()).unwrap();
        (GateUp::separate(g, u).unwrap(), gg)
    }
}

/// One-hot f32 rows: row r is e_{r mod K} and uses expert r / K, so the
/// output is exactly the transposed dequantized weights of every expert.
fn check_dequant_bit_exact(format: WeightFormat, scale: DType, k: usize) {
    let (e, n) = (2, 13);
    let w = weights(format, e, n, k, scale, 11);
    let w_gpu = w.to_device(gpu()).unwrap();
    let m = e * k;
    let mut x = vec![0f32; m * k];
    for r in 0..m {
        x[r * k + r % k] = 1.0;
    }
    let ids: Vec<u32> = (0..m).map(|r| (r / k) as u32).collect();
    let x = Tensor::from_f32(&x, &[m, k], DType::F32)
        .unwrap()
        .to_device(gpu())
        .unwrap();
    let ids = Tensor::from_slice(&ids, &[m])
        .unwrap()
        .to_device(gpu())
        .unwrap();
    let out = poisoned(&[m, n], DType::F32);
    gather_mm_into(&x, &w_gpu, RowExperts::PerRow(&ids), &out).unwrap();
    let got = host_f32(&out);
    let mut bad = Vec::new();
    for ex in 0..e {
        let want = w.dequantize_expert(ex).unwrap();
        for kk in 0..k {
            for nn in 0..n {
                let (g, wv) = (got[(ex * k + kk) * n + nn], want[nn * k + kk]);
                if g != wv {
                    bad.push((ex, nn, kk, g, wv));
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "{format} scales {scale} K={k}: {} weights differ, first {:?}",
        bad.len(),
        &bad[..bad.len().min(5)]
    );
}

/// Every check of one format: bit-exact dequantization; plain and fused
/// (layout alternating) products for every activation dtype with ragged
/// shapes, one expert left without rows, per-row ids and sorted offsets.
fn check_format(format: WeightFormat, scale: DType) {
    check_dequant_bit_exact(format, scale, round_k(format, 296));
    let (e, n, m) = (5, 45, 37);
    let k = round_k(format, 1101);
    let w = weights(format, e, n, k, scale, 3);
    let w_gpu = w.to_device(gpu()).unwrap();
    for (i, dt) in DTYPES.into_iter().enumerate() {
        let layout = if i % 2 == 0 {
            Layout::PerRow
        } else {
            Layout::Sorted
        };
        let o = Operands::new(dt, m, k, e, layout, &[3], 20 + i as u64);
        check_mm(&w, &w_gpu, &o, &format!("{format} scales {scale} K={k}"));
        let (gu, gu_gpu) = gate_up(i % 2 == 1, format, e, 23, k, scale, 5);
        check_swiglu(
            &gu,
            &gu_gpu,
            &o,
            &format!("{format} scales {scale} K={k} fused={}", i % 2 == 1),
        );
    }
}

fn affine(bits: u32, group_size: usize) -> WeightFormat {
    WeightFormat::Affine(AffineParams { bits, group_size })
}

#[test]
fn dense_formats_match_cpu() {
    for f in WeightFormat::all()
        .into_iter()
        .filter(|f| matches!(f, WeightFormat::Dense(_)))
    {
        check_format(f, DType::F32);
    }
}

#[test]
fn affine_2_3_4_bits_f16_scales_match_cpu() {
    for f in WeightFormat::all() {
        if let WeightFormat::Affine(p) = f {
            if p.bits <= 4 {
                check_format(f, DType::F16);
            }
        }
    }
}

#[test]
fn affine_5_6_8_bits_f16_scales_match_cpu() {
    for f in WeightFormat::all() {
        if let WeightFormat::Affine(p) = f {
            if p.bits > 4 {
                check_format(f, DType::F16);
            }
        }
    }
}

#[test]
fn affine_f32_and_bf16_scales_match_cpu() {
    // Every bit width with f32 and bf16 scales (f32 activations; the group
    // size rotates); plain and fused.
    for (i, bits) in [2, 3, 4, 5, 6, 8].into_iter().enumerate() {
        for scale in [DType::F32, DType::Bf16] {
            let f = affine(bits, [32, 64, 128][i % 3]);
            check_dequant_bit_exact(f, scale, 384);
            let (e, n, m, k) = (4, 21, 19, 1152);
            let w = weights(f, e, n, k, scale, 9);
            let o = Operands::new(DType::F32, m, k, e, Layout::Sorted, &[0], 10);
            check_mm(
                &w,
                &w.to_device(gpu()).unwrap(),
                &o,
                &format!("{f} scales {scale}"),
            );
            let (gu, gu_gpu) = gate_up(bits % 2 == 0, f, e, 17, k, scale, 12);
            check_swiglu(&gu, &gu_gpu, &o, &format!("{f} scales {scale}"));
        }
    }
}

#[test]
fn affine_u8_matches_cpu() {
    for f in WeightFormat::all()
        .into_iter()
        .filter(|f| matches!(f, WeightFormat::AffineU8 { .. }))
    {
        check_format(f, DType::F32);
    }
}

/// MLX's mxfp4, nvfp4 (two e4m3 scales a 32-code chunk) and mxfp8.
#[test]
fn mlx_fp_modes_match_cpu() {
    for f in WeightFormat::all()
        .into_iter()
        .filter(|f| matches!(f, WeightFormat::MlxFp(_)))
    {
        check_format(f, DType::F32);
    }
}

/// FP8 block-scaled weights (e4m3 codes, per-row f32 scales of 32, 64 or
/// 128 columns): bit-exact dequantization and gather_mm vs the CPU.
#[test]
fn fp8_block_formats_match_cpu() {
    for f in WeightFormat::all()
        .into_iter()
        .filter(|f| matches!(f, WeightFormat::Fp8Block { .. }))
    {
        check_format(f, DType::F32);
    }
}

/// The types of issue 12 (ggml type ids from 16 on: IQ*, MXFP4, TQ*).
fn is_issue_12_type(t: GgmlType) -> bool {
    t.ggml_type_id() >= 16
}

#[test]
fn ggml_32_blocks_match_cpu() {
    for t in GgmlType::ALL
        .into_iter()
        .filter(|&t| t.block_size() == 32 && !is_issue_12_type(t))
    {
        check_format(WeightFormat::Ggml(t), DType::F32);
    }
}

#[test]
fn ggml_k_quants_match_cpu() {
    for t in GgmlType::ALL
        .into_iter()
        .filter(|&t| t.block_size() == 256 && !is_issue_12_type(t))
    {
        check_format(WeightFormat::Ggml(t), DType::F32);
    }
}

/// GGUF NVFP4 (64-weight blocks of 36 bytes) alone, for runs that filter
/// on it (also in the test below).
#[test]
fn ggml_nvfp4_matches_cpu() {
    check_format(WeightFormat::Ggml(GgmlType::NVFP4), DType::F32);
}

/// IQ4_NL, IQ4_XS, MXFP4 (17-byte blocks: odd row lengths at K = 1120),
/// NVFP4, the IQ1–IQ3 grid types and TQ1_0, TQ2_0.
#[test]
fn ggml_iq_mxfp4_and_ternary_types_match_cpu() {
    for t in GgmlType::ALL.into_iter().filter(|&t| is_issue_12_type(t)) {
        check_format(WeightFormat::Ggml(t), DType::F32);
    }
}

#[test]
fn token_sweep_both_layouts() {
    // T tokens × k = 4 rows, E = 16 with experts 0, 7 and 15 empty; the
    // format rotates over one of each family; plain and fused.
    let formats = [
        WeightFormat::Ggml(GgmlType::Q4_K),
        affine(4, 64),
        WeightFormat::Dense(DType::Bf16),
        WeightFormat::Ggml(GgmlType::Q8_0),
        affine(3, 32),
        WeightFormat::Ggml(GgmlType::Q6_K),
    ];
    let e = 16;
    let mut case = 0;
    for &t in &TOKENS {
        let (n, k_target) = if t >= 333 { (24, 256) } else { (72, 1100) };
        for dt in DTYPES {
            for layout in [Layout::Sorted, Layout::PerRow] {
                let f = formats[case % formats.len()];
                case += 1;
                let k = round_k(f, k_target);
                let w = weights(f, e, n, k, DType::F16, case as u64);
                let o = Operands::new(dt, 4 * t, k, e, layout, &[0, 7, 15], 100 + case as u64);
                let what = format!("T={t} {f} K={k}");
                check_mm(&w, &w.to_device(gpu()).unwrap(), &o, &what);
                let (gu, gu_gpu) = gate_up(case % 2 == 0, f, e, n / 2, k, DType::F16, case as u64);
                check_swiglu(&gu, &gu_gpu, &o, &what);
            }
        }
    }
}

#[test]
fn edge_cases() {
    let f = WeightFormat::Ggml(GgmlType::Q4_K);
    let (e, n, k) = (6, 19, 512);
    let w = weights(f, e, n, k, DType::F32, 1);
    let w_gpu = w.to_device(gpu()).unwrap();
    // All rows on one expert (first, middle, last), sorted and per-row.
    for only in [0, 2, 5] {
        let empty: Vec<usize> = (0..e).filter(|&x| x != only).collect();
        for layout in [Layout::Sorted, Layout::PerRow] {
            let o = Operands::new(DType::F32, 29, k, e, layout, &empty, only as u64);
            check_mm(&w, &w_gpu, &o, &format!("all rows on expert {only}"));
        }
    }
    // Tiny shapes: one row, fewer output columns than a block, one chunk of K.
    for (m, n, k) in [(1, 1, 256), (1, 3, 256), (9, 9, 256), (8, 8, 768)] {
        let w = weights(f, 2, n, k, DType::F32, 2);
        let o = Operands::new(DType::Bf16, m, k, 2, Layout::PerRow, &[], 3);
        check_mm(
            &w,
            &w.to_device(gpu()).unwrap(),
            &o,
            &format!("M={m} N={n}"),
        );
    }
    // M = 0: nothing to do, and nothing fails.
    let o = Operands::new(DType::F16, 0, k, e, Layout::Sorted, &[], 4);
    let out = poisoned(&[0, n], DType::F16);
    gather_mm_into(&o.x_gpu, &w_gpu, o.gpu(), &out).unwrap();
    assert_eq!(out.to_device(Device::Cpu).unwrap().shape(), [0, n]);
}

#[test]
fn front_ends_dispatch_to_the_gpu() {
    // Offsets and ids on the device: a CPU path (which reads them on the
    // host) would fail, so these pass only through the CUDA dispatch.
    let dev = gpu();
    let f = affine(4, 32);
    let (e, n, k, m) = (4, 40, 320, 50);
    let w = weights(f, e, n, k, DType::Bf16, 5);
    let w_gpu = w.to_device(dev).unwrap();
    for layout in [Layout::Sorted, Layout::PerRow] {
        let o = Operands::new(DType::F32, m, k, e, layout, &[1], 6);
        let want = gather_mm_on(Backend::CpuReference, &o.x, &w, o.cpu()).unwrap();
        let got = gather_mm_on(Backend::Cuda, &o.x_gpu, &w_gpu, o.gpu()).unwrap();
        assert_eq!(got.device(), dev);
        let err = nmse(&host_f32(&got), &want.to_f32_vec().unwrap());
        assert!(err <= bound(DType::F32), "front end {layout:?}: {err:e}");
        let (gu, gu_gpu) = gate_up(true, f, e, 16, k, DType::Bf16, 7);
        let want = gather_swiglu_on(Backend::CpuReference, &o.x, &gu, o.cpu()).unwrap();
        let got = gather_swiglu_on(Backend::Cuda, &o.x_gpu, &gu_gpu, o.gpu()).unwrap();
        let err = nmse(&host_f32(&got), &want.to_f32_vec().unwrap());
        assert!(
            err <= bound(DType::F32),
            "front end swiglu {layout:?}: {err:e}"
        );
    }
    // Single expert (qmm, RowExperts::Single) and a shared-expert-like fused SwiGLU.
    let w1 = weights(
        WeightFormat::Ggml(GgmlType::Q5_K),
        1,
        33,
        512,
        DType::F32,
        8,
    );
    let x = random(&[7, 512], DType::Bf16, 9);
    let want = qmm_on(Backend::CpuReference, &x, &w1).unwrap();
    let got = qmm_on(
        Backend::Cuda,
        &x.to_device(dev).unwrap(),
        &w1.to_device(dev).unwrap(),
    )
    .unwrap();
    let err = nmse(&host_f32(&got), &want.to_f32_vec().unwrap());
    assert!(err <= bound(DType::Bf16), "qmm single expert: {err:e}");
    let (gu, gu_gpu) = gate_up(
        false,
        WeightFormat::Ggml(GgmlType::Q4_0),
        1,
        24,
        512,
        DType::F32,
        10,
    );
    let o = Operands::new(DType::F32, 7, 512, 1, Layout::Single, &[], 11);
    check_swiglu(&gu, &gu_gpu, &o, "single expert");
}

#[test]
fn separate_gate_up_of_different_formats() {
    // Not one kernel instance: two grouped matmuls and the elementwise SwiGLU.
    let dev = gpu();
    let (e, i, k) = (3, 20, 512);
    let g = weights(WeightFormat::Ggml(GgmlType::Q4_K), e, i, k, DType::F32, 1);
    let u = weights(WeightFormat::Ggml(GgmlType::Q6_K), e, i, k, DType::F32, 2);
    let gu_gpu = GateUp::separate(g.to_device(dev).unwrap(), u.to_device(dev).unwrap()).unwrap();
    let gu = GateUp::separate(g, u).unwrap();
    for (j, dt) in DTYPES.into_iter().enumerate() {
        let o = Operands::new(
            dt,
            30,
            k,
            e,
            [Layout::Sorted, Layout::PerRow][j % 2],
            &[],
            12,
        );
        check_swiglu(&gu, &gu_gpu, &o, "q4_k gate, q6_k up");
    }
}

#[test]
fn elementwise_swiglu_matches_cpu() {
    for &t in &TOKENS {
        for (j, dt) in DTYPES.into_iter().enumerate() {
            let shape = [t, [768, 333, 1536][j]];
            let (g, u) = (random(&shape, dt, 1), random(&shape, dt, 2));
            // Wider inputs than [-1, 1) so silu's tails are exercised.
            let g = Tensor::from_f32(
                &g.to_f32_vec()
                    .unwrap()
                    .iter()
                    .map(|v| v * 12.0)
                    .collect::<Vec<_>>(),
                &shape,
                dt,
            )
            .unwrap();
            let want = swiglu_on(Backend::CpuReference, &g, &u).unwrap();
            let out = poisoned(&shape, dt);
            swiglu_into(
                &g.to_device(gpu()).unwrap(),
                &u.to_device(gpu()).unwrap(),
                &out,
            )
            .unwrap();
            let e = nmse(&host_f32(&out), &want.to_f32_vec().unwrap());
            assert!(e <= bound(dt), "swiglu T={t} {dt}: NMSE {e:e}");
            let front = swiglu_on(
                Backend::Cuda,
                &g.to_device(gpu()).unwrap(),
                &u.to_device(gpu()).unwrap(),
            )
            .unwrap();
            assert_eq!(host_f32(&front), host_f32(&out), "front end = kernel");
        }
    }
}

/// Runs `f` into a poisoned `[m, n]` f32 output, expects the device to report
/// `what` at the first copy, then returns the output (the second copy succeeds).
fn reported(m: usize, n: usize, what: &str, f: impl FnOnce(&Tensor)) -> Vec<f32> {
    let out = poisoned(&[m, n], DType::F32);
    f(&out);
    let err = out.to_device(Device::Cpu).unwrap_err().to_string();
    assert!(
        err.contains(what),
        "expected a report of {what:?}, got: {err}"
    );
    host_f32(&out)
}

#[test]
fn bad_ids_and_offsets_are_reported_and_skipped() {
    let dev = gpu();
    let f = WeightFormat::Ggml(GgmlType::Q8_0);
    let (e, n, k, m) = (4, 16, 64, 10);
    let w = weights(f, e, n, k, DType::F32, 1);
    let w_gpu = w.to_device(dev).unwrap();
    let x = random(&[m, k], DType::F32, 2);
    let x_gpu = x.to_device(dev).unwrap();
    // Per-row ids: rows 3 and 8 name experts 4 (= E) and u32::MAX.
    let mut ids: Vec<u32> = (0..m as u32).map(|r| r % e as u32).collect();
    ids[3] = e as u32;
    ids[8] = u32::MAX;
    let ids_gpu = Tensor::from_slice(&ids, &[m])
        .unwrap()
        .to_device(dev)
        .unwrap();
    let got = reported(m, n, "expert id", |out| {
        gather_mm_into(&x_gpu, &w_gpu, RowExperts::PerRow(&ids_gpu), out).unwrap()
    });
    let dec: Vec<Vec<f32>> = (0..e).map(|ex| w.dequantize_expert(ex).unwrap()).collect();
    let xv = x.to_f32_vec().unwrap();
    for r in 0..m {
        for nn in 0..n {
            let g = got[r * n + nn];
            match dec.get(ids[r] as usize) {
                None => assert!(g.is_nan(), "row {r} with a bad id was written"),
                Some(wm) => {
                    let want: f64 = (0..k)
                        .map(|i| xv[r * k + i] as f64 * wm[nn * k + i] as f64)
                        .sum();
                    assert!(
                        (g as f64 - want).abs() <= 1e-5 * (1.0 + want.abs()),
                        "row {r} col {nn}: {g} vs {want}"
                    );
                }
            }
        }
    }
    // The fused projection reports too.
    let (_, gu_gpu) = gate_up(true, f, e, 8, k, DType::F32, 3);
    reported(m, 8, "expert id", |out| {
        gather_swiglu_into(&x_gpu, &gu_gpu, RowExperts::PerRow(&ids_gpu), out).unwrap()
    });
    // Sorted offsets: decreasing, not ending at M, starting above 0, past M.
    for off in [
        [0u32, 6, 3, 8, 10],
        [0, 2, 4, 6, 8],
        [1, 2, 4, 6, 10],
        [0, 2, 4, 6, 12],
    ] {
        let off_gpu = Tensor::from_slice(&off, &[e + 1])
            .unwrap()
            .to_device(dev)
            .unwrap();
        reported(m, n, "offsets", |out| {
            gather_mm_into(&x_gpu, &w_gpu, RowExperts::Sorted(&off_gpu), out).unwrap()
        });
    }
    // The device is usable afterwards and valid offsets report nothing.
    let off_gpu = Tensor::from_slice(&[0u32, 3, 3, 7, 10], &[e + 1])
        .unwrap()
        .to_device(dev)
        .unwrap();
    let out = poisoned(&[m, n], DType::F32);
    gather_mm_into(&x_gpu, &w_gpu, RowExperts::Sorted(&off_gpu), &out).unwrap();
    assert!(host_f32(&out).iter().all(|v| v.is_finite()));
}

#[test]
fn shape_and_device_errors_are_caught_on_the_host() {
    let dev = gpu();
    let w = weights(WeightFormat::Ggml(GgmlType::Q4_0), 2, 8, 64, DType::F32, 1);
    let w_gpu = w.to_device(dev).unwrap();
    let x = random(&[3, 64], DType::F32, 2).to_device(dev).unwrap();
    let out = poisoned(&[3, 8], DType::F32);
    let ids = Tensor::from_slice(&[0u32, 1], &[2])
        .unwrap()
        .to_device(dev)
        .unwrap();
    assert!(
        gather_mm_into(&x, &w_gpu, RowExperts::PerRow(&ids), &out).is_err(),
        "ids length"
    );
    let off = Tensor::from_slice(&[0u32, 3], &[2])
        .unwrap()
        .to_device(dev)
        .unwrap();
    assert!(
        gather_mm_into(&x, &w_gpu, RowExperts::Sorted(&off), &out).is_err(),
        "offsets length"
    );
    assert!(
        gather_mm_into(&x, &w_gpu, RowExperts::Single, &out).is_err(),
        "single with E = 2"
    );
    assert!(
        gather_mm_into(&x, &w, RowExperts::Sorted(&off), &out).is_err(),
        "weights on the CPU"
    );
    let bad_out = poisoned(&[3, 9], DType::F32);
    let ids3 = Tensor::from_slice(&[0u32, 1, 1], &[3])
        .unwrap()
        .to_device(dev)
        .unwrap();
    assert!(
        gather_mm_into(&x, &w_gpu, RowExperts::PerRow(&ids3), &bad_out).is_err(),
        "out shape"
    );
    gather_mm_into(&x, &w_gpu, RowExperts::PerRow(&ids3), &out).unwrap();
    assert!(host_f32(&out).iter().all(|v| v.is_finite()));
}
