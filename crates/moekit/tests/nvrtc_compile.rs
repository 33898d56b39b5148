//! Compiles every kernel instance the library can request through NVRTC for
//! sm_90a and sm_80. Needs libnvrtc but no GPU; CI installs it from PyPI
//! (`nvidia-cuda-nvrtc`) and runs this with `--ignored`. Without NVRTC it
//! fails: it never passes by skipping.

use moekit::cuda::Arch;
use moekit::testing::cuda::compile;
use moekit::testing::cuda::{all_instances, instance_arches};

#[test]
#[ignore = "needs libnvrtc: run with --ignored (CI does, see .ci/run)"]
fn every_kernel_instance_compiles_for_sm90a_and_sm80() {
    // MOEKIT_NVRTC_FILTER=substring narrows the check while iterating on a kernel.
    let filter = std::env::var("MOEKIT_NVRTC_FILTER").unwrap_or_default();
    let instances: Vec<_> = all_instances()
        .into_iter()
        .filter(|(_, e)| e.contains(&filter))
        .collect();
    assert!(
        !instances.is_empty(),
        "no instance matches MOEKIT_NVRTC_FILTER={filter:?}"
    );
    // NVRTC compiles independent programs concurrently: one per thread.
    use rayon::prelude::*;
    // Each instance for every architecture the library requests it on
    // (tc_ra.cu: sm_90a only).
    let jobs: Vec<_> = instances
        .iter()
        .flat_map(|i| instance_arches(i.0).iter().map(move |&a| (a, i)))
        .collect();
    assert!(jobs.iter().any(|(a, _)| *a == Arch::SM80) || !filter.is_empty());
    let failures: Vec<String> = jobs
        .par_iter()
        .filter_map(|(arch, (src, expr))| match compile(src, expr, *arch) {
            Ok(c) if !c.image.is_empty() && !c.lowered.is_empty() => None,
            Ok(_) => Some(format!("{}: {expr}: empty image or name", src.name)),
            Err(e) => Some(format!("{}: {e}", src.name)),
        })
        .collect();
    println!(
        "compiled {} instances, {} compiles",
        instances.len(),
        jobs.len()
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}
