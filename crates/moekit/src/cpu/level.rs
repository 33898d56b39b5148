//! Which instruction-set level the CPU kernels run at, chosen at run time.
//!
//! The fused dot kernels ([`fast::dot`](super::fast::dot)) and the integer
//! dot kernels of quantized activations ([`fast::qdot`](super::fast::qdot))
//! are compiled once per [`SimdLevel`]; which one runs is decided once per
//! process by [`simd_level`] (CPU feature detection), so a crate that depends
//! on moekit gets the vector kernels without `-C target-cpu` flags.

use std::sync::OnceLock;

/// An instruction-set level the CPU kernels are compiled for.
///
/// Each level includes the ones below it: the f32 kernels run their AVX2
/// code at every x86 level from [`SimdLevel::Avx2`] up; the two VNNI levels
/// differ only in the integer dot kernels (`vpdpbusd` on 256 or 512 bits).
/// More levels may be added (e.g. NEON dot product).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SimdLevel {
    /// Plain Rust for any CPU (what the build's target features allow).
    Portable,
    /// x86-64 with AVX2, FMA and F16C (the x86-64-v3 vector features).
    Avx2,
    /// [`SimdLevel::Avx2`] plus AVX-VNNI (256-bit `vpdpbusd`/`vpdpwssd`).
    AvxVnni,
    /// [`SimdLevel::Avx2`] plus AVX-512 F/BW/VL/VBMI and AVX512-VNNI
    /// (512-bit integer dot products; Ice Lake, Zen 4 and later).
    Avx512Vnni,
}

impl SimdLevel {
    /// Every level, in order of preference (best first).
    pub const ALL: [SimdLevel; 4] = [
        SimdLevel::Avx512Vnni,
        SimdLevel::AvxVnni,
        SimdLevel::Avx2,
        SimdLevel::Portable,
    ];

    /// The level's name: `portable`, `avx2`, `avxvnni` or `avx512vnni`.
    pub fn name(self) -> &'static str {
        match self {
            SimdLevel::Portable => "portable",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::AvxVnni => "avxvnni",
            SimdLevel::Avx512Vnni => "avx512vnni",
        }
    }

    /// The level named `name` (as [`SimdLevel::name`] writes it).
    pub fn parse(name: &str) -> Option<SimdLevel> {
        SimdLevel::ALL.into_iter().find(|l| l.name() == name)
    }

    /// Whether this CPU can run the level's kernels (detected at run time).
    pub fn is_supported(self) -> bool {
        match self {
            SimdLevel::Portable => true,
            SimdLevel::Avx2 => avx2_detected(),
            SimdLevel::AvxVnni => avx2_detected() && avx_vnni_detected(),
            SimdLevel::Avx512Vnni => avx2_detected() && avx512_vnni_detected(),
        }
    }

    /// Whether the level includes AVX2, FMA and F16C (every x86 level).
    pub fn has_avx2(self) -> bool {
        !matches!(self, SimdLevel::Portable)
    }

    /// The best level this CPU supports.
    pub fn detect() -> SimdLevel {
        SimdLevel::best_up_to(SimdLevel::Avx512Vnni)
    }

    /// The best level this CPU supports that is not above `cap` (in the
    /// order of [`SimdLevel::ALL`]).
    pub fn best_up_to(cap: SimdLevel) -> SimdLevel {
        SimdLevel::ALL
            .into_iter()
            .skip_while(|&l| l != cap)
            .find(|l| l.is_supported())
            .unwrap_or(SimdLevel::Portable)
    }
}

impl std::fmt::Display for SimdLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(target_arch = "x86_64")]
fn avx2_detected() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
}

#[cfg(target_arch = "x86_64")]
fn avx_vnni_detected() -> bool {
    std::arch::is_x86_feature_detected!("avxvnni")
}

#[cfg(target_arch = "x86_64")]
fn avx512_vnni_detected() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vl")
        && std::arch::is_x86_feature_detected!("avx512vbmi")
        && std::arch::is_x86_feature_detected!("avx512vnni")
}

#[cfg(not(target_arch = "x86_64"))]
fn avx2_detected() -> bool {
    false
}

#[cfg(not(target_arch = "x86_64"))]
fn avx_vnni_detected() -> bool {
    false
}

#[cfg(not(target_arch = "x86_64"))]
fn avx512_vnni_detected() -> bool {
    false
}

