//! Settings resolved at run time: attribute values first, then
//! `GPU_LEAK_TEST_*` environment variables, then `gpu-leak-test.yaml`, then
//! defaults.
mod file;
mod options;

pub(crate) use file::{glob_match, ConfigFile, FileLayer};
pub use file::{Plots, Suppression, CONFIG_FILE_NAME};
pub use options::Options;
use crate::error::Result;
pub(crate) use crate::environment::{env_var, parse_bool};

/// Set to 1 on GPU runners: a test that finds no CUDA device then fails
/// instead of skipping, so a misconfigured runner cannot pass the gate.
pub(crate) const REQUIRE_CUDA_VAR: &str = "GPU_LEAK_TEST_REQUIRE_CUDA";

/// A file each leak test appends one JSON line to: its wall time and where
/// it went (body, waiting, prewarm and CUDA's start-up in it, sampling,
/// attribution, report writing).
/// For measuring the harness over a suite (`scripts/harness-time.sh`).
pub(crate) const TIMINGS_VAR: &str = "GPU_LEAK_TEST_TIMINGS";

/// Where `GPU_LEAK_TEST_TIMINGS` asks for timing lines, if it does.
pub(crate) fn timings_file() -> Option<std::path::PathBuf> {
    std::env::var_os(TIMINGS_VAR).filter(|path| !path.is_empty()).map(Into::into)
}

/// Whether `GPU_LEAK_TEST_REQUIRE_CUDA` asks for CUDA.
pub(crate) fn cuda_required() -> Result<bool> {
    match env_var(REQUIRE_CUDA_VAR)? {
        Some(value) => parse_bool(REQUIRE_CUDA_VAR, &value),
        None => Ok(false),
    }
}

/// Warm-up iterations: lazy initialisation (CUDA context, cuBLAS workspaces,
/// optimizer state, caches) lands in the first, the second confirms it is done.
pub(crate) const DEFAULT_WARMUP: u32 = 2;
/// Measured iterations: enough to see a leak that happens every other or
/// every third iteration twice, few enough to keep tests fast.
pub(crate) const DEFAULT_ITERATIONS: u32 = 5;
/// Exact accounting has no noise to absorb, so any retained growth that
/// recurs is a leak by default.
pub(crate) const DEFAULT_THRESHOLD_MB: f64 = 0.0;
/// Iterations run with stack capture after a failing verdict.
pub(crate) const DEFAULT_ATTRIBUTION_ITERATIONS: u32 = 3;
/// How far a figure may rise above its baseline: room for a library's
/// workspace that changes size, little enough that a step needing a
/// tenth more memory fails.
pub(crate) const DEFAULT_BASELINE_TOLERANCE_PCT: f64 = 5.0;

/// One MiB: `threshold_mb` and `peak_mb` count in MiB, as
/// `torch.cuda.memory_allocated() / 1024**2` does.
pub(crate) const MIB: f64 = 1024.0 * 1024.0;

/// Fully resolved settings of one leak test.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)] // Each field is the resolved value of the `Options` field of its name.
#[non_exhaustive]
pub struct Settings {
    pub device: crate::device::DeviceChoice,
    pub warmup: u32,
    pub iterations: u32,
    pub threshold_mb: f64,
    pub peak_mb: Option<f64>,
    pub attribution_iterations: u32,
    pub scope: crate::scope::Scope,
    /// Where JSON reports and plots go; `None` for `target/gpu-leak-test`.
    pub report_dir: Option<std::path::PathBuf>,
    pub plots: Plots,
    /// From `gpu-leak-test.yaml`.
    pub suppressions: Vec<Suppression>,
    /// `baseline`, `baseline_tolerance_pct`, `baselines` and `baseline_dir`.
    pub baselines: crate::baseline::BaselineSettings,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            device: Default::default(),
            warmup: DEFAULT_WARMUP,
            iterations: DEFAULT_ITERATIONS,
            threshold_mb: DEFAULT_THRESHOLD_MB,
            peak_mb: None,
            attribution_iterations: DEFAULT_ATTRIBUTION_ITERATIONS,
            scope: crate::scope::Scope::Auto,
            report_dir: None,
            plots: Plots::default(),
            suppressions: Vec::new(),
            baselines: crate::baseline::BaselineSettings::default(),
        }
    }
}

