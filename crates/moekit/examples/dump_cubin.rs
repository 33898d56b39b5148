//! Writes the CUBIN of one kernel instance (for nvdisasm), without a GPU:
//! `cargo run -p moekit --example dump_cubin -- <source.cu> '<name expression>' out.cubin`
use moekit::testing::cuda::all_instances;
use moekit::testing::cuda::compile;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (file, expr, out) = match args.as_slice() {
        [_, f, e, o] => (f, e, o),
        _ => return Err("usage: dump_cubin <source.cu> <name expression> <out.cubin>".into()),
    };
    let (src, _) = all_instances()
        .into_iter()
        .find(|(s, _)| s.name == file)
        .ok_or("no such source")?;
    let arch = moekit::cuda::Arch { major: 9, minor: 0 };
    let c = compile(src, expr, arch)?;
    std::fs::write(out, &c.image)?;
    println!("{} -> {out}", c.lowered);
    Ok(())
}
