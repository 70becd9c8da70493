//! The supported tch releases are written once, in libtorch-versions.tsv;
//! Cargo.toml's ranges and the README's install block must say the same.
//! (build.rs refuses a libtorch outside the table; probe::libtorch refuses a
//! loaded libtorch other than the one built against.)
mod common;

/// The check build.rs runs, on version headers of libtorch releases out
/// of range.
mod build_check {
    #![allow(dead_code)]
    include!("../build_support/libtorch_version.rs");
}

struct Row {
    tch: String,
    libtorch: String,
}

fn root_file(name: &str) -> String {
    // The crate's folder at run time: an archive runs from another checkout.
    let path = common::manifest_dir().join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn rows() -> Vec<Row> {
    root_file("libtorch-versions.tsv")
        .lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .map(|line| {
            let columns: Vec<&str> = line.split('\t').collect();
            assert_eq!(columns.len(), 4, "libtorch-versions.tsv: four tab-separated columns in {line:?}");
            Row { tch: columns[0].into(), libtorch: columns[1].into() }
        })
        .collect()
}

fn minor(version: &str) -> u32 {
    version.split('.').nth(1).and_then(|m| m.parse().ok()).unwrap_or_else(|| panic!("not a version: {version}"))
}

#[test]
fn cargo_tomls_tch_and_torch_sys_ranges_span_exactly_the_tables_releases() {
    let rows = rows();
    let (oldest, newest) = (&rows[0].tch, &rows[rows.len() - 1].tch);
    let expected = format!("\">={oldest}, <0.{}.0\"", minor(newest) + 1);
    let manifest = root_file("Cargo.toml");
    for dependency in ["tch", "torch-sys"] {
        let line = manifest
            .lines()
            .find(|line| line.starts_with(&format!("{dependency} = ")))
            .unwrap_or_else(|| panic!("Cargo.toml has no {dependency} line"));
        assert_eq!(line, format!("{dependency} = {expected}"), "Cargo.toml's {dependency} range and libtorch-versions.tsv disagree");
    }
}

#[test]
fn the_table_lists_releases_oldest_first_each_with_its_own_libtorch() {
    let rows = rows();
    assert!(rows.windows(2).all(|pair| minor(&pair[0].tch) < minor(&pair[1].tch)), "tch releases oldest first");
    assert!(rows.windows(2).all(|pair| minor(&pair[0].libtorch) < minor(&pair[1].libtorch)), "one libtorch per release");
}

#[test]
fn the_readme_names_every_supported_tch_and_its_pytorch() {
    let readme = root_file("README.md");
    for row in rows() {
        let pin = format!("tch = \"={}\"", row.tch);
        assert!(readme.contains(&pin), "README.md does not show `{pin}`");
        assert!(readme.contains(&format!("torch=={}", row.libtorch)) || readme.contains(&row.libtorch), "README.md does not name PyTorch {}", row.libtorch);
    }
}

#[test]
fn a_libtorch_outside_the_table_fails_the_build_naming_the_supported_releases() {
    let table = root_file("libtorch-versions.tsv");
    let header = |minor: u32, patch: u32| {
        format!("#pragma once\n#define TORCH_VERSION_MAJOR 2\n#define TORCH_VERSION_MINOR {minor}\n#define TORCH_VERSION_PATCH {patch}\n")
    };
    for (minor, patch) in [(10, 0), (12, 1), (14, 0), (15, 0)] {
        let version = build_check::parse_version_header(&header(minor, patch)).unwrap();
        let message = build_check::check_supported(&table, version, "/opt/libtorch/lib").unwrap_err();
        assert!(message.contains(&format!("libtorch 2.{minor}.{patch} (found through torch-sys at /opt/libtorch/lib) is not supported")), "{message}");
        for row in rows() {
            assert!(message.contains(&format!("tch {} with libtorch {}", row.tch, row.libtorch)), "{message}");
        }
        assert!(message.contains("LIBTORCH_USE_PYTORCH=1") && message.contains("download-libtorch"), "{message}");
    }
    for row in rows() {
        let (major, minor) = (2, minor(&row.libtorch));
        assert_eq!(build_check::check_supported(&table, (major, minor, 0), "x"), Ok(()));
        assert_eq!(build_check::check_supported(&table, (major, minor, 3), "x"), Ok(()), "patch releases keep the classes' layout");
    }
}
