//! Memory baselines, reviewed like snapshots: a test that opts in
//! (`baseline = true`) keeps its memory figures per judged device in
//! `memory-baselines/`, one small YAML file per test (in its test binary),
//! device kind and libtorch version. The file says whose it is, and a run
//! uses only its own. A run compares its figures with the file; a figure
//! above it by more than `baseline_tolerance_pct` fails the test.
//! `GPU_LEAK_TEST_BASELINES=update` rewrites the files of the tests that
//! ran, and the pull request's diff of the folder is the review.
//!
//! This file owns what a baseline is, where it lives and the comparison
//! rule; the protocol measures the figures, the report shows them.
use crate::error::InvalidValue;
use crate::test_binary::TestBinary;
use std::collections::BTreeMap;
use std::path::Path;

/// The variable that says what the runs do with baselines (the option
/// `baselines`).
pub(crate) const MODE_VAR: &str = "GPU_LEAK_TEST_BASELINES";

/// The folder in the crate's manifest folder that holds the baselines,
/// unless the option `baseline_dir` names another.
pub(crate) const FOLDER: &str = "memory-baselines";

/// What runs do with baselines: the suite-wide option `baselines`
/// (`GPU_LEAK_TEST_BASELINES`, or `defaults: { baselines: ... }` in
/// `gpu-leak-test.yaml`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum BaselineMode {
    /// Compare where a baseline exists; a test without one passes, its
    /// baseline pending (the default).
    #[default]
    Check,
    /// Write (or rewrite) the baselines of the tests that run.
    Update,
    /// Compare, and fail a test that has no baseline (for CI).
    Require,
}

/// A test's resolved settings for memory baselines: the `Options` fields
/// `baseline`, `baseline_tolerance_pct`, `baselines` and `baseline_dir`.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct BaselineSettings {
    /// `baseline`: the test keeps a memory baseline.
    pub keep: bool,
    /// `baseline_tolerance_pct`: how far a figure may rise over it.
    pub tolerance_pct: f64,
    /// `baselines`: check, update or require.
    pub mode: BaselineMode,
    /// `baseline_dir`: where baselines live; `None` for `memory-baselines`
    /// in the crate's folder.
    pub dir: Option<std::path::PathBuf>,
}

impl Default for BaselineSettings {
    fn default() -> Self {
        BaselineSettings {
            keep: false,
            tolerance_pct: crate::config::DEFAULT_BASELINE_TOLERANCE_PCT,
            mode: BaselineMode::Check,
            dir: None,
        }
    }
}

impl std::str::FromStr for BaselineMode {
    type Err = InvalidValue;

    fn from_str(text: &str) -> std::result::Result<Self, InvalidValue> {
        match text.trim() {
            "check" => Ok(BaselineMode::Check),
            "update" => Ok(BaselineMode::Update),
            "require" => Ok(BaselineMode::Require),
            other => Err(InvalidValue::new(format!("{other:?} is not a baseline mode; use check (the default), update or require"))),
        }
    }
}

impl std::fmt::Display for BaselineMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BaselineMode::Check => "check",
            BaselineMode::Update => "update",
            BaselineMode::Require => "require",
        })
    }
}

/// In `gpu-leak-test.yaml`: the text the variable takes.
impl<'de> serde::Deserialize<'de> for BaselineMode {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        crate::error::deserialize_text(deserializer, "baselines")
    }
}

/// One judged device's memory, in exact live bytes above the level before
/// setup, as its source counts them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Figures {
    /// The most one measured iteration rose above the level before it:
    /// activations, gradients and temporaries.
    pub iteration_peak_bytes: i64,
    /// The level after warm-up: the model, the optimizer's state and
    /// other one-time state.
    pub after_warmup_bytes: i64,
    /// The most live at once over setup, warm-up and the measured
    /// iterations.
    pub test_peak_bytes: i64,
}

