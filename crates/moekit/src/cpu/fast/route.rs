//! Routing, fast: rayon over blocks of tokens, one scratch buffer per block
//! (no per-token allocation), top-k by insertion into a fixed `k ≤ 32` list.
//! Bit-identical to [`crate::cpu::reference::route`]: the same f32 operations
//! in the same order.

use crate::dtype::Float;
use crate::error::Result;
use crate::ops::route::{
    check_backend_args, ranks_before, sigmoid, RouterConfig, RouterKind, Scoring, MAX_TOP_K,
};
use rayon::prelude::*;

/// Tokens per rayon task.
const TOKENS_PER_TASK: usize = 16;

/// Routes `logits` (`[T, E]` row-major) into `ids` and `weights` (`[T, k]`).
pub fn route<T: Float>(
    logits: &[T],
    cfg: &RouterConfig,
    ids: &mut [u32],
    weights: &mut [f32],
) -> Result<()> {
    check_backend_args(logits.len(), cfg, ids.len(), weights.len())?;
    let (e, k) = (cfg.n_experts, cfg.top_k);
    logits
        .par_chunks(e * TOKENS_PER_TASK)
        .zip(ids.par_chunks_mut(k * TOKENS_PER_TASK))
        .zip(weights.par_chunks_mut(k * TOKENS_PER_TASK))
        .for_each(|((rows, ids), weights)| {
            let mut scratch = Scratch {
                l: vec![0.0; e],
                s: vec![0.0; e],
                q: vec![0.0; e],
            };
            for ((row, id), w) in rows
                .chunks_exact(e)
                .zip(ids.chunks_exact_mut(k))
                .zip(weights.chunks_exact_mut(k))
            {
                scratch
                    .l
                    .iter_mut()
                    .zip(row)
                    .for_each(|(d, v)| *d = v.to_f32());
                route_token(&mut scratch, cfg, id, w);
            }
        });
    Ok(())
}

/// Per-task buffers, each of length E: logits, scores, selection keys.
struct Scratch {
    l: Vec<f32>,
    s: Vec<f32>,
    q: Vec<f32>,
}

/// The best `k ≤ 32` (key, index) pairs seen so far, best first.
struct TopK {
    key: [f32; MAX_TOP_K],
    idx: [usize; MAX_TOP_K],
    len: usize,
    cap: usize,
}

impl TopK {
    fn new(cap: usize) -> TopK {
        TopK {
            key: [0.0; MAX_TOP_K],
            idx: [0; MAX_TOP_K],
            len: 0,
            cap: cap.min(MAX_TOP_K),
        }
    }

    /// Offers `(key, i)`; keeps it if it ranks among the best `cap`.
    #[inline(always)]
    fn push(&mut self, key: f32, i: usize) {
        if self.len == self.cap {
            let Some(last) = self.len.checked_sub(1) else {
                return; // cap 0: keeps nothing
            };
            if !ranks_before(key, i, self.key[last], self.idx[last]) {
                return;
            }
            self.len = last;
        }
        let mut p = self.len;
        while p > 0 && ranks_before(key, i, self.key[p - 1], self.idx[p - 1]) {
            self.key[p] = self.key[p - 1];
            self.idx[p] = self.idx[p - 1];
            p -= 1;
        }
        self.key[p] = key;
        self.idx[p] = i;
        self.len += 1;
    }

    fn of(keys: &[f32], cap: usize) -> TopK {
        let mut t = TopK::new(cap);
        keys.iter().enumerate().for_each(|(i, &v)| t.push(v, i));
        t
    }

    fn indices(&self) -> &[usize] {
        &self.idx[..self.len]
    }
}

