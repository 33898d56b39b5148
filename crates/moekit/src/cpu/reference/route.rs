//! Routing, obviously right: per token, score every expert into a vector,
//! stable-sort the expert indices by key and take the first k. See
//! [`crate::ops::route`] for the rules.

use crate::dtype::Float;
use crate::error::Result;
use crate::ops::route::{
    check_backend_args, ranks_before, sigmoid, RouterConfig, RouterKind, Scoring,
};
use std::cmp::Ordering;

/// Routes `logits` (`[T, E]` row-major) into `ids` and `weights` (`[T, k]`).
pub fn route<T: Float>(
    logits: &[T],
    cfg: &RouterConfig,
    ids: &mut [u32],
    weights: &mut [f32],
) -> Result<()> {
    check_backend_args(logits.len(), cfg, ids.len(), weights.len())?;
    let (e, k) = (cfg.n_experts, cfg.top_k);
    for ((row, id), w) in logits
        .chunks_exact(e)
        .zip(ids.chunks_exact_mut(k))
        .zip(weights.chunks_exact_mut(k))
    {
        let l: Vec<f32> = row.iter().map(|v| v.to_f32()).collect();
        for (slot, (expert, weight)) in route_token(&l, cfg).into_iter().enumerate() {
            if let (Some(i), Some(x)) = (id.get_mut(slot), w.get_mut(slot)) {
                *i = expert as u32;
                *x = weight;
            }
        }
    }
    Ok(())
}

/// The k (expert, weight) pairs of one token, in slot order.
fn route_token(l: &[f32], cfg: &RouterConfig) -> Vec<(usize, f32)> {
    let k = cfg.top_k;
    match &cfg.kind {
        RouterKind::SoftmaxTopK { norm_topk_prob } => {
            let p = softmax(l);
            let chosen = top_k(l, k);
            let mut w: Vec<f32> = chosen.iter().map(|&e| p[e]).collect();
            if *norm_topk_prob {
                renormalise(&mut w);
            }
            chosen.into_iter().zip(w).collect()
        }
        RouterKind::TopKSoftmax => {
            let chosen = top_k(l, k);
            let w = softmax(&chosen.iter().map(|&e| l[e]).collect::<Vec<_>>());
            chosen.into_iter().zip(w).collect()
        }
        RouterKind::Gemma4 { per_expert_scale } => {
            let chosen = top_k(l, k);
            let w = softmax(&chosen.iter().map(|&e| l[e]).collect::<Vec<_>>());
            chosen
                .into_iter()
                .zip(w)
                .map(|(e, w)| (e, w * per_expert_scale[e]))
                .collect()
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
            let s: Vec<f32> = match scoring {
                Scoring::Softmax => softmax(l),
                Scoring::Sigmoid => l.iter().map(|&x| sigmoid(x)).collect(),
            };
            let mut q: Vec<f32> = match bias {
                Some(b) => s.iter().zip(b).map(|(&s, &b)| s + b).collect(),
                None => s.clone(),
            };
            if *n_group > 1 {
                let size = l.len() / n_group;
                let group_scores: Vec<f32> = q
                    .chunks(size)
                    .map(|g| {
                        let sorted = top_k(g, g.len().min(2));
                        match scoring {
                            Scoring::Sigmoid => sorted.iter().map(|&i| g[i]).sum(),
                            Scoring::Softmax => g[sorted[0]],
                        }
                    })
                    .collect();
                let kept = top_k(&group_scores, *topk_group);
                for (gi, g) in q.chunks_mut(size).enumerate() {
                    if !kept.contains(&gi) {
                        g.iter_mut().for_each(|x| *x = dropped_groups.key());
                    }
                }
            }
            let chosen = top_k(&q, k);
            let mut w: Vec<f32> = chosen.iter().map(|&e| s[e]).collect();
            if *norm_topk_prob && k > 1 {
                renormalise(&mut w);
            }
            chosen
                .into_iter()
                .zip(w)
                .map(|(e, w)| (e, w * routed_scaling_factor))
                .collect()
        }
    }
}

/// The indices of the k best keys, best first (stable: ties → lower index).
fn top_k(keys: &[f32], k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..keys.len()).collect();
    order.sort_by(|&a, &b| {
        if ranks_before(keys[a], a, keys[b], b) {
            Ordering::Less
        } else if ranks_before(keys[b], b, keys[a], a) {
            Ordering::Greater
        } else {
            Ordering::Equal
        }
    });
    order.truncate(k);
    order
}

/// `exp(x - max) / Σ exp(x - max)`, sum in index order.
fn softmax(x: &[f32]) -> Vec<f32> {
    let m = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let e: Vec<f32> = x.iter().map(|&v| (v - m).exp()).collect();
    let s: f32 = e.iter().sum();
    e.iter().map(|&v| v / s).collect()
}

/// `w /= Σ w` (sum in slot order), unless the sum is not positive.
fn renormalise(w: &mut [f32]) {
    let s: f32 = w.iter().sum();
    if s > 0.0 {
        w.iter_mut().for_each(|x| *x /= s);
    }
}