/// MiB to bytes, rounded.
pub(crate) fn mb_to_bytes(mb: f64) -> u64 {
    (mb * MIB).round() as u64
}

impl Settings {
    /// `threshold_mb` in bytes.
    pub fn threshold_bytes(&self) -> u64 {
        mb_to_bytes(self.threshold_mb)
    }

    /// `peak_mb` in bytes.
    pub fn peak_budget_bytes(&self) -> Option<u64> {
        self.peak_mb.map(mb_to_bytes)
    }

    /// Attribute first, then `GPU_LEAK_TEST_*` variables, then
    /// `gpu-leak-test.yaml` in `crate_root` (if any), then defaults.
    pub fn resolve(attribute: &Options, test: &str, crate_root: Option<&std::path::Path>) -> Result<Settings> {
        let file = match crate_root {
            Some(root) => ConfigFile::load(root)?.map(|config| config.layer_for(test)),
            None => None,
        };
        Self::resolve_with(attribute, env_var, file.as_ref())
    }

    /// [`Settings::resolve`] with the environment and the file passed in.
    /// Each layer is checked once, naming its source; the file's layers were
    /// checked when it was parsed.
    pub(crate) fn resolve_with(
        attribute: &Options,
        env: impl Fn(&str) -> Result<Option<String>>,
        file: Option<&FileLayer>,
    ) -> Result<Settings> {
        attribute.validate(|key, _| format!("attribute `{key}`"))?;
        let environment = Options::from_env(&env)?;
        let env_name = |key: &str| Options::ENVIRONMENT.iter().find(|(k, _)| *k == key).map(|(_, e)| *e).unwrap_or("?");
        environment.validate(|key, _| format!("environment variable {}", env_name(key)))?;
        // A report_dir or baseline_dir from the file is relative to the file's folder.
        let file_options = file.map(|f| {
            let mut options = f.settings.clone();
            options.report_dir = options.report_dir.map(|dir| f.folder.join(dir).display().to_string());
            options.baseline_dir = options.baseline_dir.map(|dir| f.folder.join(dir).display().to_string());
            options
        });
        let above_file = attribute.clone().or(environment);
        let merged = above_file.or(file_options.unwrap_or_default());
        let defaults = Settings::default();
        Ok(Settings {
            device: merged.device.unwrap_or(defaults.device),
            warmup: merged.warmup.unwrap_or(defaults.warmup),
            iterations: merged.iterations.unwrap_or(defaults.iterations),
            threshold_mb: merged.threshold_mb.unwrap_or(defaults.threshold_mb),
            peak_mb: merged.peak_mb,
            attribution_iterations: merged.attribution_iterations.unwrap_or(defaults.attribution_iterations),
            scope: merged.scope.unwrap_or(defaults.scope),
            report_dir: merged.report_dir.map(std::path::PathBuf::from),
            plots: merged.plots.unwrap_or_default(),
            suppressions: file.map(|f| f.suppressions.clone()).unwrap_or_default(),
            baselines: crate::baseline::BaselineSettings {
                keep: merged.baseline.unwrap_or(defaults.baselines.keep),
                tolerance_pct: merged.baseline_tolerance_pct.unwrap_or(defaults.baselines.tolerance_pct),
                mode: merged.baselines.unwrap_or_default(),
                dir: merged.baseline_dir.map(std::path::PathBuf::from),
            },
        })
    }
}

#[cfg(test)]
mod settings_tests {
    use super::*;
    use crate::device::DeviceChoice;

    fn env(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Result<Option<String>> {
        move |name| Ok(vars.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string()))
    }

    #[test]
    fn defaults_without_anything() {
        assert_eq!(Settings::resolve_with(&Options::default(), env(&[]), None).unwrap(), Settings::default());
    }

