//! Expert sort: from routed ids `[T, k]` build the expert-major order of the
//! `T·k` (token, slot) pairs.
//!
//! Slot `s = t·k + j` is token `t`'s `j`-th choice. The sort is stable: within
//! an expert, slots keep increasing `s`. It is a counting sort (histogram,
//! exclusive scan, scatter) so that it can run on a GPU with no host round-trip.

use crate::device::Backend;
use crate::error::{ensure, Result};
use crate::ops::check_dtype;
use crate::tensor::Tensor;

/// Expert-major order of routed slots.
#[derive(Debug, Clone)]
pub struct ExpertSort {
    /// `u32 [E + 1]`: expert `e` owns sorted positions `offsets[e]..offsets[e+1]`.
    pub offsets: Tensor,
    /// `u32 [T·k]`: the slot `t·k + j` at each sorted position.
    pub sorted: Tensor,
    /// `u32 [T·k]`: the sorted position of each slot (inverse of `sorted`).
    pub inverse: Tensor,
    /// E.
    pub n_experts: usize,
    /// k.
    pub top_k: usize,
}

impl ExpertSort {
    /// T, the number of tokens.
    pub fn n_tokens(&self) -> usize {
        self.sorted.numel() / self.top_k.max(1)
    }
}

const OP: &str = "expert_sort";

/// Sorts with the backend of `ids`' device.
pub fn expert_sort(ids: &Tensor, n_experts: usize) -> Result<ExpertSort> {
    expert_sort_on(Backend::for_device(ids.device())?, ids, n_experts)
}

/// Sorts `ids` (`u32 [T, k]`, every id `< n_experts`) with an explicit backend.
///
/// An id `>= n_experts` is an error here on the CPU backends; on CUDA the
/// device reports it at the next copy to the host (the slot is sorted after
/// every real expert, outside `offsets[E]`; see `cuda/ops/sort.rs`).
pub fn expert_sort_on(backend: Backend, ids: &Tensor, n_experts: usize) -> Result<ExpertSort> {
    check_dtype(OP, "ids", ids, crate::DType::U32)?;
    ensure(
        ids.rank() == 2,
        OP,
        "ids",
        "rank 2 [T, k]",
        format!("shape {:?}", ids.shape()),
    )?;
    ensure(
        (1..=1024).contains(&n_experts),
        OP,
        "n_experts",
        "1..=1024",
        n_experts,
    )?;
    let top_k = ids.shape()[1];
    ensure(top_k > 0, OP, "ids", "k > 0", top_k)?;
    ensure(
        u32::try_from(ids.numel()).is_ok(),
        OP,
        "ids",
        "fewer than 2^32 slots",
        ids.numel(),
    )?;
    if backend == Backend::Cuda {
        // On the device, no host round trip: ids >= n_experts are reported
        // through the device error word (see cuda::ops::sort).
        return crate::cuda::ops::sort::expert_sort(ids, n_experts);
    }
    let flat = ids.as_slice::<u32>()?;
    if let Some((s, &e)) = flat
        .iter()
        .enumerate()
        .find(|(_, &e)| e as usize >= n_experts)
    {
        return Err(crate::error::invalid(
            OP,
            "ids",
            format!("expert ids < {n_experts}"),
            format!("id {e} at token {}, slot {}", s / top_k, s % top_k),
        ));
    }
    let (offsets, sorted) = match backend {
        Backend::CpuReference => crate::cpu::reference::sort::expert_sort(flat, n_experts),
        Backend::CpuFast | Backend::Cuda => crate::cpu::fast::sort::expert_sort(flat, n_experts),
    };
    let mut inverse = vec![0u32; sorted.len()];
    for (p, &s) in sorted.iter().enumerate() {
        inverse[s as usize] = p as u32;
    }
    let n = sorted.len();
    Ok(ExpertSort {
        offsets: Tensor::from_slice(&offsets, &[n_experts + 1])?,
        sorted: Tensor::from_slice(&sorted, &[n])?,
        inverse: Tensor::from_slice(&inverse, &[n])?,
        n_experts,
        top_k,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_example_and_rejections() {
        let ids = Tensor::from_slice(&[2u32, 0, 0, 2, 1, 0], &[3, 2]).unwrap();
        for b in [Backend::CpuReference, Backend::CpuFast] {
            let s = expert_sort_on(b, &ids, 4).unwrap();
            assert_eq!(s.offsets.as_slice::<u32>().unwrap(), &[0, 3, 4, 6, 6]);
            assert_eq!(s.sorted.as_slice::<u32>().unwrap(), &[1, 2, 5, 4, 0, 3]);
            assert_eq!(s.inverse.as_slice::<u32>().unwrap(), &[4, 0, 1, 5, 3, 2]);
        }
        let err = expert_sort(&ids, 2).unwrap_err().to_string();
        assert!(
            err.contains("expert_sort") && err.contains("id 2 at token 0, slot 0"),
            "{err}"
        );
        assert!(expert_sort(&ids, 0).is_err());
        assert!(expert_sort(&ids, 2000).is_err());
        let f = Tensor::from_slice(&[0f32; 6], &[3, 2]).unwrap();
        assert!(expert_sort(&f, 4).is_err());
        assert!(expert_sort(&ids.reshape(&[6]).unwrap(), 4).is_err());
    }
}
