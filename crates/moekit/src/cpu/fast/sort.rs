//! Counting-sort of slots by expert: histogram, exclusive scan, stable scatter.

/// Returns `(offsets [E+1], sorted slots)` for validated ids.
pub fn expert_sort(ids: &[u32], n_experts: usize) -> (Vec<u32>, Vec<u32>) {
    let mut offsets = vec![0u32; n_experts + 1];
    for &e in ids {
        offsets[e as usize + 1] += 1;
    }
    for e in 0..n_experts {
        offsets[e + 1] += offsets[e];
    }
    let mut next = offsets.clone();
    let mut sorted = vec![0u32; ids.len()];
    for (s, &e) in ids.iter().enumerate() {
        let p = &mut next[e as usize];
        sorted[*p as usize] = s as u32;
        *p += 1;
    }
    (offsets, sorted)
}
