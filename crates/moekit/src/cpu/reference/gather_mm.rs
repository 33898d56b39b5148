//! Reference grouped matmul: dequantize each expert's whole matrix, then a
//! plain triple loop with f64 accumulation.

use crate::error::Result;
use crate::ops::gather_mm::GatherMmArgs;

/// `[M, N]` result of a validated grouped matmul.
pub fn gather_mm(a: &GatherMmArgs<'_>) -> Result<Vec<f32>> {
    let (n, k) = (a.w.rows(), a.w.cols());
    let mut out = vec![0f32; a.m * n];
    for seg in a.segments {
        let w = a.w.dequantize_expert(seg.expert)?;
        for &r in &seg.rows {
            let r = r as usize;
            for j in 0..n {
                let mut acc = 0f64;
                for i in 0..k {
                    acc += a.x[r * k + i] as f64 * w[j * k + i] as f64;
                }
                out[r * n + j] = acc as f32;
            }
        }
    }
    Ok(out)
}
