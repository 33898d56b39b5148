//! The size keys of a GGUF file's metadata checked against the shapes of the
//! tensors of an MoE block: a mismatch names the file, the key, the tensor
//! and both values (llama.cpp would refuse such a file when it creates the
//! tensors; moekit reads shapes off the tensors and would otherwise silently
//! disagree with the metadata).

use super::arch::{bad, key_usize, shared_tensors, ArchRule};
use super::block::{layout, Layout};
use super::file::GgufFile;
use crate::error::Result;

/// `<arch>.<suffix>` (element `layer` of a per-layer array), if present, must
/// equal `got`, read from `tensor`'s `dim`.
fn same(
    file: &GgufFile,
    arch: &str,
    suffix: &str,
    layer: usize,
    got: usize,
    tensor: &str,
    dim: &str,
) -> Result<()> {
    match key_usize(file, arch, suffix, layer)? {
        Some(v) if v != got => Err(bad(
            file,
            format!("`{arch}.{suffix}` = {v}, but tensor `{tensor}` has {dim} = {got}"),
        )),
        _ => Ok(()),
    }
}

/// Checks block `layer`'s size keys against its tensors: `embedding_length`
/// and `expert_count` against the router, `expert_feed_forward_length`
/// against the gate (or fused gate/up) experts, `expert_shared_feed_forward_length`
/// against the shared expert, `expert_used_count` ≤ the experts, and the
/// expert groups (`expert_group_count` divides the experts,
/// `expert_group_used_count` ≤ it, and the kept groups hold ≥ k experts).
pub(crate) fn check(file: &GgufFile, arch: &str, fam: &ArchRule, layer: usize) -> Result<()> {
    let (e, h, i, lay) = layout(file, layer)?;
    let router = format!("blk.{layer}.ffn_gate_inp.weight");
    same(
        file,
        arch,
        "embedding_length",
        layer,
        h,
        &router,
        "ne[0] (hidden size)",
    )?;
    same(
        file,
        arch,
        "expert_count",
        layer,
        e,
        &router,
        "ne[1] (experts)",
    )?;
    let (gate, dim) = match lay {
        Layout::Fused(t) => (t.name.clone(), "ne[1] / 2 (intermediate size)"),
        Layout::Separate(t) => (t.name.clone(), "ne[1] (intermediate size)"),
        Layout::PerExpert => (
            format!("blk.{layer}.ffn_gate.0.weight"),
            "ne[1] (intermediate size)",
        ),
    };
    same(
        file,
        arch,
        "expert_feed_forward_length",
        layer,
        i,
        &gate,
        dim,
    )?;
    if let Some((g, ..)) = shared_tensors(file, arch, fam, layer)? {
        let si = g.ne.get(1).copied().unwrap_or(0);
        let dim = "ne[1] (shared intermediate size)";
        same(
            file,
            arch,
            "expert_shared_feed_forward_length",
            layer,
            si,
            &g.name,
            dim,
        )?;
    }
    let k = key_usize(file, arch, "expert_used_count", layer)?;
    if let Some(k) = k.filter(|&k| k == 0 || k > e) {
        return Err(bad(
            file,
            format!("`{arch}.expert_used_count` = {k}, but tensor `{router}` has ne[1] = {e} experts: want 1..={e}"),
        ));
    }
    let groups = key_usize(file, arch, "expert_group_count", layer)?.unwrap_or(0);
    if groups > 1 {
        if e % groups != 0 {
            return Err(bad(
                file,
                format!("`{arch}.expert_group_count` = {groups} does not divide the {e} experts of tensor `{router}` (ne[1])"),
            ));
        }
        let used = key_usize(file, arch, "expert_group_used_count", layer)?.unwrap_or(0);
        if used > groups {
            return Err(bad(
                file,
                format!("`{arch}.expert_group_used_count` = {used} is more than `{arch}.expert_group_count` = {groups}"),
            ));
        }
        if let Some(k) = k.filter(|&k| used > 0 && k > used * (e / groups)) {
            return Err(bad(
                file,
                format!(
                    "`{arch}.expert_used_count` = {k}, but the {used} groups kept (`{arch}.expert_group_used_count`) of {} experts each hold only {}",
                    e / groups,
                    used * (e / groups)
                ),
            ));
        }
    }
    Ok(())
}
