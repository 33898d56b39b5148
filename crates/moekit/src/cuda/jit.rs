//! NVRTC JIT of templated kernels, cached in memory and on disk.
//!
//! A kernel is asked for by its C++ *name expression*
//! (`moekit::permute_rows<__nv_bfloat16>`): only the instances actually used
//! are compiled (no instance files). Each is compiled to a CUBIN for the
//! device's architecture with the project headers supplied in memory, and its
//! mangled name is resolved with `nvrtcGetLoweredName`. The disk cache key
//! hashes the sources, the name expression, the options, the architecture and
//! the NVRTC version; the directory is `$MOEKIT_CACHE_DIR`, else
//! `$XDG_CACHE_HOME/moekit/kernels`, else `~/.cache/moekit/kernels`.

use super::Arch;
use crate::error::{cuda_err, Error, Result};
use cudarc::driver::{CudaContext, CudaFunction};
use cudarc::nvrtc::sys as nv;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::ffi::{c_char, CStr, CString};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// A CUDA source file embedded in the library.
#[derive(Debug)]
pub struct Source {
    /// Include name (`moekit/common.cuh`) or file name of a kernel source.
    pub name: &'static str,
    /// Its text.
    pub text: &'static str,
}

/// A header of `kernels/`, included as `moekit/<file>`.
macro_rules! header {
    ($file:literal) => {
        Source {
            name: concat!("moekit/", $file),
            text: include_str!(concat!("../../kernels/", $file)),
        }
    };
}

/// Headers every kernel source may `#include "moekit/..."`.
pub static HEADERS: &[Source] = &[
    header!("common.cuh"),
    header!("dequant.cuh"),
    header!("dequant_iq.cuh"),
    header!("dequant_mlx.cuh"),
    header!("dequant_fp8.cuh"),
    header!("iq_grids.cuh"),
    header!("pipe.cuh"),
    header!("tc_decode.cuh"),
    header!("tc_decode_gguf.cuh"),
    header!("tc_decode_iq.cuh"),
    header!("tc_common.cuh"),
    header!("mma.cuh"),
    header!("decode_mma.cuh"),
    header!("decode_f32.cuh"),
    header!("decode_common.cuh"),
    header!("decode_routing.cuh"),
    header!("wgmma.cuh"),
    header!("route.cuh"),
];

/// Options passed to NVRTC for every kernel (besides the architecture).
const OPTIONS: &[&str] = &["-std=c++17", "-default-device", "--fmad=true", "-lineinfo"];

/// Whether kernels are built with the decode path's timeline stamps
/// (`-DMOEKIT_TRACE`, a diagnostic: the `MOEKIT_TRACE` environment variable).
pub(crate) fn trace_enabled() -> bool {
    std::env::var_os("MOEKIT_TRACE").is_some_and(|v| !v.is_empty() && v != "0")
}

/// The options of this process's builds: [`OPTIONS`], plus the trace define.
fn options() -> Vec<&'static str> {
    let mut o = OPTIONS.to_vec();
    if trace_enabled() {
        o.push("-DMOEKIT_TRACE");
    }
    o
}

fn nvrtc_ok(r: nv::nvrtcResult, what: &str) -> Result<()> {
    if r == nv::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(Error::NoCuda(format!("NVRTC {what} failed: {r:?}")))
    }
}

/// NVRTC's version, or why NVRTC cannot be used.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    // SAFETY: probes whether the shared library can be loaded.
    if !unsafe { nv::is_culib_present() } {
        return Err(Error::NoCuda(
            "libnvrtc was not found (set LD_LIBRARY_PATH; CI installs nvidia-cuda-nvrtc)".into(),
        ));
    }
    let (mut a, mut b) = (0, 0);
    // SAFETY: two valid out-pointers.
    nvrtc_ok(unsafe { nv::nvrtcVersion(&mut a, &mut b) }, "nvrtcVersion")?;
    Ok((a, b))
}

/// A compiled kernel instance: CUBIN image and mangled entry name.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// The CUBIN.
    pub image: Vec<u8>,
    /// The lowered (mangled) name of the instance.
    pub lowered: String,
}

struct Program(nv::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: a program created by nvrtcCreateProgram, destroyed once.
        unsafe {
            nv::nvrtcDestroyProgram(&mut self.0);
        }
    }
}

