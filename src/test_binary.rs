//! Which test binary this process is: the crate (`CARGO_PKG_NAME`, set at
//! run time by cargo and nextest) and the binary's name without cargo's
//! hash. Two tests of one name in two binaries or crates are two tests;
//! every file named after a test (reports, baselines) takes this in.

/// The crate and the test binary a test runs in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TestBinary {
    /// The package under test; empty where cargo did not say.
    pub(crate) package: String,
    /// `article` for `target/debug/deps/article-3f9a61c2d0e8b7a4`.
    pub(crate) binary: String,
}

impl TestBinary {
    /// This process's.
    pub(crate) fn current() -> TestBinary {
        let binary = std::env::current_exe()
            .ok()
            .and_then(|exe| exe.file_stem().map(|s| s.to_string_lossy().into_owned()))
            .map(|stem| without_cargo_hash(&stem).to_string())
            .unwrap_or_default();
        TestBinary { package: std::env::var("CARGO_PKG_NAME").unwrap_or_default(), binary }
    }

    /// One string that tells two binaries apart, for hashing into a name.
    pub(crate) fn identity(&self) -> String {
        format!("{}\0{}", self.package, self.binary)
    }
}

/// Cargo names a test binary `<name>-<16 hex digits>`.
fn without_cargo_hash(stem: &str) -> &str {
    match stem.rsplit_once('-') {
        Some((name, hash)) if hash.len() == 16 && hash.chars().all(|c| c.is_ascii_hexdigit()) => name,
        _ => stem,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_binary_is_named_without_cargos_hash_and_only_that_is_cut() {
        assert_eq!(super::without_cargo_hash("article-3f9a61c2d0e8b7a4"), "article");
        assert_eq!(super::without_cargo_hash("gpu-leak-test"), "gpu-leak-test");
        assert_eq!(super::without_cargo_hash("my-test-12"), "my-test-12");
    }
}