impl Figures {
    /// Each figure with its name, in the file's order.
    fn named(&self) -> [(&'static str, i64); 3] {
        [
            ("iteration_peak_bytes", self.iteration_peak_bytes),
            ("after_warmup_bytes", self.after_warmup_bytes),
            ("test_peak_bytes", self.test_peak_bytes),
        ]
    }

    /// A figure's name in tables: `iteration peak`, `after warm-up`,
    /// `test peak`.
    pub fn short_name(figure: &str) -> &'static str {
        match figure {
            "iteration_peak_bytes" => "iteration peak",
            "after_warmup_bytes" => "after warm-up",
            "test_peak_bytes" => "test peak",
            _ => "a figure",
        }
    }

    /// What a figure's name means, for a reader.
    pub fn describe(figure: &str) -> &'static str {
        match figure {
            "iteration_peak_bytes" => "the peak of one iteration above the level before it (activations, temporaries)",
            "after_warmup_bytes" => "the level after warm-up (model, optimizer and one-time state)",
            "test_peak_bytes" => "the peak of the whole test",
            _ => "a figure",
        }
    }
}

/// One figure of one device against its baseline.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct FigureChange {
    /// The device's layer name (`cpu`, `cuda:0`).
    pub device: String,
    /// The figure (`iteration_peak_bytes`, `after_warmup_bytes`,
    /// `test_peak_bytes`).
    pub figure: String,
    /// The baseline's figure.
    pub baseline_bytes: i64,
    /// This run's.
    pub measured_bytes: i64,
}

impl FigureChange {
    /// Measured less baseline (saturating: a report read back may hold
    /// any figure).
    pub fn difference(&self) -> i64 {
        self.measured_bytes.saturating_sub(self.baseline_bytes)
    }

    /// The difference in percent of the baseline; `None` for a baseline of 0.
    pub fn percent(&self) -> Option<f64> {
        (self.baseline_bytes != 0).then(|| self.difference() as f64 * 100.0 / self.baseline_bytes as f64)
    }
}

/// Where a test's figures stand against its baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum BaselineStatus {
    /// Every figure at or under its baseline plus the tolerance.
    Within,
    /// A figure above it: the test fails.
    Over,
    /// No baseline yet; the test passes, and the index shows it pending.
    Pending,
    /// No baseline, and `GPU_LEAK_TEST_BASELINES=require`: the test fails.
    Missing,
    /// `GPU_LEAK_TEST_BASELINES=update` wrote this run's figures.
    Written,
}

impl BaselineStatus {
    /// Its name in the index and the JSON (`pending`).
    pub fn label(self) -> &'static str {
        match self {
            BaselineStatus::Within => "within",
            BaselineStatus::Over => "over",
            BaselineStatus::Pending => "pending",
            BaselineStatus::Missing => "missing",
            BaselineStatus::Written => "written",
        }
    }
}

/// A test's memory figures against its reviewed baseline: what the report,
/// the page and the index show beside the run.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct BaselineOutcome {
    /// The baseline file, relative to the crate's folder.
    pub file: String,
    /// The device model and compute capability, or `cpu`.
    pub device_kind: String,
    /// The libtorch version the figures were measured with.
    pub libtorch: String,
    /// Where the figures stand against it.
    pub status: BaselineStatus,
    /// How far a figure may rise above its baseline, in percent.
    pub tolerance_pct: f64,
    /// This run's figures, by device (`cpu`, `cuda:0`).
    pub measured: BTreeMap<String, Figures>,
    /// The baseline's figures, where one was read.
    pub baseline: Option<BTreeMap<String, Figures>>,
    /// Figures above their baseline by more than the tolerance, the
    /// biggest rise first.
    pub over: Vec<FigureChange>,
    /// Figures below their baseline: it can be lowered.
    pub lower: Vec<FigureChange>,
}

impl BaselineOutcome {
    pub(crate) fn new(file: String, kind: &DeviceKind, tolerance_pct: f64, measured: BTreeMap<String, Figures>) -> Self {
        BaselineOutcome {
            file,
            device_kind: kind.device.clone(),
            libtorch: kind.libtorch.clone(),
            status: BaselineStatus::Pending,
            tolerance_pct,
            measured,
            baseline: None,
            over: Vec::new(),
            lower: Vec::new(),
        }
    }

