//! Writing one file safely, for the report files, the index and the
//! memory baselines alike: atomically (a reader never sees half a file),
//! appending a line in one write, and creating a folder with an error that
//! names the real cause; and the hash that keeps file names apart.
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// FNV-1a: a stable hash (the same in every build and process) for file
/// names that must not collide once shortened.
pub(crate) fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf29ce484222325, |hash, byte| (hash ^ byte as u64).wrapping_mul(0x100000001b3))
}

/// Writes `contents` to `path` through a temporary file in the same folder:
/// the rename means a reader never sees half a file. No fsync: a report can
/// be written again, and syncing three files per test cost more than the
/// rest of the harness on a passing test.
pub(crate) fn write_atomically(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let temporary = dir.join(format!(
        ".{name}.{}.{}.tmp",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| {
        std::fs::File::create(&temporary)?.write_all(contents)?;
        std::fs::rename(&temporary, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    result
}

/// Appends `text` to `path` (created if missing) in one `write`: lines
/// appended by several processes at once do not interleave.
pub(crate) fn append(path: &Path, text: &str) -> std::io::Result<()> {
    std::fs::OpenOptions::new().create(true).append(true).open(path)?.write_all(text.as_bytes())
}

/// Creates a report folder. Where the path is a symbolic link that leads
/// nowhere (a loop, a missing target), says so: the system's own error,
/// "File exists", hides it.
pub(crate) fn create_folder(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| {
        let is_link = std::fs::symlink_metadata(dir).is_ok_and(|m| m.file_type().is_symlink());
        match std::fs::metadata(dir) {
            Err(target) if is_link => format!(
                "cannot create {}: it is a symbolic link that leads to no folder ({target}); point it at a folder or \
                 remove it",
                dir.display()
            ),
            _ => format!("cannot create {}: {e}", dir.display()),
        }
    })
}