/// Environment variable that caps the level [`simd_level`] picks: a level
/// name (`portable`, `avx2`, `avxvnni`, `avx512vnni`); read once, on the
/// first call. The best supported level at or below the named one is used
/// (e.g. `avx512vnni` on a CPU with only AVX-VNNI gives `avxvnni`); an
/// unknown name is ignored (the detected level is used).
pub const LEVEL_ENV: &str = "MOEKIT_CPU_LEVEL";

/// The level the CPU kernels run at in this process: the best level the CPU
/// supports, at most the one named by [`LEVEL_ENV`] if set.
/// Decided on the first call and fixed after.
pub fn simd_level() -> SimdLevel {
    static LEVEL: OnceLock<SimdLevel> = OnceLock::new();
    *LEVEL.get_or_init(|| level_for(std::env::var(LEVEL_ENV).ok().as_deref()))
}

/// The level [`simd_level`] picks for a [`LEVEL_ENV`] value (`None`: unset).
fn level_for(env: Option<&str>) -> SimdLevel {
    match env.and_then(|v| SimdLevel::parse(v.trim())) {
        Some(cap) => SimdLevel::best_up_to(cap),
        None => SimdLevel::detect(),
    }
}

/// Which activations the CPU fast path's fused dot products use.
///
/// With [`ActMode::Q8`] (and [`ActMode::Auto`] where it is faster), each
/// activation row is quantized once per call to 8-bit blocks matching the
/// weight format's blocks and dotted with integer kernels
/// ([`fast::qdot`](super::fast::qdot)); the result is deterministic and
/// batch-invariant, within NMSE 1e-4 of the f32 path. [`ActMode::F32`]
/// keeps f32 activations (the reference: exact f32 products of the
/// dequantized weights). Set per process with [`ACT_ENV`], per call with
/// [`with_act_mode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ActMode {
    /// Quantized activations for the formats where that is faster (every
    /// GGUF and MLX affine format but Q4_1 and affine 2 and 8 bits), f32
    /// elsewhere.
    Auto,
    /// f32 activations everywhere.
    F32,
    /// Quantized activations for every format with an integer kernel.
    Q8,
}

impl ActMode {
    /// The mode's name: `auto`, `f32` or `q8`.
    pub fn name(self) -> &'static str {
        match self {
            ActMode::Auto => "auto",
            ActMode::F32 => "f32",
            ActMode::Q8 => "q8",
        }
    }

    /// The mode named `name` (as [`ActMode::name`] writes it).
    pub fn parse(name: &str) -> Option<ActMode> {
        [ActMode::Auto, ActMode::F32, ActMode::Q8]
            .into_iter()
            .find(|m| m.name() == name)
    }
}

impl std::fmt::Display for ActMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Environment variable that sets the process's [`ActMode`]: `f32`, `q8` or
/// `auto` (the default); read once, on the first call of [`act_mode`]. An
/// unknown value is ignored.
pub const ACT_ENV: &str = "MOEKIT_CPU_ACT";

/// Environment variable that sets how many bytes ahead of the bytes being
/// dotted the CPU integer kernels prefetch their weight rows
/// ([`prefetch_distance`]; `0` turns the software prefetch off); read once.
/// A value that is not a number is ignored.
pub const PREFETCH_ENV: &str = "MOEKIT_CPU_PREFETCH";

/// [`prefetch_distance`] unless [`PREFETCH_ENV`] sets it. At T = 1 a core
/// streams its weight rows only as fast as its outstanding cache misses
/// allow: on a 2-core Xeon (AVX512-VNNI, 2026-11-28, qwen3-30b-a3b T = 1)
/// Q4_0 / Q4_K / Q6_K / Q8_0 rows took 2.39 / 2.41 / 2.87 / 3.24 ms with the
/// hardware prefetchers alone and 1.41 / 1.63 / 2.11 / 2.04 ms with this
/// prefetch (`bench/results/cpu_2core/qdot/2026-11-28_final`); 1024, 2048
/// and 8192 bytes measured no better on most of 8 formats.
pub const PREFETCH_DEFAULT: usize = 4096;

/// How many bytes ahead the CPU integer kernels prefetch ([`PREFETCH_ENV`],
/// default [`PREFETCH_DEFAULT`]).
#[inline]
pub fn prefetch_distance() -> usize {
    static D: OnceLock<usize> = OnceLock::new();
    *D.get_or_init(|| {
        std::env::var(PREFETCH_ENV)
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(PREFETCH_DEFAULT)
    })
}