    #[test]
    fn attribute_beats_environment_beats_default() {
        let vars = env(&[("GPU_LEAK_TEST_ITERATIONS", "9"), ("GPU_LEAK_TEST_WARMUP", "4"), ("GPU_LEAK_TEST_THRESHOLD_MB", "0.5")]);
        let attribute = Options { iterations: Some(3), device: Some(crate::device::DeviceChoice::Cpu), ..Default::default() };
        let settings = Settings::resolve_with(&attribute, vars, None).unwrap();
        assert_eq!(settings.iterations, 3);
        assert_eq!(settings.warmup, 4);
        assert_eq!(settings.threshold_mb, 0.5);
        assert_eq!(settings.threshold_bytes(), 524_288);
        assert_eq!(settings.device, DeviceChoice::Cpu);
    }

    #[test]
    fn precedence_attribute_then_environment_then_file_then_default() {
        let config = ConfigFile::parse(
            std::path::Path::new("/crate/gpu-leak-test.yaml"),
            "defaults: { iterations: 7, warmup: 3, threshold_mb: 2, attribution_iterations: 6, report_dir: reports, plots: all, \
             baseline: true, baselines: require, baseline_dir: baselines }\n",
        )
        .unwrap();
        let file = config.layer_for("any::test");
        let vars = env(&[("GPU_LEAK_TEST_WARMUP", "4"), ("GPU_LEAK_TEST_THRESHOLD_MB", "1")]);
        let attribute = Options { threshold_mb: Some(0.5), ..Default::default() };
        let s = Settings::resolve_with(&attribute, vars, Some(&file)).unwrap();
        assert_eq!(s.threshold_mb, 0.5, "attribute over environment and file");
        assert_eq!(s.warmup, 4, "environment over file");
        assert_eq!((s.iterations, s.attribution_iterations), (7, 6), "file over default");
        assert_eq!(s.peak_mb, None, "default");
        assert_eq!(s.report_dir.as_deref(), Some(std::path::Path::new("/crate/reports")));
        assert_eq!(s.plots, Plots::All);
        assert!(s.baselines.keep && s.baselines.mode == crate::baseline::BaselineMode::Require);
        assert_eq!(s.baselines.dir.as_deref(), Some(std::path::Path::new("/crate/baselines")));
        // A bad value from the file names the file and the key.
        let config = ConfigFile::parse(std::path::Path::new("gpu-leak-test.yaml"), "defaults: { iterations: 0 }\n").unwrap_err();
        assert!(config.to_string().starts_with("gpu-leak-test.yaml:1: defaults.iterations: must be at least 1"), "{config}");
    }

    #[test]
    fn malformed_values_name_their_source() {
        let err = Settings::resolve_with(&Options::default(), env(&[("GPU_LEAK_TEST_ITERATIONS", "five")]), None).unwrap_err();
        assert_eq!(err.to_string(), "environment variable GPU_LEAK_TEST_ITERATIONS: \"five\" is not a valid whole number (0 to 4294967295)");
        let err = Settings::resolve_with(&Options::default(), env(&[("GPU_LEAK_TEST_ITERATIONS", "4294967296")]), None).unwrap_err();
        assert!(err.to_string().ends_with("\"4294967296\" is not a valid whole number (0 to 4294967295)"), "{err}");
        let err = Settings::resolve_with(&Options::default(), env(&[("GPU_LEAK_TEST_THRESHOLD_MB", "-1")]), None).unwrap_err();
        assert!(err.to_string().starts_with("environment variable GPU_LEAK_TEST_THRESHOLD_MB: -1 MiB"), "{err}");
        // A device is typed where code gives it; text comes from the environment and the file.
        let err = Settings::resolve_with(&Options::default(), env(&[("GPU_LEAK_TEST_DEVICE", "tpu")]), None).unwrap_err();
        assert!(err.to_string().starts_with("environment variable GPU_LEAK_TEST_DEVICE: \"tpu\" is not a device"), "{err}");
        let err = Settings::resolve_with(&Options { iterations: Some(0), ..Default::default() }, env(&[]), None).unwrap_err();
        assert!(err.to_string().starts_with("attribute `iterations`: must be at least 1"), "{err}");
        // Once ran 2 attribution iterations anyway, saying nothing.
        let err = Settings::resolve_with(&Options::default(), env(&[("GPU_LEAK_TEST_ATTRIBUTION_ITERATIONS", "0")]), None).unwrap_err();
        assert!(err.to_string().starts_with("environment variable GPU_LEAK_TEST_ATTRIBUTION_ITERATIONS: must be at least 1"), "{err}");
    }
}
