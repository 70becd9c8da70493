//! The machine-readable report: the [`Report`] itself, through its serde
//! derives, with three fields beside it. Its schema is documented in
//! docs/report-schema.md and pinned by a test of its shape;
//! `schema_version` changes whenever a field changes meaning or goes away
//! (adding fields keeps the version).
use super::Report;
use serde::{Deserialize, Serialize};

/// The version written in every report file.
pub const SCHEMA_VERSION: u32 = 3;

/// A report file as read back: the report's fields, and beside them the
/// schema version, whether it passed, the retained growth and the plot.
#[derive(Debug, Clone, Deserialize)]
#[non_exhaustive]
pub struct ReportFile {
    /// [`SCHEMA_VERSION`] when it was written.
    pub schema_version: u32,
    /// The verdict passed.
    pub passed: bool,
    /// In the verdict's layer: live bytes after the last measured (or
    /// confirmation) iteration minus before the first.
    pub retained_growth_bytes: i64,
    /// File name of the SVG timeline beside the report, if one was written.
    pub plot: Option<String>,
    /// The report.
    #[serde(flatten)]
    pub report: Report,
}

/// What is written: the same fields, borrowing the report.
#[derive(Serialize)]
struct Written<'a> {
    schema_version: u32,
    passed: bool,
    retained_growth_bytes: i64,
    plot: Option<&'a str>,
    #[serde(flatten)]
    report: &'a Report,
}

/// The report file's text for `report`, with `plot` the SVG's file name.
pub fn to_json(report: &Report, plot: Option<&str>) -> serde_json::Result<String> {
    serde_json::to_string_pretty(&Written {
        schema_version: SCHEMA_VERSION,
        passed: report.passed(),
        retained_growth_bytes: report.retained_growth_bytes(),
        plot,
        report,
    })
}

/// Reads a report file back.
pub fn from_json(text: &str) -> serde_json::Result<ReportFile> {
    serde_json::from_str(text)
}
