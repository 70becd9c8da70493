//! The supported tch releases are written once, in libtorch-versions.tsv;
//! Cargo.toml's ranges and the README's install block must say the same.
//! (build.rs refuses a libtorch outside the table; probe::libtorch refuses a
//! loaded libtorch other than the one built against.)
mod common;

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
