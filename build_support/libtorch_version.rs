// Which libtorch the build found, and whether a supported tch pins it.
// Included by build.rs (which fails the build with the message) and by
// tests/versions.rs (which checks the message for versions out of range).

/// `(major, minor, patch)` from the text of libtorch's version header
/// (`#define TORCH_VERSION_MAJOR 2` ...).
pub fn parse_version_header(header: &str) -> Option<(u32, u32, u32)> {
    let number = |name: &str| {
        header.lines().find_map(|line| line.trim().strip_prefix("#define ")?.strip_prefix(name)?.trim().parse().ok())
    };
    Some((number("TORCH_VERSION_MAJOR ")?, number("TORCH_VERSION_MINOR ")?, number("TORCH_VERSION_PATCH ")?))
}

/// `(tch, libtorch)` of each row of libtorch-versions.tsv.
pub fn supported_rows(table: &str) -> Vec<(&str, &str)> {
    table
        .lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .filter_map(|line| {
            let mut columns = line.split('\t');
            Some((columns.next()?, columns.next()?))
        })
        .collect()
}

/// `Err` with what to do where `version` (found at `found_at`) is not the
/// libtorch of a row of `table`. The shim uses libtorch's internal C++
/// classes (allocator vtables, the debug-info stack), whose layout may
/// change in any minor release, so a row's major.minor must match; patch
/// releases keep those layouts.
pub fn check_supported(table: &str, (major, minor, patch): (u32, u32, u32), found_at: &str) -> Result<(), String> {
    let rows = supported_rows(table);
    let range = rows.iter().map(|(tch, libtorch)| format!("tch {tch} with libtorch {libtorch}")).collect::<Vec<_>>().join(", ");
    let minor_of = |version: &str| version.splitn(3, '.').take(2).collect::<Vec<_>>().join(".");
    if rows.iter().any(|(_, libtorch)| minor_of(libtorch) == format!("{major}.{minor}")) {
        return Ok(());
    }
    Err(format!(
        "gpu-leak-test: libtorch {major}.{minor}.{patch} (found through torch-sys at {found_at}) is not supported. \
         Supported: {range}. Use the tch release that pins your libtorch, and the libtorch it pins: \
         `pip install torch==VERSION` with LIBTORCH_USE_PYTORCH=1, LIBTORCH=/path/to/libtorch, or tch's \
         `download-libtorch` feature. A newer tch than these needs a newer gpu-leak-test."
    ))
}
