//! The decode path's timeline (MOEKIT_TRACE builds): the stamps'
//! layout (kernels/decode_common.cuh `TraceSlot`) and their summary.

/// Trace slots (kernels/decode_common.cuh `TraceSlot`).
const TR_ROUTE_LOADED: usize = 256;
const TR_ROUTE_DOTS: usize = 512;
const TR_TAIL: usize = 1024;
const TR_GU: usize = 2048;
const TR_DOWN: usize = 6144;

/// A one-line-per-phase summary of a traced call's stamps (ns, relative to
/// the first routing block's start): each phase's earliest, median and
/// latest stamp over the blocks that wrote one.
pub(crate) fn trace_summary(v: &[u64]) -> String {
    let t0 = v
        .get(..TR_ROUTE_LOADED)
        .and_then(|r| r.iter().filter(|&&x| x != 0).min().copied());
    let Some(t0) = t0 else {
        return "trace: no stamps (was the decode path taken?)".into();
    };
    let phase = |name: &str, lo: usize, n: usize| -> String {
        let mut r: Vec<i64> = v
            .get(lo..lo + n)
            .unwrap_or(&[])
            .iter()
            .filter(|&&x| x != 0)
            .map(|&x| x as i64 - t0 as i64)
            .collect();
        r.sort_unstable();
        match (r.first(), r.get(r.len() / 2), r.last()) {
            (Some(a), Some(m), Some(b)) => format!(
                "  {name:<22} n={:<4} first {:>7.2}  median {:>7.2}  last {:>7.2} us\n",
                r.len(),
                *a as f64 / 1e3,
                *m as f64 / 1e3,
                *b as f64 / 1e3
            ),
            _ => format!("  {name:<22} none\n"),
        }
    };
    let mut out = String::from("decode trace (us from the first route block's start):\n");
    out += &phase("route start", 0, 256);
    out += &phase("route dots done", TR_ROUTE_LOADED, 256);
    out += &phase("route rows written", TR_ROUTE_DOTS, 512);
    out += &phase("tail start", TR_TAIL, 1);
    out += &phase("tail past wait", TR_TAIL + 4, 1);
    out += &phase("tail 1st pass (twice)", TR_TAIL + 3, 1);
    out += &phase("tail routed", TR_TAIL + 1, 1);
    out += &phase("tail end", TR_TAIL + 2, 1);
    out += &phase("gate/up start", TR_GU, 1024);
    out += &phase("gate/up past wait", TR_GU + 1024, 1024);
    out += &phase("gate/up products", TR_GU + 3072, 1024);
    out += &phase("gate/up end", TR_GU + 2048, 1024);
    out += &phase("down start", TR_DOWN, 1024);
    out += &phase("down past wait", TR_DOWN + 1024, 1024);
    out += &phase("down products", TR_DOWN + 4096, 1024);
    out += &phase("down stored", TR_DOWN + 2048, 1024);
    out += &phase("down combined", TR_DOWN + 3072, 1024);
    out
}
