//! Compiles the C++ shim (csrc/shim.cpp) against the libtorch that torch-sys
//! found. torch-sys declares `links = "tch"` and prints `libtorch_lib=DIR`, which
//! cargo hands to us as DEP_TCH_LIBTORCH_LIB.
use std::env;
use std::path::PathBuf;

/// A CUDA include folder for the trace tracker, where the wheel's layout
/// does not have one.
const CUDA_INCLUDE_VAR: &str = "GPU_LEAK_TEST_CUDA_INCLUDE";

/// The CUDA runtime headers the CUDA allocator's header needs: the variable's
/// folder, else the PyPI wheel's `nvidia/cu13/include` beside `torch/`
/// (runtime headers from the torch wheel's dependencies, `crt/` from
/// nvidia-cuda-crt).
fn cuda_runtime_headers(lib_dir: &std::path::Path) -> Option<PathBuf> {
    let complete = |dir: &PathBuf| dir.join("cuda_runtime_api.h").is_file() && dir.join("crt/host_defines.h").is_file();
    if let Some(dir) = env::var_os(CUDA_INCLUDE_VAR).map(PathBuf::from) {
        return complete(&dir).then_some(dir);
    }
    let site_packages = lib_dir.join("../..");
    ["nvidia/cu13/include", "nvidia/cuda_runtime/include"]
        .iter()
        .map(|sub| site_packages.join(sub))
        .find(complete)
}

/// The libtorch releases this crate supports, one per tch release: the
/// table CI and scripts/env.sh read too.
const SUPPORTED: &str = include_str!("libtorch-versions.tsv");

include!("build_support/libtorch_version.rs");

/// The event kinds shared with the Rust side (build_support/event_kinds.rs).
#[allow(dead_code)] // build.rs reads only the shim's kinds
mod event_kinds {
    include!("build_support/event_kinds.rs");
}

/// Writes glt_event_kinds.h into `out`: the shim's names for the kinds
/// whose one definition is build_support/event_kinds.rs.
fn write_event_kinds_header(out: &std::path::Path) {
    let mut header = String::from("// Written by build.rs from build_support/event_kinds.rs; do not edit.\n#pragma once\n#include <cstdint>\nnamespace glt {\n");
    for (name, value) in event_kinds::SHIM_EVENT_KINDS {
        header += &format!("constexpr int32_t {name} = {value};\n");
    }
    header += "}  // namespace glt\n";
    std::fs::write(out.join("glt_event_kinds.h"), header).expect("OUT_DIR is writable");
}

/// Fails the build, naming the supported releases and what to do, where the
/// libtorch whose headers are in `include` is not one a supported tch pins
/// (see build_support/libtorch_version.rs). libtorch 2.10 and older keep
/// the version header under torch/csrc/api/include only.
fn check_libtorch(include: &std::path::Path, lib_dir: &std::path::Path) {
    let header = ["torch/headeronly/version.h", "torch/csrc/api/include/torch/version.h"]
        .iter()
        .find_map(|sub| std::fs::read_to_string(include.join(sub)).ok());
    let Some(version) = header.as_deref().and_then(parse_version_header) else {
        panic!(
            "gpu-leak-test: cannot read libtorch's version from the headers under {} (torch/headeronly/version.h). \
             Point LIBTORCH (or LIBTORCH_USE_PYTORCH=1 with that PyTorch first on PATH) at a libtorch of \
             libtorch-versions.tsv.",
            include.display()
        )
    };
    if let Err(message) = check_supported(SUPPORTED, version, &lib_dir.display().to_string()) {
        panic!("{message}");
    }
}