fn cstring(s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::NoCuda(format!("NUL byte in kernel text or name {s:?}")))
}

fn program_log(p: &Program) -> String {
    let mut n = 0usize;
    // SAFETY: valid program and out-pointer; the buffer has the reported size.
    unsafe {
        if nv::nvrtcGetProgramLogSize(p.0, &mut n) != nv::nvrtcResult::NVRTC_SUCCESS || n == 0 {
            return String::new();
        }
        let mut buf = vec![0u8; n];
        if nv::nvrtcGetProgramLog(p.0, buf.as_mut_ptr() as *mut c_char)
            != nv::nvrtcResult::NVRTC_SUCCESS
        {
            return String::new();
        }
        String::from_utf8_lossy(&buf)
            .trim_end_matches('\0')
            .trim_end()
            .to_string()
    }
}

/// Compiles one instance of `source` (no GPU needed: CI uses this to check
/// every instantiation for sm_90a and sm_80).
pub fn compile(source: &Source, name_expr: &str, arch: Arch) -> Result<Compiled> {
    nvrtc_version()?;
    let target = arch.nvrtc_target();
    let src = cstring(source.text)?;
    let name = cstring(source.name)?;
    let hdr_texts = HEADERS
        .iter()
        .map(|h| cstring(h.text))
        .collect::<Result<Vec<_>>>()?;
    let hdr_names = HEADERS
        .iter()
        .map(|h| cstring(h.name))
        .collect::<Result<Vec<_>>>()?;
    let hdr_text_ptrs: Vec<*const c_char> = hdr_texts.iter().map(|c| c.as_ptr()).collect();
    let hdr_name_ptrs: Vec<*const c_char> = hdr_names.iter().map(|c| c.as_ptr()).collect();
    let mut prog = Program(std::ptr::null_mut());
    // SAFETY: all pointers reference live CStrings/arrays of the stated length.
    nvrtc_ok(
        unsafe {
            nv::nvrtcCreateProgram(
                &mut prog.0,
                src.as_ptr(),
                name.as_ptr(),
                HEADERS.len() as i32,
                hdr_text_ptrs.as_ptr(),
                hdr_name_ptrs.as_ptr(),
            )
        },
        "nvrtcCreateProgram",
    )?;
    let expr = cstring(name_expr)?;
    // SAFETY: valid program and C string.
    nvrtc_ok(
        unsafe { nv::nvrtcAddNameExpression(prog.0, expr.as_ptr()) },
        "nvrtcAddNameExpression",
    )?;
    let mut opts: Vec<CString> = options()
        .iter()
        .map(|o: &&str| cstring(o))
        .collect::<Result<_>>()?;
    opts.push(cstring(&format!("--gpu-architecture={target}"))?);
    if let Some(inc) = cuda_include_dir() {
        opts.push(cstring(&format!("-I{}", inc.display()))?);
    }
    let opt_ptrs: Vec<*const c_char> = opts.iter().map(|c| c.as_ptr()).collect();
    // SAFETY: valid program; options array of the stated length.
    let r = unsafe { nv::nvrtcCompileProgram(prog.0, opt_ptrs.len() as i32, opt_ptrs.as_ptr()) };
    if r != nv::nvrtcResult::NVRTC_SUCCESS {
        return Err(Error::Compile {
            kernel: name_expr.to_string(),
            arch: target,
            log: program_log(&prog),
        });
    }
    let mut lowered: *const c_char = std::ptr::null();
    // SAFETY: the name expression was added before compiling.
    nvrtc_ok(
        unsafe { nv::nvrtcGetLoweredName(prog.0, expr.as_ptr(), &mut lowered) },
        "nvrtcGetLoweredName",
    )?;
    if lowered.is_null() {
        return Err(Error::NoCuda(format!(
            "NVRTC returned no lowered name for {name_expr}"
        )));
    }
    // SAFETY: NVRTC returns a NUL-terminated string owned by the program, copied before drop.
    let lowered = unsafe { CStr::from_ptr(lowered) }
        .to_string_lossy()
        .into_owned();
    let mut n = 0usize;
    // SAFETY: valid program and out-pointer.
    nvrtc_ok(
        unsafe { nv::nvrtcGetCUBINSize(prog.0, &mut n) },
        "nvrtcGetCUBINSize",
    )?;
    let mut image = vec![0u8; n];
    // SAFETY: the buffer has the reported size.
    nvrtc_ok(
        unsafe { nv::nvrtcGetCUBIN(prog.0, image.as_mut_ptr() as *mut c_char) },
        "nvrtcGetCUBIN",
    )?;
    Ok(Compiled { image, lowered })
}

