//! Compiles the C++ shim (csrc/shim.cpp) against the libtorch that torch-sys
//! found. torch-sys declares `links = "tch"` and prints `libtorch_lib=DIR`, which
//! cargo hands to us as DEP_TCH_LIBTORCH_LIB.
use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=csrc/shim.cpp");
    let lib_dir = match env::var("DEP_TCH_LIBTORCH_LIB") {
        Ok(dir) => PathBuf::from(dir),
        Err(_) => panic!(
            "gpu-leak-test: DEP_TCH_LIBTORCH_LIB is not set, so torch-sys did not report where \
             libtorch is. Build through scripts/env.sh (it provisions PyTorch and sets \
             LIBTORCH_USE_PYTORCH=1), or set LIBTORCH to a libtorch 2.11 folder."
        ),
    };
    let include = lib_dir.join("../include");
    cc::Build::new()
        .cpp(true)
        .pic(true)
        .std("c++17")
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        // libtorch wheels and the official zips both use the C++11 ABI since 2.7.
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        .define("GLOG_USE_GLOG_EXPORT", None)
        .flag_if_supported("-Wno-unused-parameter")
        .file("csrc/shim.cpp")
        .compile("gpu_leak_test_shim");
    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    println!("cargo:rustc-link-lib=dylib=c10");
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    // Our own test and bench binaries find libtorch without LD_LIBRARY_PATH;
    // a runner's LD_LIBRARY_PATH still wins over this runpath.
    println!("cargo:rustc-link-arg-tests=-Wl,-rpath,{}", lib_dir.display());
}
