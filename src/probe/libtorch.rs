//! Which libtorch the shim was compiled against, and whether the process
//! loaded that one. The shim reaches into libtorch's C++ classes (allocator
//! vtables, the debug-info stack), whose layout is that of the headers it
//! was built with; a test binary built against one libtorch and run with
//! another on `LD_LIBRARY_PATH` (an archive built for tch 0.24 on a runner
//! whose PyTorch is 2.13) could count nothing, or crash. build.rs refuses
//! unsupported versions at build time; this catches the mismatch at run
//! time, before any verdict.
use super::ffi;
use std::path::Path;
use std::sync::OnceLock;

/// The libtorch version the shim was compiled against, as `2.11.0`.
pub(crate) fn built_version() -> String {
    // SAFETY: the shim returns a pointer to a static NUL-terminated string.
    unsafe { std::ffi::CStr::from_ptr(ffi::glt_libtorch_version()) }.to_string_lossy().into_owned()
}

/// `Err` says which libtorch is loaded, which was built against, and what
/// to do, where the two differ in major.minor (patch releases keep the
/// classes' layout). Where the loaded folder carries no version file (a
/// libtorch built from source), nothing can be said, and it is `Ok`.
/// Asked once per process.
pub(crate) fn check_loaded() -> Result<(), String> {
    static CHECKED: OnceLock<Result<(), String>> = OnceLock::new();
    CHECKED.get_or_init(|| compare(&built_version(), loaded_folder().as_deref())).clone()
}

fn loaded_folder() -> Option<String> {
    let mut folder = std::ptr::null_mut();
    // SAFETY: one out-parameter, a string the shim allocated.
    ffi::check("glt_loaded_libtorch_folder", unsafe { ffi::glt_loaded_libtorch_folder(&mut folder) }).ok()?;
    ffi::take_string(folder).filter(|folder| !folder.is_empty())
}

/// The version of the libtorch whose `lib/` folder is `lib`: a PyTorch
/// install's `torch/version.py` (`__version__ = '2.11.0+cu130'`), or a
/// libtorch zip's `build-version` (`2.11.0+cpu`). Local tags dropped.
fn version_beside(lib: &Path) -> Option<String> {
    let root = lib.parent()?;
    let text = std::fs::read_to_string(root.join("version.py"))
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|line| line.strip_prefix("__version__ = ")?.trim().trim_matches(['\'', '"']).to_owned().into())
        })
        .or_else(|| std::fs::read_to_string(root.join("build-version")).ok())?;
    let version = text.trim().split('+').next()?.to_owned();
    (!version.is_empty()).then_some(version)
}

fn major_minor(version: &str) -> &str {
    version.match_indices('.').nth(1).map_or(version, |(at, _)| &version[..at])
}

fn compare(built: &str, folder: Option<&str>) -> Result<(), String> {
    let Some(folder) = folder else { return Ok(()) };
    let Some(loaded) = version_beside(Path::new(folder.trim_end_matches('/'))) else { return Ok(()) };
    if major_minor(&loaded) == major_minor(built) {
        return Ok(());
    }
    Err(format!(
        "this test binary was built against libtorch {built}, but the process loaded libtorch {loaded} from {folder}. \
         gpu-leak-test reads libtorch's own classes, whose layout changes between releases, so nothing it measured \
         here could be trusted. Run it with the libtorch it was built against on LD_LIBRARY_PATH (a PyTorch {built} \
         install's torch/lib), or build the tests against {loaded} with the tch release that pins it \
         (libtorch-versions.tsv lists them)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An install's folder holding `file` (removed when the guard drops, as
    /// the test ends) and its `lib` folder.
    fn folder_with(file: &str, text: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let root = tempfile::Builder::new().prefix("gpu-leak-test-libtorch-").tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("lib")).unwrap();
        std::fs::write(root.path().join(file), text).unwrap();
        let lib = root.path().join("lib");
        (root, lib)
    }

    #[test]
    fn a_pytorch_install_of_the_same_minor_release_is_accepted_whatever_its_local_tag() {
        let (_root, lib) = folder_with("version.py", "__version__ = '2.11.0+cu130'\ngit_version = 'x'\n");
        assert_eq!(version_beside(&lib).as_deref(), Some("2.11.0"));
        assert_eq!(compare("2.11.0", lib.to_str()), Ok(()));
        assert_eq!(compare("2.11.1", lib.to_str()), Ok(()));
    }

    #[test]
    fn another_minor_release_is_refused_naming_both_versions_and_the_folder() {
        let (_root, lib) = folder_with("build-version", "2.13.0+cpu\n");
        let error = compare("2.11.0", lib.to_str()).unwrap_err();
        assert!(error.contains("built against libtorch 2.11.0") && error.contains("loaded libtorch 2.13.0"), "{error}");
        assert!(error.contains(lib.to_str().unwrap()) && error.contains("LD_LIBRARY_PATH"), "{error}");
    }

    #[test]
    fn a_folder_without_a_version_file_says_nothing() {
        assert_eq!(compare("2.11.0", Some("/nonexistent/lib/")), Ok(()));
        assert_eq!(compare("2.11.0", None), Ok(()));
    }

    #[test]
    fn this_process_loaded_the_libtorch_it_was_built_against() {
        assert_eq!(check_loaded(), Ok(()));
        assert!(loaded_folder().is_some(), "the loader should name libc10.so's folder");
    }
}