/// CUDA's include directory, for headers NVRTC does not bundle.
fn cuda_include_dir() -> Option<PathBuf> {
    ["CUDA_HOME", "CUDA_PATH"]
        .iter()
        .filter_map(std::env::var_os)
        .map(|p| PathBuf::from(p).join("include"))
        .chain(std::iter::once(PathBuf::from("/usr/local/cuda/include")))
        .find(|p| p.join("cuda_fp16.h").exists())
}

/// The disk cache directory.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("MOEKIT_CACHE_DIR") {
        return Some(PathBuf::from(d));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("moekit").join("kernels"))
}

fn cache_key(source: &Source, name_expr: &str, arch: Arch, nvrtc: (i32, i32)) -> String {
    let mut h = Sha256::new();
    for s in HEADERS.iter().chain(std::iter::once(source)) {
        h.update(s.name.as_bytes());
        h.update([0]);
        h.update(s.text.as_bytes());
        h.update([0]);
    }
    h.update(name_expr.as_bytes());
    h.update(options().join(" ").as_bytes());
    h.update(arch.nvrtc_target().as_bytes());
    h.update(format!("nvrtc {}.{}", nvrtc.0, nvrtc.1).as_bytes());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Compiles through the disk cache: a hit skips NVRTC entirely.
pub fn compile_cached(source: &Source, name_expr: &str, arch: Arch) -> Result<Compiled> {
    let nvrtc = nvrtc_version()?;
    let path = cache_dir().map(|d| {
        d.join(format!(
            "{}.cubin",
            cache_key(source, name_expr, arch, nvrtc)
        ))
    });
    if let Some(hit) = path.as_ref().and_then(|p| std::fs::read(p).ok()) {
        if let Some(nl) = hit.iter().position(|&b| b == b'\n') {
            let lowered = String::from_utf8_lossy(&hit[..nl]).into_owned();
            return Ok(Compiled {
                image: hit[nl + 1..].to_vec(),
                lowered,
            });
        }
    }
    let c = compile(source, name_expr, arch)?;
    if let Some(p) = path {
        // A failed cache write only costs a recompile next time.
        let _ = write_atomic(&p, &c);
    }
    Ok(c)
}

fn write_atomic(path: &std::path::Path, c: &Compiled) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let mut bytes = c.lowered.as_bytes().to_vec();
    bytes.push(b'\n');
    bytes.extend_from_slice(&c.image);
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(tmp, path)
}

/// Loaded kernel functions of one device, by (source, name expression).
#[derive(Default)]
pub struct Jit {
    loaded: Mutex<HashMap<(&'static str, String), CudaFunction>>,
}

impl Jit {
    /// An empty cache.
    pub fn new() -> Jit {
        Jit::default()
    }

    /// The function for `name_expr` of `source`, compiling and loading it on first use.
    pub fn function(
        &self,
        ctx: &Arc<CudaContext>,
        arch: Arch,
        source: &'static Source,
        name_expr: &str,
    ) -> Result<CudaFunction> {
        let key = (source.name, name_expr.to_string());
        let poisoned = || Error::NoCuda("kernel cache poisoned by an earlier panic".into());
        if let Some(f) = self.loaded.lock().map_err(|_| poisoned())?.get(&key) {
            return Ok(f.clone());
        }
        let c = compile_cached(source, name_expr, arch)?;
        let module = ctx
            .load_module(cudarc::nvrtc::Ptx::from_binary(c.image))
            .map_err(cuda_err("load_module"))?;
        let f = module
            .load_function(&c.lowered)
            .map_err(cuda_err("load_function"))?;
        self.loaded
            .lock()
            .map_err(|_| poisoned())?
            .insert(key, f.clone());
        Ok(f)
    }
}