    /// Every measured figure of every device, in the file's order, beside
    /// its baseline where one was read: the rows of the text's and the
    /// page's tables.
    pub(crate) fn rows(&self) -> impl Iterator<Item = BaselineRow<'_>> {
        self.measured.iter().flat_map(move |(device, figures)| {
            let recorded = self.baseline.as_ref().and_then(|b| b.get(device)).map(Figures::named);
            figures.named().into_iter().enumerate().map(move |(i, (figure, measured))| BaselineRow {
                device,
                figure,
                measured,
                baseline: recorded.map(|r| r[i].1),
                over: self.over.iter().any(|c| &c.device == device && c.figure == figure),
            })
        })
    }

    /// One line for the index: the status, and the biggest change.
    pub fn summary(&self) -> String {
        let change = |c: &FigureChange| {
            let percent = c.percent().map(|p| format!(" ({p:+.1}%)")).unwrap_or_default();
            format!("{} {} {:+} B{percent}", c.device, Figures::short_name(&c.figure), c.difference())
        };
        match (self.status, self.over.first(), self.lower.first()) {
            (BaselineStatus::Over, Some(c), _) => format!("over: {}", change(c)),
            (BaselineStatus::Within, _, Some(c)) => format!("within; can be lowered: {}", change(c)),
            (status, _, _) => status.label().to_string(),
        }
    }
}

/// One figure of one device in a report's baseline table.
pub(crate) struct BaselineRow<'a> {
    pub(crate) device: &'a str,
    pub(crate) figure: &'static str,
    pub(crate) measured: i64,
    pub(crate) baseline: Option<i64>,
    /// Above its baseline by more than the tolerance.
    pub(crate) over: bool,
}

impl BaselineRow<'_> {
    /// The change from the baseline, where one was read.
    pub(crate) fn change(&self) -> Option<FigureChange> {
        self.baseline.map(|baseline_bytes| FigureChange {
            device: self.device.to_string(),
            figure: self.figure.to_string(),
            baseline_bytes,
            measured_bytes: self.measured,
        })
    }
}

/// Every figure above its baseline by more than `tolerance_pct` percent
/// (`over`), and every figure below it (`lower`: the baseline can be
/// lowered). A device the baseline lacks is compared with zeros, so memory
/// on a device the test did not use before is growth; a device the run
/// lacks is not compared.
pub(crate) fn compare(
    measured: &BTreeMap<String, Figures>,
    baseline: &BTreeMap<String, Figures>,
    tolerance_pct: f64,
) -> (Vec<FigureChange>, Vec<FigureChange>) {
    let (mut over, mut lower) = (Vec::new(), Vec::new());
    for (device, figures) in measured {
        let base = baseline.get(device).copied().unwrap_or_default();
        for ((figure, now), (_, was)) in figures.named().into_iter().zip(base.named()) {
            let change =
                FigureChange { device: device.clone(), figure: figure.to_string(), baseline_bytes: was, measured_bytes: now };
            if now as f64 > was.max(0) as f64 * (1.0 + tolerance_pct / 100.0) {
                over.push(change);
            } else if now < was {
                lower.push(change);
            }
        }
    }
    // The biggest rise first: it becomes the verdict.
    over.sort_by_key(|c| std::cmp::Reverse(c.difference()));
    (over, lower)
}

/// What a machine's memory figures depend on besides the test: the device
/// model and compute capability (`cpu` on the host), and libtorch's version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeviceKind {
    /// `cpu`, or `NVIDIA H200 (sm_90)`.
    pub(crate) device: String,
    /// `2.11.0`.
    pub(crate) libtorch: String,
}

impl DeviceKind {
    /// The kind of `device` on this machine; an error says why the CUDA
    /// driver cannot name it.
    pub(crate) fn of(device: tch::Device) -> std::result::Result<DeviceKind, String> {
        let name = match device {
            tch::Device::Cuda(index) => {
                let (model, major, minor) = crate::probe::cuda::device_kind(index)?;
                format!("{model} (sm_{major}{minor})")
            }
            _ => "cpu".to_string(),
        };
        Ok(DeviceKind { device: name, libtorch: crate::probe::libtorch::built_version() })
    }

    /// The part of a file name that names it: `cpu.torch-2.11.0`,
    /// `nvidia-h200-sm90.torch-2.11.0`.
    fn file_part(&self) -> String {
        format!("{}.torch-{}", slug(&self.device), self.libtorch)
    }
}