fn main() {
    println!("cargo:rerun-if-changed=libtorch-versions.tsv");
    println!("cargo:rerun-if-changed=build_support/libtorch_version.rs");
    println!("cargo:rerun-if-changed=build_support/event_kinds.rs");
    for file in ["csrc/shim.cpp", "csrc/shim.h", "csrc/host_objects.cpp", "csrc/driver_calls.cpp", "csrc/symbol_table.cpp"] {
        println!("cargo:rerun-if-changed={file}");
    }
    println!("cargo:rerun-if-env-changed={CUDA_INCLUDE_VAR}");
    println!("cargo:rerun-if-env-changed=DOCS_RS");
    // docs.rs builds without libtorch (the `doc-only` feature makes tch
    // skip it too): documentation needs no shim, and nothing built this way
    // runs.
    if env::var_os("CARGO_FEATURE_DOC_ONLY").is_some() || env::var_os("DOCS_RS").is_some() {
        return;
    }
    let lib_dir = match env::var("DEP_TCH_LIBTORCH_LIB") {
        Ok(dir) => PathBuf::from(dir),
        Err(_) => panic!(
            "gpu-leak-test: DEP_TCH_LIBTORCH_LIB is not set, so torch-sys did not report where \
             libtorch is. Build through scripts/env.sh (it provisions PyTorch and sets \
             LIBTORCH_USE_PYTORCH=1), or set LIBTORCH to a supported libtorch's folder (libtorch-versions.tsv lists them)."
        ),
    };
    let include = lib_dir.join("../include");
    check_libtorch(&include, &lib_dir);
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    write_event_kinds_header(&out);
    let mut build = cc::Build::new();
    build.include(&out);
    match cuda_runtime_headers(&lib_dir) {
        Some(cuda_include) => {
            build.include(cuda_include).define("GLT_CUDA_TRACE", None);
        }
        None => println!(
            "cargo:warning=gpu-leak-test: no CUDA runtime headers (with crt/host_defines.h) next to libtorch, so \
             process scope cannot see CUDA allocations made on threads the test did not hook. Install them with \
             `python -m pip install nvidia-cuda-crt==13.0.88` into the PyTorch environment (scripts/env.sh does), \
             or point {CUDA_INCLUDE_VAR} at a CUDA include folder."
        ),
    }
    build
        .cpp(true)
        .pic(true)
        // Optimised in every profile: operator new and delete below run
        // for every C++ object of the process, and `cargo test` builds
        // dependencies at opt-level 0, where each call cost several times
        // more.
        .opt_level(2)
        // Optimised, GCC would guess that a virtual call on the CUDA
        // allocator lands in a header's inline body, whose CUDA runtime
        // calls this shim must not link against.
        .flag_if_supported("-fno-devirtualize-speculatively")
        .std("c++17")
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        // libtorch wheels and the official zips both use the C++11 ABI since 2.7.
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        .define("GLOG_USE_GLOG_EXPORT", None)
        .flag_if_supported("-Wno-unused-parameter")
        // ATen's host allocator header aligns to the cache line through
        // std::hardware_destructive_interference_size; GCC warns that it may
        // vary with -mtune. libtorch and this shim both see x86-64's 64.
        .flag_if_supported("-Wno-interference-size")
        // libtorch 2.13's autograd headers give bit-fields default
        // initialisers (C++20), which GCC takes in C++17 as an extension;
        // torch-sys compiles the same headers as C++17 too.
        .flag_if_supported("-Wno-c++20-extensions")
        .file("csrc/shim.cpp")
        // Replaces operator new and delete for the whole test binary, so
        // libtorch's host objects are counted (see the file).
        .file("csrc/host_objects.cpp")
        // Driver allocations outside libtorch's allocators, through CUPTI.
        .file("csrc/driver_calls.cpp")
        // The symbol-table scan that names libtorch's frames in a report.
        .file("csrc/symbol_table.cpp")
        .compile("gpu_leak_test_shim");
    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    println!("cargo:rustc-link-lib=dylib=c10");
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    // Our own test and bench binaries find libtorch without LD_LIBRARY_PATH;
    // a runner's LD_LIBRARY_PATH still wins over this runpath.
    println!("cargo:rustc-link-arg-tests=-Wl,-rpath,{}", lib_dir.display());
}
