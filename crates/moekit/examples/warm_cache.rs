//! Fills the kernel disk cache (`$MOEKIT_CACHE_DIR`) for sm_90 without a GPU,
//! so that a GPU machine with the same NVRTC version skips the JIT:
//! `cargo run --release -p moekit --example warm_cache -- [--list] <substring>...`
//! compiles every kernel instance whose `file:name` contains all substrings
//! (`!substring`: does not contain it), on every core.
use moekit::cuda::Arch;
use moekit::testing::cuda::all_instances;
use moekit::testing::cuda::compile_cached;
use std::sync::atomic::{AtomicUsize, Ordering};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let list = args.first().is_some_and(|a| a == "--list");
    if list {
        args.remove(0);
    }
    let keep = |id: &str| {
        args.iter().all(|a| match a.strip_prefix('!') {
            Some(not) => !id.contains(not),
            None => id.contains(a.as_str()),
        })
    };
    let picked: Vec<_> = all_instances()
        .into_iter()
        .filter(|(s, e)| keep(&format!("{}:{e}", s.name)))
        .collect();
    if list {
        for (s, e) in &picked {
            println!("{}:{e}", s.name);
        }
        return Ok(());
    }
    let arch = Arch { major: 9, minor: 0 };
    let next = AtomicUsize::new(0);
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let failed = AtomicUsize::new(0);
    std::thread::scope(|sc| {
        for _ in 0..threads {
            sc.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((s, e)) = picked.get(i) else { break };
                if let Err(err) = compile_cached(s, e, arch) {
                    eprintln!("{}:{e}: {err}", s.name);
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    println!(
        "{} instances, {} failed",
        picked.len(),
        failed.load(Ordering::Relaxed)
    );
    Ok(())
}