/// Lower-case letters and digits, other runs of characters as one `-`
/// (`_` dropped: `sm_90` reads `sm90`).
fn slug(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars().filter(|&c| c != '_') {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.ends_with('-') && !out.is_empty() {
            out.push('-');
        }
    }
    out.trim_end_matches('-').to_string()
}

/// The longest the readable part of a file name gets; the hash after it
/// keeps names apart.
const READABLE_CHARS: usize = 120;

/// Whose figures a baseline holds: a test in its test binary.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Owner<'a> {
    /// The test's name as the harness names it (`loss_list`).
    pub(crate) test: &'a str,
    /// The crate and binary it runs in.
    pub(crate) binary: &'a TestBinary,
}

/// The baseline file's name for `owner` on `kind`:
/// `article.loss_list.3f9a61c2.cpu.torch-2.11.0.yaml`. The binary and test
/// are there to be read; the hash of the crate, binary and full test name
/// keeps apart every two tests, even where the readable part is the same
/// (`бл_α` and `бл_β`, `naïve` and `na_ve`, one name in two binaries, two
/// long names that share their start).
pub(crate) fn file_name(owner: Owner<'_>, kind: &DeviceKind) -> String {
    let readable: String = format!("{}.{}", owner.binary.binary, owner.test.replace("::", "."))
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' })
        .take(READABLE_CHARS)
        .collect();
    let hash = crate::disk::fnv1a(&format!("{}\0{}", owner.binary.identity(), owner.test)) as u32;
    format!("{}.{hash:08x}.{}.yaml", readable.trim_matches('.'), kind.file_part())
}

/// A baseline file as it is written: whose, on what, and each device's
/// figures. Field order is the file's.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    test: String,
    package: String,
    binary: String,
    device_kind: String,
    libtorch: String,
    devices: BTreeMap<String, Figures>,
}

impl File {
    fn new(owner: Owner<'_>, kind: &DeviceKind, figures: &BTreeMap<String, Figures>) -> File {
        File {
            test: owner.test.to_string(),
            package: owner.binary.package.clone(),
            binary: owner.binary.binary.clone(),
            device_kind: kind.device.clone(),
            libtorch: kind.libtorch.clone(),
            devices: figures.clone(),
        }
    }

    /// The first field that names another test or machine than `expected`
    /// does: `(field, in the file, this run's)`.
    fn mismatch(&self, expected: &File) -> Option<(&'static str, String, String)> {
        [
            ("test", &self.test, &expected.test),
            ("package", &self.package, &expected.package),
            ("binary", &self.binary, &expected.binary),
            ("device_kind", &self.device_kind, &expected.device_kind),
            ("libtorch", &self.libtorch, &expected.libtorch),
        ]
        .into_iter()
        .find(|(_, theirs, ours)| theirs != ours)
        .map(|(field, theirs, ours)| (field, theirs.clone(), ours.clone()))
    }
}

/// No device holds a pebibyte: a figure above it was typed, not measured.
const MOST_BYTES: i64 = 1 << 50;

/// What the file says at its top, for whoever opens it in a diff.
const HEADER: &str = "# gpu-leak-test memory baseline: exact live bytes above the level before setup.\n\
                      # Review it like a snapshot; rewrite it with GPU_LEAK_TEST_BASELINES=update.\n";

/// The file's text: the same figures always give the same bytes.
fn render(owner: Owner<'_>, kind: &DeviceKind, figures: &BTreeMap<String, Figures>) -> String {
    let yaml = serde_yaml::to_string(&File::new(owner, kind, figures)).expect("a baseline of strings and integers serializes");
    format!("{HEADER}{yaml}")
}

