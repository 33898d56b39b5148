//! permute / unpermute on the GPU vs the CPU reference (bit-exact: pure
//! copies, and the combine sums in the same slot order in f32).

use crate::common::*;
use moekit::ops::permute::{permute_on, unpermute_on};
use moekit::ops::sort::expert_sort_on;
use moekit::testing::cuda::permute::{permute_into, unpermute_into};
use moekit::{Backend, DType, Device, Tensor};
use rand::Rng;

#[test]
fn permute_and_unpermute_match_cpu() {
    let dev = gpu();
    for &t in &TOKENS {
        for (k, e, h) in [(1, 1, 64), (8, 128, 2048 / 8 + 3)] {
            let mut r = rng(t as u64);
            let ids: Vec<u32> = (0..t * k).map(|_| r.random_range(0..e as u32)).collect();
            let ids = Tensor::from_slice(&ids, &[t, k]).unwrap();
            let sort = expert_sort_on(Backend::CpuReference, &ids, e).unwrap();
            let sort_gpu = moekit::ops::sort::ExpertSort {
                offsets: sort.offsets.to_device(dev).unwrap(),
                sorted: sort.sorted.to_device(dev).unwrap(),
                inverse: sort.inverse.to_device(dev).unwrap(),
                ..sort.clone()
            };
            for dt in [DType::F32, DType::F16, DType::Bf16] {
                let x = random(&[t, h], dt, 1);
                let want = permute_on(Backend::CpuReference, &x, &sort).unwrap();
                let out = poisoned(&[t * k, h], dt);
                permute_into(&x.to_device(dev).unwrap(), &sort_gpu, &out).unwrap();
                let got = out.to_device(Device::Cpu).unwrap();
                assert_eq!(
                    got.bytes().unwrap(),
                    want.bytes().unwrap(),
                    "permute T={t} k={k} {dt}"
                );

                let w = random(&[t, k], DType::F32, 2);
                let want = unpermute_on(Backend::CpuReference, &want, &sort, &w).unwrap();
                let out = poisoned(&[t, h], dt);
                unpermute_into(
                    &got.to_device(dev).unwrap(),
                    &sort_gpu,
                    &w.to_device(dev).unwrap(),
                    &out,
                )
                .unwrap();
                let e = nmse(&host_f32(&out), &want.to_f32_vec().unwrap());
                assert!(e <= bound(dt), "unpermute T={t} k={k} {dt}: NMSE {e:e}");
            }
        }
    }
}

#[test]
fn out_of_range_slot_is_reported_not_accessed() {
    let dev = gpu();
    let x = random(&[2, 64], DType::F32, 3).to_device(dev).unwrap();
    let ids = Tensor::from_slice(&[0u32, 1, 1, 0], &[2, 2]).unwrap();
    let sort = expert_sort_on(Backend::CpuReference, &ids, 2).unwrap();
    let bad = Tensor::from_slice(&[0u32, 1, 99, 3], &[4]).unwrap(); // slot 99 → token 49
    let sort_gpu = moekit::ops::sort::ExpertSort {
        offsets: sort.offsets.to_device(dev).unwrap(),
        sorted: bad.to_device(dev).unwrap(),
        inverse: sort.inverse.to_device(dev).unwrap(),
        ..sort
    };
    let out = poisoned(&[4, 64], DType::F32);
    permute_into(&x, &sort_gpu, &out).unwrap();
    let err = out.to_device(Device::Cpu).unwrap_err().to_string();
    assert!(err.contains("out of range"), "{err}");
}