fn route_token(sc: &mut Scratch, cfg: &RouterConfig, id: &mut [u32], w: &mut [f32]) {
    let k = cfg.top_k;
    let l = &sc.l;
    match &cfg.kind {
        RouterKind::SoftmaxTopK { norm_topk_prob } => {
            let top = TopK::of(l, k);
            let m = max(l);
            let sum = l.iter().fold(0.0f32, |s, &v| s + (v - m).exp());
            for ((&e, i), x) in top.indices().iter().zip(id.iter_mut()).zip(w.iter_mut()) {
                *i = e as u32;
                *x = (l[e] - m).exp() / sum;
            }
            if *norm_topk_prob {
                renormalise(w);
            }
        }
        RouterKind::TopKSoftmax | RouterKind::Gemma4 { .. } => {
            let top = TopK::of(l, k);
            chosen_softmax(l, top.indices(), id, w);
            if let RouterKind::Gemma4 { per_expert_scale } = &cfg.kind {
                w.iter_mut()
                    .zip(top.indices())
                    .for_each(|(x, &e)| *x *= per_expert_scale[e]);
            }
        }
        RouterKind::Grouped {
            scoring,
            bias,
            n_group,
            topk_group,
            dropped_groups,
            norm_topk_prob,
            routed_scaling_factor,
        } => {
            let (s, q) = (&mut sc.s, &mut sc.q);
            match scoring {
                Scoring::Softmax => {
                    let m = max(l);
                    s.iter_mut().zip(l).for_each(|(d, &v)| *d = (v - m).exp());
                    let sum = s.iter().fold(0.0f32, |a, &v| a + v);
                    s.iter_mut().for_each(|d| *d /= sum);
                }
                Scoring::Sigmoid => s.iter_mut().zip(l).for_each(|(d, &v)| *d = sigmoid(v)),
            }
            match bias {
                Some(b) => q
                    .iter_mut()
                    .zip(s.iter())
                    .zip(b)
                    .for_each(|((d, &s), &b)| *d = s + b),
                None => q.copy_from_slice(s),
            }
            if *n_group > 1 {
                mask_groups(q, *scoring, *n_group, *topk_group, dropped_groups.key());
            }
            let top = TopK::of(q, k);
            for ((&e, i), x) in top.indices().iter().zip(id.iter_mut()).zip(w.iter_mut()) {
                *i = e as u32;
                *x = s[e];
            }
            if *norm_topk_prob && k > 1 {
                renormalise(w);
            }
            w.iter_mut().for_each(|x| *x *= routed_scaling_factor);
        }
    }
}

/// Keeps the `topk_group` best of `n_group` groups of `q`; sets the keys of
/// the rest to `dropped` (`0.0` or `−∞`, [`crate::ops::route::GroupMask`]).
fn mask_groups(q: &mut [f32], scoring: Scoring, n_group: usize, topk_group: usize, dropped: f32) {
    let size = q.len() / n_group;
    let mut kept = [false; crate::ops::route::MAX_EXPERTS];
    if topk_group <= MAX_TOP_K {
        let mut best = TopK::new(topk_group);
        for (gi, g) in q.chunks(size).enumerate() {
            best.push(group_score(g, scoring), gi);
        }
        best.indices().iter().for_each(|&gi| kept[gi] = true);
    } else {
        // Many groups kept: rank each group by counting the groups ahead of it.
        let mut scores = [0.0f32; crate::ops::route::MAX_EXPERTS];
        for (gi, g) in q.chunks(size).enumerate() {
            scores[gi] = group_score(g, scoring);
        }
        let scores = &scores[..n_group];
        for (gi, &v) in scores.iter().enumerate() {
            let ahead = scores
                .iter()
                .enumerate()
                .filter(|&(gj, &u)| ranks_before(u, gj, v, gi))
                .count();
            kept[gi] = ahead < topk_group;
        }
    }
    for (gi, g) in q.chunks_mut(size).enumerate() {
        if !kept[gi] {
            g.iter_mut().for_each(|x| *x = dropped);
        }
    }
}

/// Sigmoid: sum of the two best keys of the group; softmax: the best key.
fn group_score(g: &[f32], scoring: Scoring) -> f32 {
    let top = TopK::of(g, 2);
    match (scoring, top.indices()) {
        (Scoring::Sigmoid, &[a, b]) => g[a] + g[b],
        (_, &[a, ..]) => g[a],
        (_, []) => 0.0,
    }
}

/// Softmax over the chosen logits (max and sum in slot order).
fn chosen_softmax(l: &[f32], chosen: &[usize], id: &mut [u32], w: &mut [f32]) {
    let m = chosen.iter().fold(f32::NEG_INFINITY, |m, &e| m.max(l[e]));
    for ((&e, i), x) in chosen.iter().zip(id.iter_mut()).zip(w.iter_mut()) {
        *i = e as u32;
        *x = (l[e] - m).exp();
    }
    let sum = w.iter().fold(0.0f32, |a, &v| a + v);
    w.iter_mut().for_each(|x| *x /= sum);
}

fn max(x: &[f32]) -> f32 {
    x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v))
}

/// `w /= Σ w` (sum in slot order), unless the sum is not positive.
fn renormalise(w: &mut [f32]) {
    let s = w.iter().fold(0.0f32, |a, &v| a + v);
    if s > 0.0 {
        w.iter_mut().for_each(|x| *x /= s);
    }
}