/// Writes the baseline of `owner` at `path` atomically: a concurrent
/// reader sees the old file or the new one, and every test writes its own.
pub(crate) fn write(
    path: &Path,
    owner: Owner<'_>,
    kind: &DeviceKind,
    figures: &BTreeMap<String, Figures>,
) -> std::result::Result<(), String> {
    if let Some(folder) = path.parent() {
        crate::disk::create_folder(folder)?;
    }
    crate::disk::write_atomically(path, render(owner, kind, figures).as_bytes())
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// The figures in the baseline of `owner` on `kind` at `path`: `Ok(None)`
/// where there is none. Where it cannot be used (unreadable, another
/// test's or machine's, a figure no device can hold) the error names the
/// file, the line where it can, and what to do.
pub(crate) fn read(path: &Path, owner: Owner<'_>, kind: &DeviceKind) -> std::result::Result<Option<BTreeMap<String, Figures>>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let rewrite = format!("fix the file, or delete it and write it again with {MODE_VAR}=update");
    let file: File = serde_yaml::from_str(&text).map_err(|e| {
        let line = e.location().map(|l| format!(":{}", l.line())).unwrap_or_default();
        format!("{}{line}: {e}; {rewrite}", path.display())
    })?;
    let expected = File::new(owner, kind, &BTreeMap::new());
    if let Some((field, theirs, ours)) = file.mismatch(&expected) {
        return Err(format!(
            "{}: its `{field}` is {theirs:?}, but this run's is {ours:?}: the file is the baseline of another test or \
             machine, and is not compared. Delete it, or {rewrite}",
            path.display()
        ));
    }
    for (device, figures) in &file.devices {
        for (figure, bytes) in figures.named() {
            if !(0..=MOST_BYTES).contains(&bytes) {
                let line = line_of(&text, device, figure).map(|l| format!(":{l}")).unwrap_or_default();
                return Err(format!(
                    "{}{line}: devices.{device}.{figure} is {bytes}, which no device holds (a figure is live bytes, from 0 \
                     to {MOST_BYTES}); {rewrite}",
                    path.display()
                ));
            }
        }
    }
    Ok(Some(file.devices))
}

/// The 1-based line that sets `figure` of `device` in a baseline's text: the
/// first that names the figure at or after the one that names the device.
fn line_of(text: &str, device: &str, figure: &str) -> Option<usize> {
    let lines: Vec<&str> = text.lines().collect();
    let names_device = |line: &&str| {
        let line = line.trim_start().trim_start_matches(['\'', '"']);
        line.starts_with(device) && line[device.len()..].trim_start_matches(['\'', '"']).starts_with(':')
    };
    let from = lines.iter().position(names_device)?;
    lines[from..].iter().position(|line| line.contains(figure)).map(|i| from + i + 1)
}

/// The one command that writes a missing or outdated baseline.
pub(crate) fn update_command(test: &str) -> String {
    format!("{MODE_VAR}=update cargo test -- {test}")
}

/// What a run's baseline check needs: who the test is, where it ran, and
/// its settings for baselines.
pub(crate) struct Check<'a> {
    pub(crate) test: &'a str,
    pub(crate) device: tch::Device,
    pub(crate) crate_folder: Option<&'a std::path::Path>,
    pub(crate) settings: &'a BaselineSettings,
}

/// A baseline that cannot be used, which fails the test: the file as the
/// report names it, and why.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Unusable {
    pub(crate) file: String,
    pub(crate) reason: String,
}

/// What a baseline check found: the outcome (which figures rose over the
/// baseline), where there is one, and a baseline that cannot be used.
#[derive(Debug, Default)]
pub(crate) struct Checked {
    pub(crate) outcome: Option<BaselineOutcome>,
    pub(crate) unusable: Option<Unusable>,
}

/// Compares a run's figures (by layer name) with the test's baseline, or
/// writes it (`GPU_LEAK_TEST_BASELINES=update`). A baseline that is
/// required and missing, or cannot be read or written, is unusable.
pub(crate) fn check(check: &Check<'_>, figures: BTreeMap<String, Figures>) -> Checked {
    match compare_or_write(check, figures) {
        Ok(outcome) => Checked { outcome: Some(outcome), unusable: None },
        Err((unusable, outcome)) => Checked { outcome: outcome.map(|o| *o), unusable: Some(unusable) },
    }
}

type Unused = (Unusable, Option<Box<BaselineOutcome>>);

