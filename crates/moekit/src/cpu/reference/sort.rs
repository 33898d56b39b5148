//! Reference expert sort: a stable sort of slots by expert id.

/// Returns `(offsets [E+1], sorted slots)` for validated ids.
pub fn expert_sort(ids: &[u32], n_experts: usize) -> (Vec<u32>, Vec<u32>) {
    let mut slots: Vec<u32> = (0..ids.len() as u32).collect();
    slots.sort_by_key(|&s| (ids[s as usize], s));
    let offsets = (0..=n_experts)
        .map(|e| ids.iter().filter(|&&x| (x as usize) < e).count() as u32)
        .collect();
    (offsets, slots)
}