thread_local! {
    static ACT_OVERRIDE: std::cell::Cell<Option<ActMode>> = const { std::cell::Cell::new(None) };
}

/// The [`ActMode`] of calls made now on this thread: the one set by an
/// enclosing [`with_act_mode`], else the process's ([`ACT_ENV`], default
/// [`ActMode::Auto`]).
pub fn act_mode() -> ActMode {
    static MODE: OnceLock<ActMode> = OnceLock::new();
    ACT_OVERRIDE.with(|o| o.get()).unwrap_or_else(|| {
        *MODE.get_or_init(|| {
            std::env::var(ACT_ENV)
                .ok()
                .and_then(|v| ActMode::parse(v.trim()))
                .unwrap_or(ActMode::Auto)
        })
    })
}

/// Runs `f` with the CPU ops it calls on this thread using activation mode
/// `mode` (e.g. [`ActMode::F32`] for f32-exact results). The mode is read
/// where each op starts, on the calling thread, so it covers the op's whole
/// computation, however many threads run it. Nests; restored on return or
/// unwind.
///
/// ```
/// use moekit::cpu::{act_mode, with_act_mode, ActMode};
/// let inside = with_act_mode(ActMode::F32, act_mode);
/// assert_eq!(inside, ActMode::F32);
/// ```
pub fn with_act_mode<R>(mode: ActMode, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<ActMode>);
    impl Drop for Restore {
        fn drop(&mut self) {
            ACT_OVERRIDE.with(|o| o.set(self.0));
        }
    }
    let _restore = Restore(ACT_OVERRIDE.with(|o| o.replace(Some(mode))));
    f()
}

/// Runs `f` on a thread of rayon's global pool, with this thread's
/// [`act_mode`]: called from outside the pool, the parallel ops `f` runs
/// then start from a worker, so each of them costs no hand-over to the pool
/// and back (a caller outside the pool sleeps and is woken once per op: at
/// T = 1 the MoE block runs about eight of them). Inside the pool, `f` runs
/// here.
pub fn in_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_some() {
        return f();
    }
    let mode = act_mode();
    rayon::scope(move |_| with_act_mode(mode, f))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for l in SimdLevel::ALL {
            assert_eq!(SimdLevel::parse(l.name()), Some(l));
        }
        assert_eq!(SimdLevel::parse("avx9"), None);
        assert!(SimdLevel::Portable.is_supported());
        assert!(SimdLevel::detect().is_supported());
        for m in [ActMode::Auto, ActMode::F32, ActMode::Q8] {
            assert_eq!(ActMode::parse(m.name()), Some(m));
        }
    }

    #[test]
    fn env_caps_the_level() {
        assert_eq!(level_for(None), SimdLevel::detect());
        assert_eq!(level_for(Some("nonsense")), SimdLevel::detect());
        assert_eq!(level_for(Some("portable")), SimdLevel::Portable);
        for cap in SimdLevel::ALL {
            let l = level_for(Some(cap.name()));
            assert!(l.is_supported());
            // At or below the cap.
            let pos = |l| SimdLevel::ALL.iter().position(|&x| x == l);
            assert!(pos(l) >= pos(cap), "{cap} -> {l}");
            if cap.is_supported() {
                assert_eq!(l, cap);
            }
        }
    }

    #[test]
    fn in_pool_runs_on_a_worker_with_the_callers_mode() {
        let (worker, mode) = with_act_mode(ActMode::Q8, || {
            in_pool(|| (rayon::current_thread_index(), act_mode()))
        });
        assert!(worker.is_some(), "ran outside the pool");
        assert_eq!(mode, ActMode::Q8);
        let (worker, mode) = with_act_mode(ActMode::F32, || in_pool(|| (true, act_mode())));
        assert!(worker);
        assert_eq!(mode, ActMode::F32);
        // From inside a pool: in place, on the calling worker.
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        pool.install(|| {
            let me = rayon::current_thread_index();
            assert_eq!(in_pool(rayon::current_thread_index), me);
        });
    }

    #[test]
    fn act_override_nests_and_restores() {
        let outer = act_mode();
        with_act_mode(ActMode::F32, || {
            assert_eq!(act_mode(), ActMode::F32);
            with_act_mode(ActMode::Q8, || assert_eq!(act_mode(), ActMode::Q8));
            assert_eq!(act_mode(), ActMode::F32);
        });
        assert_eq!(act_mode(), outer);
    }
}
