//! Compiles the kernel instances the library can request through NVRTC for
//! sm_90a and sm_80. Needs libnvrtc but no GPU; CI installs it from PyPI
//! (`nvidia-cuda-nvrtc`) and runs this with `--ignored`. Without NVRTC it
//! fails: it never passes by skipping.
//!
//! Every instance for every architecture is over 4 000 compiles (about 70
//! CPU-minutes on a 2-core VM, more than CI's 30-minute budget), so by
//! default this compiles a covering set ([`covering`]): on each
//! architecture one instance of each template per format or type, the
//! other arguments (activation type, tile size, ...) rotating. Each
//! template, format, activation type and tile size is compiled at least
//! once per architecture (a unit test below checks it). The GPU runs
//! compile every instance (`gpu-bundle/warm_cache`). `MOEKIT_NVRTC_ALL=1`
//! compiles everything here.

use moekit::cuda::Arch;
use moekit::testing::cuda::{all_instances, compile, instance_arches, Source};
use std::collections::BTreeMap;

/// `moekit::name<a, b<c, d>, e>` → ("moekit::name", ["a", "b<c, d>", "e"]):
/// the template and its top-level arguments (none for a plain function).
fn template_args(expr: &str) -> (&str, Vec<&str>) {
    let Some(open) = expr.find('<') else {
        return (expr, Vec::new());
    };
    let inner = &expr[open + 1..expr.len().saturating_sub(1)];
    let (mut args, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '<' => depth += 1,
            '>' => depth -= 1,
            ',' if depth == 0 => {
                args.push(inner[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    args.push(inner[start..].trim());
    (&expr[..open], args)
}

/// The covering set of (arch, instance) compiles: on each architecture the
/// instances of a template are grouped by their first argument (the format
/// or type), and each group keeps one member: the one whose other arguments
/// (activation type, tile size, ...) add the most (template, position,
/// value) triples not yet compiled, ties to the group's turn in a rotation.
/// So each format meets each template once, and every argument value of a
/// template is compiled wherever its groups allow, whatever other templates
/// the library adds (a rotation over all groups at once missed values when
/// one was added).
fn covering<'a>(
    instances: &'a [(&'static Source, String)],
) -> Vec<(Arch, &'a (&'static Source, String))> {
    let mut jobs = Vec::new();
    for arch in [Arch::SM90, Arch::SM80] {
        let mut groups: BTreeMap<String, Vec<&(&'static Source, String)>> = BTreeMap::new();
        for inst in instances
            .iter()
            .filter(|i| instance_arches(i.0).contains(&arch))
        {
            let (tmpl, args) = template_args(&inst.1);
            let key = format!("{tmpl}<{}>", args.first().copied().unwrap_or(""));
            groups.entry(key).or_default().push(inst);
        }
        let mut covered = std::collections::BTreeSet::new();
        for (turn, members) in groups.values().enumerate() {
            let triples = |m: &(&'static Source, String)| arg_values(std::iter::once(m));
            let gain = |m: &(&'static Source, String)| triples(m).difference(&covered).count();
            let best = (0..members.len())
                .max_by_key(|&j| (gain(members[j]), j == turn % members.len()))
                .unwrap_or(0);
            covered.extend(triples(members[best]));
            jobs.push((arch, members[best]));
        }
    }
    jobs
}

#[test]
fn template_args_split_top_level_commas() {
    assert_eq!(
        template_args("moekit::tc_ra<moekit::FmtAffine<4, __half>, __nv_bfloat16, 2, 64>"),
        (
            "moekit::tc_ra",
            vec!["moekit::FmtAffine<4, __half>", "__nv_bfloat16", "2", "64"]
        )
    );
    assert_eq!(
        template_args("moekit::sort_single"),
        ("moekit::sort_single", vec![])
    );
}

/// Every (template, argument position, argument) of `instances`.
fn arg_values<'a>(
    instances: impl Iterator<Item = &'a (&'static Source, String)>,
) -> std::collections::BTreeSet<(String, usize, String)> {
    instances
        .flat_map(|i| {
            let (t, a) = template_args(&i.1);
            a.into_iter()
                .enumerate()
                .map(move |(n, v)| (t.to_string(), n, v.to_string()))
        })
        .collect()
}

#[test]
fn covering_set_meets_every_template_argument_on_both_arches() {
    let instances = all_instances();
    let jobs = covering(&instances);
    for arch in [Arch::SM90, Arch::SM80] {
        let want = arg_values(
            instances
                .iter()
                .filter(|i| instance_arches(i.0).contains(&arch)),
        );
        let got = arg_values(jobs.iter().filter(|(a, _)| *a == arch).map(|(_, i)| *i));
        let missing: Vec<_> = want.difference(&got).collect();
        assert!(missing.is_empty(), "{arch:?}: never compiled: {missing:?}");
    }
    let full: usize = instances.iter().map(|i| instance_arches(i.0).len()).sum();
    println!("covering set: {} of {full} compiles", jobs.len());
    assert!(jobs.len() < full);
}

#[test]
#[ignore = "needs libnvrtc: run with --ignored (CI does, see .ci/run)"]
fn kernel_instances_compile_for_sm90a_and_sm80() {
    // MOEKIT_NVRTC_FILTER=substring narrows the check while iterating on a kernel.
    let filter = std::env::var("MOEKIT_NVRTC_FILTER").unwrap_or_default();
    let all = std::env::var("MOEKIT_NVRTC_ALL").is_ok_and(|v| v == "1");
    let instances: Vec<_> = all_instances()
        .into_iter()
        .filter(|(_, e)| e.contains(&filter))
        .collect();
    assert!(
        !instances.is_empty(),
        "no instance matches MOEKIT_NVRTC_FILTER={filter:?}"
    );
    // Each instance for every architecture the library requests it on
    // (tc_ra.cu: sm_90a only), or the covering set.
    let jobs: Vec<_> = if all {
        instances
            .iter()
            .flat_map(|i| instance_arches(i.0).iter().map(move |&a| (a, i)))
            .collect()
    } else {
        covering(&instances)
    };
    assert!(jobs.iter().any(|(a, _)| *a == Arch::SM80) || !filter.is_empty());
    // NVRTC compiles independent programs concurrently: one per thread.
    use rayon::prelude::*;
    let failures: Vec<String> = jobs
        .par_iter()
        .filter_map(|(arch, (src, expr))| match compile(src, expr, *arch) {
            Ok(c) if !c.image.is_empty() && !c.lowered.is_empty() => None,
            Ok(_) => Some(format!("{}: {expr}: empty image or name", src.name)),
            Err(e) => Some(format!("{}: {e}", src.name)),
        })
        .collect();
    println!(
        "{} of {} instances, {} compiles ({})",
        jobs.iter()
            .map(|j| &j.1 .1)
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        instances.len(),
        jobs.len(),
        if all { "all" } else { "covering set" }
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}