fn compare_or_write(check: &Check<'_>, figures: BTreeMap<String, Figures>) -> std::result::Result<BaselineOutcome, Unused> {
    let unusable = |file: String, reason: String| Unusable { file, reason };
    let kind = DeviceKind::of(check.device).map_err(|why| {
        (unusable("(none)".into(), format!("the device's kind, which names the baseline, is unknown: {why}")), None)
    })?;
    let binary = TestBinary::current();
    let owner = Owner { test: check.test, binary: &binary };
    let name = file_name(owner, &kind);
    let folder = check.settings.dir.clone().or_else(|| check.crate_folder.map(|c| c.join(FOLDER)));
    let Some(folder) = folder else {
        let reason = "the crate's folder is unknown here (no CARGO_MANIFEST_DIR); set baseline_dir".into();
        return Err((unusable(format!("{FOLDER}/{name}"), reason), None));
    };
    let path = folder.join(&name);
    // Shown relative to the crate, as the pull request's diff shows it.
    let file = check
        .crate_folder
        .and_then(|c| path.strip_prefix(c).ok().map(|p| p.display().to_string()))
        .unwrap_or_else(|| path.display().to_string());
    let mut outcome = BaselineOutcome::new(file.clone(), &kind, check.settings.tolerance_pct, figures);
    match check.settings.mode {
        BaselineMode::Update => match write(&path, owner, &kind, &outcome.measured) {
            Ok(()) => outcome.status = BaselineStatus::Written,
            Err(why) => return Err((unusable(file, why), None)),
        },
        mode => match read(&path, owner, &kind) {
            Err(why) => return Err((unusable(file, why), None)),
            Ok(None) if mode == BaselineMode::Require => {
                let reason = format!(
                    "there is none, and {MODE_VAR}=require asks for one. Write it with `{}`, review it and commit it",
                    update_command(check.test)
                );
                outcome.status = BaselineStatus::Missing;
                return Err((unusable(file, reason), Some(Box::new(outcome))));
            }
            Ok(None) => outcome.status = BaselineStatus::Pending,
            Ok(Some(recorded)) => {
                let (over, lower) = compare(&outcome.measured, &recorded, check.settings.tolerance_pct);
                outcome.status = if over.is_empty() { BaselineStatus::Within } else { BaselineStatus::Over };
                (outcome.baseline, outcome.over, outcome.lower) = (Some(recorded), over, lower);
            }
        },
    }
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(iteration_peak_bytes: i64, after_warmup_bytes: i64, test_peak_bytes: i64) -> Figures {
        Figures { iteration_peak_bytes, after_warmup_bytes, test_peak_bytes }
    }

    fn one(device: &str, f: Figures) -> BTreeMap<String, Figures> {
        BTreeMap::from([(device.to_string(), f)])
    }

    #[test]
    fn a_figure_above_the_tolerance_fails_and_one_at_it_passes() {
        let baseline = one("cpu", figures(1000, 500, 1500));
        let (over, lower) = compare(&one("cpu", figures(1050, 500, 1500)), &baseline, 5.0);
        assert!(over.is_empty() && lower.is_empty(), "{over:?}");
        let (over, _) = compare(&one("cpu", figures(1051, 500, 1500)), &baseline, 5.0);
        assert_eq!(over.len(), 1);
        assert_eq!((over[0].figure.as_str(), over[0].baseline_bytes, over[0].measured_bytes), ("iteration_peak_bytes", 1000, 1051));
        assert_eq!(over[0].difference(), 51);
    }

    #[test]
    fn a_tolerance_of_zero_fails_any_rise_by_one_byte() {
        let baseline = one("cuda:0", figures(1000, 500, 1500));
        assert!(compare(&one("cuda:0", figures(1000, 500, 1500)), &baseline, 0.0).0.is_empty());
        assert_eq!(compare(&one("cuda:0", figures(1000, 501, 1500)), &baseline, 0.0).0[0].figure, "after_warmup_bytes");
    }

    #[test]
    fn a_figure_that_dropped_passes_and_says_the_baseline_can_be_lowered() {
        let (over, lower) = compare(&one("cpu", figures(900, 500, 1400)), &one("cpu", figures(1000, 500, 1500)), 5.0);
        assert!(over.is_empty());
        let names: Vec<&str> = lower.iter().map(|c| c.figure.as_str()).collect();
        assert_eq!(names, ["iteration_peak_bytes", "test_peak_bytes"]);
        assert_eq!(lower[0].percent(), Some(-10.0));
    }

    #[test]
    fn memory_on_a_device_the_baseline_lacks_is_growth_from_zero() {
        let measured = BTreeMap::from([("cpu".to_string(), figures(1, 0, 1)), ("cuda:0".to_string(), figures(10, 0, 10))]);
        let (over, _) = compare(&measured, &one("cuda:0", figures(10, 0, 10)), 5.0);
        assert_eq!(over.iter().map(|c| (c.device.as_str(), c.figure.as_str())).collect::<Vec<_>>(), [
            ("cpu", "iteration_peak_bytes"),
            ("cpu", "test_peak_bytes")
        ]);
    }

    #[test]
    fn the_biggest_rise_comes_first() {
        let (over, _) = compare(&one("cpu", figures(1200, 900, 2100)), &one("cpu", figures(1000, 500, 1500)), 5.0);
        assert_eq!(over.iter().map(|c| c.figure.as_str()).collect::<Vec<_>>(), ["test_peak_bytes", "after_warmup_bytes", "iteration_peak_bytes"]);
    }

    fn binary(name: &str) -> TestBinary {
        TestBinary { package: "downstream".into(), binary: name.into() }
    }

    fn cpu() -> DeviceKind {
        DeviceKind { device: "cpu".into(), libtorch: "2.11.0".into() }
    }

    #[test]
    fn a_file_is_named_by_binary_test_hash_device_kind_and_libtorch_and_says_how_to_rewrite_it() {
        let kind = DeviceKind { device: "NVIDIA H200 (sm_90)".into(), libtorch: "2.11.0".into() };
        let article = binary("article");
        let name = file_name(Owner { test: "loss_list::cuda", binary: &article }, &kind);
        assert!(name.starts_with("article.loss_list.cuda.") && name.ends_with(".nvidia-h200-sm90.torch-2.11.0.yaml"), "{name}");
        let name = file_name(Owner { test: "weird name<1>", binary: &article }, &cpu());
        assert!(name.starts_with("article.weird_name_1_.") && name.ends_with(".cpu.torch-2.11.0.yaml"), "{name}");
        let long = "x".repeat(300);
        let name = file_name(Owner { test: &long, binary: &article }, &cpu());
        assert!(name.len() < 200, "{name}");
        let text = render(Owner { test: "t", binary: &article }, &kind, &one("cuda:0", figures(1, 2, 3)));
        assert!(text.starts_with("# gpu-leak-test memory baseline") && text.contains("GPU_LEAK_TEST_BASELINES=update"), "{text}");
        assert!(text.contains("binary: article") && text.contains("package: downstream"), "{text}");
    }

    #[test]
    fn tests_whose_names_clean_alike_or_share_a_name_in_two_binaries_never_share_a_file() {
        let (one_binary, other_binary) = (binary("leaks"), binary("other_leaks"));
        let name = |test, binary| file_name(Owner { test, binary }, &cpu());
        let names = [
            name("бл_α", &one_binary),
            name("бл_β", &one_binary),
            name("bl_naïve", &one_binary),
            name("bl_na_ve", &one_binary),
            name("bl_plain", &one_binary),
            name("bl_plain", &other_binary),
            name(&format!("{}a", "x".repeat(300)), &one_binary),
            name(&format!("{}b", "x".repeat(300)), &one_binary),
        ];
        let distinct: std::collections::BTreeSet<&String> = names.iter().collect();
        assert_eq!(distinct.len(), names.len(), "{names:#?}");
    }

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("glt-baseline-{}-{name}", std::process::id()));
        dir.join(FOLDER).join("t.cpu.torch-2.11.0.yaml")
    }

    #[test]
    fn a_written_file_reads_back_and_the_same_figures_write_the_same_bytes() {
        let path = scratch("roundtrip");
        let (kind, article) = (cpu(), binary("article"));
        let owner = Owner { test: "t", binary: &article };
        let devices = BTreeMap::from([("cpu".to_string(), figures(4096, 1024, 5120)), ("cuda:0".to_string(), figures(7, 8, 9))]);
        assert_eq!(read(&path, owner, &kind), Ok(None));
        write(&path, owner, &kind, &devices).unwrap();
        let first = std::fs::read(&path).unwrap();
        assert_eq!(read(&path, owner, &kind), Ok(Some(devices.clone())));
        write(&path, owner, &kind, &devices).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), first);
        std::fs::write(&path, "test: t\ndevices: {cpu: {iteration_peak_bytes: lots}}\n").unwrap();
        let err = read(&path, owner, &kind).unwrap_err();
        assert!(err.contains("t.cpu.torch-2.11.0.yaml:") && err.contains("GPU_LEAK_TEST_BASELINES=update"), "{err}");
        let _ = std::fs::remove_dir_all(path.parent().unwrap().parent().unwrap());
    }

    #[test]
    fn a_file_that_names_another_test_binary_device_kind_or_libtorch_is_refused_by_name() {
        let path = scratch("owner");
        let (kind, article) = (cpu(), binary("article"));
        let devices = one("cpu", figures(1, 2, 3));
        write(&path, Owner { test: "bl_a", binary: &article }, &kind, &devices).unwrap();
        let err = read(&path, Owner { test: "bl_b", binary: &article }, &kind).unwrap_err();
        assert!(err.contains("`test` is \"bl_a\"") && err.contains("\"bl_b\"") && err.contains("t.cpu.torch-2.11.0.yaml"), "{err}");
        let other = binary("detector");
        let err = read(&path, Owner { test: "bl_a", binary: &other }, &kind).unwrap_err();
        assert!(err.contains("`binary` is \"article\""), "{err}");
        let newer = DeviceKind { libtorch: "2.13.0".into(), ..cpu() };
        assert!(read(&path, Owner { test: "bl_a", binary: &article }, &newer).unwrap_err().contains("`libtorch` is \"2.11.0\""));
        let gpu = DeviceKind { device: "NVIDIA H200 (sm_90)".into(), ..cpu() };
        assert!(read(&path, Owner { test: "bl_a", binary: &article }, &gpu).unwrap_err().contains("`device_kind` is \"cpu\""));
        let _ = std::fs::remove_dir_all(path.parent().unwrap().parent().unwrap());
    }

    #[test]
    fn a_negative_or_impossible_figure_is_refused_with_its_line_and_key_and_no_arithmetic_overflows() {
        let path = scratch("figures");
        let (kind, article) = (cpu(), binary("article"));
        let owner = Owner { test: "t", binary: &article };
        write(&path, owner, &kind, &one("cpu", figures(1, 2, 3))).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        for bad in [-1, i64::MIN, MOST_BYTES + 1, i64::MAX] {
            std::fs::write(&path, text.replace("after_warmup_bytes: 2", &format!("after_warmup_bytes: {bad}"))).unwrap();
            let err = read(&path, owner, &kind).unwrap_err();
            let line = text.lines().position(|l| l.contains("after_warmup_bytes")).unwrap() + 1;
            assert!(err.contains(&format!("t.cpu.torch-2.11.0.yaml:{line}: devices.cpu.after_warmup_bytes is {bad}")), "{err}");
        }
        std::fs::write(&path, text.replace("after_warmup_bytes: 2", "after_warmup_bytes: 99999999999999999999")).unwrap();
        assert!(read(&path, owner, &kind).unwrap_err().contains("t.cpu.torch-2.11.0.yaml:"));
        let change = FigureChange { device: "cpu".into(), figure: "test_peak_bytes".into(), baseline_bytes: i64::MIN, measured_bytes: 5 };
        assert_eq!(change.difference(), i64::MAX);
        let _ = std::fs::remove_dir_all(path.parent().unwrap().parent().unwrap());
    }

    #[test]
    fn a_mode_parses_from_its_name_and_a_bad_one_says_what_is_valid() {
        assert_eq!(" require ".parse(), Ok(BaselineMode::Require));
        assert_eq!("update".parse::<BaselineMode>().map(|m| m.to_string()), Ok("update".to_string()));
        let err = "rewrite".parse::<BaselineMode>().unwrap_err();
        assert!(err.contains("\"rewrite\"") && err.contains("update"), "{err}");
    }
}
