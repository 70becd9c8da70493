//! Settings resolved at run time: attribute values first, then
//! `GPU_LEAK_TEST_*` environment variables, then `gpu-leak-test.yaml`, then
//! defaults.
pub use crate::config_file::{ConfigFile, FileLayer, Plots, Suppression};
use crate::error::{Error, Result};

/// Set to 1 on GPU runners: a test that finds no CUDA device then fails
/// instead of skipping, so a misconfigured runner cannot pass the gate.
pub const REQUIRE_CUDA_VAR: &str = "GPU_LEAK_TEST_REQUIRE_CUDA";

/// Parses a boolean variable: 1/true/yes/on or 0/false/no/off/empty.
pub fn parse_bool(name: &str, value: &str) -> Result<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "" | "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(Error::Config {
            source: format!("environment variable {name}"),
            message: format!("{value:?} is not a boolean; use 1 or 0"),
        }),
    }
}

/// Reads a variable; `Ok(None)` when unset.
pub fn env_var(name: &str) -> Result<Option<String>> {
    match std::env::var(name) {
        Ok(value) => Ok(Some(value)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(Error::Config {
            source: format!("environment variable {name}"),
            message: "is not valid UTF-8".into(),
        }),
    }
}

/// Whether `GPU_LEAK_TEST_REQUIRE_CUDA` asks for CUDA.
pub fn cuda_required() -> Result<bool> {
    match env_var(REQUIRE_CUDA_VAR)? {
        Some(value) => parse_bool(REQUIRE_CUDA_VAR, &value),
        None => Ok(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn booleans() {
        assert!(parse_bool("X", "1").unwrap());
        assert!(parse_bool("X", " TRUE ").unwrap());
        assert!(!parse_bool("X", "0").unwrap());
        assert!(!parse_bool("X", "").unwrap());
        let err = parse_bool("GPU_LEAK_TEST_REQUIRE_CUDA", "maybe").unwrap_err().to_string();
        assert!(err.contains("GPU_LEAK_TEST_REQUIRE_CUDA") && err.contains("maybe"), "{err}");
    }
}

/// Warm-up iterations: lazy initialisation (CUDA context, cuBLAS workspaces,
/// optimizer state, caches) lands in the first, the second confirms it is done.
pub const DEFAULT_WARMUP: u32 = 2;
/// Measured iterations: enough to see a leak that happens every other or
/// every third iteration twice, few enough to keep tests fast.
pub const DEFAULT_ITERATIONS: u32 = 5;
/// Exact accounting has no noise to absorb, so any retained growth that
/// recurs is a leak by default.
pub const DEFAULT_THRESHOLD_MB: f64 = 0.0;
/// Iterations run with stack capture after a failing verdict.
pub const DEFAULT_ATTRIBUTION_ITERATIONS: u32 = 3;

/// One MiB: `threshold_mb` and `peak_mb` count in MiB, as
/// `torch.cuda.memory_allocated() / 1024**2` does.
pub const MIB: f64 = 1024.0 * 1024.0;

/// Values given in the attribute (or the builder); `None` where not given.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overrides {
    pub threshold_mb: Option<f64>,
    pub iterations: Option<u32>,
    pub warmup: Option<u32>,
    pub device: Option<String>,
    pub peak_mb: Option<f64>,
    pub attribution_iterations: Option<u32>,
    /// `"auto"`, `"thread"` or `"process"`; see [`crate::scope`].
    pub scope: Option<String>,
}

/// Fully resolved settings of one leak test.
#[derive(Debug, Clone, PartialEq)]
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
    pub suppressions: Vec<Suppression>,
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
        }
    }
}

pub fn mb_to_bytes(mb: f64) -> u64 {
    (mb * MIB).round() as u64
}

/// One setting's value and where it came from.
type Sourced<T> = (String, T);

/// The first of attribute, environment and file that has a value.
fn first<T>(attribute: Option<Sourced<T>>, env: Option<Sourced<T>>, file: Option<Sourced<T>>) -> Option<Sourced<T>> {
    attribute.or(env).or(file)
}

impl Settings {
    pub fn threshold_bytes(&self) -> u64 {
        mb_to_bytes(self.threshold_mb)
    }

    pub fn peak_budget_bytes(&self) -> Option<u64> {
        self.peak_mb.map(mb_to_bytes)
    }

    /// Attribute first, then `GPU_LEAK_TEST_*` variables, then
    /// `gpu-leak-test.yaml` in `crate_root` (if any), then defaults.
    pub fn resolve(attribute: &Overrides, test: &str, crate_root: Option<&std::path::Path>) -> Result<Settings> {
        let file = match crate_root {
            Some(root) => ConfigFile::load(root)?.map(|config| config.layer_for(test)),
            None => None,
        };
        Self::resolve_with(attribute, env_var, file.as_ref())
    }

    /// [`Settings::resolve`] with the environment and the file passed in.
    pub fn resolve_with(
        attribute: &Overrides,
        env: impl Fn(&str) -> Result<Option<String>>,
        file: Option<&FileLayer>,
    ) -> Result<Settings> {
        let defaults = Settings::default();
        let attr = |key: &str| format!("attribute `{key}`");
        let from_env = |name: &str| -> Result<Option<(String, String)>> {
            Ok(env(name)?.filter(|v| !v.trim().is_empty()).map(|v| (format!("environment variable {name}"), v)))
        };
        let env_number = |name: &str| -> Result<Option<Sourced<u32>>> {
            from_env(name)?.map(|(source, text)| Ok((source.clone(), parse_number(&source, &text)?))).transpose()
        };
        let env_mb = |name: &str| -> Result<Option<Sourced<f64>>> {
            from_env(name)?.map(|(source, text)| Ok((source.clone(), parse_number(&source, &text)?))).transpose()
        };
        let from_file = |key: &'static str, value: Option<u32>| value.map(|v| (file.map(|f| f.source(key)).unwrap_or_default(), v));
        let from_file_mb = |key: &'static str, value: Option<f64>| value.map(|v| (file.map(|f| f.source(key)).unwrap_or_default(), v));
        let fs = file.map(|f| f.settings.clone()).unwrap_or_default();

        let iterations = first(
            attribute.iterations.map(|v| (attr("iterations"), v)),
            env_number("GPU_LEAK_TEST_ITERATIONS")?,
            from_file("iterations", fs.iterations),
        );
        if let Some((source, 0)) = &iterations {
            return Err(Error::Config {
                source: source.clone(),
                message: "iterations must be at least 1 (2 or more to tell a leak from one-time retention)".into(),
            });
        }
        let warmup = first(
            attribute.warmup.map(|v| (attr("warmup"), v)),
            env_number("GPU_LEAK_TEST_WARMUP")?,
            from_file("warmup", fs.warmup),
        );
        let attribution_iterations = first(
            attribute.attribution_iterations.map(|v| (attr("attribution_iterations"), v)),
            env_number("GPU_LEAK_TEST_ATTRIBUTION_ITERATIONS")?,
            from_file("attribution_iterations", fs.attribution_iterations),
        );
        let threshold_mb = first(
            attribute.threshold_mb.map(|v| (attr("threshold_mb"), v)),
            env_mb("GPU_LEAK_TEST_THRESHOLD_MB")?,
            from_file_mb("threshold_mb", fs.threshold_mb),
        );
        let threshold_mb = match threshold_mb {
            Some((source, v)) => check_mb(&source, v, true)?,
            None => defaults.threshold_mb,
        };
        let peak_mb = first(
            attribute.peak_mb.map(|v| (attr("peak_mb"), v)),
            env_mb("GPU_LEAK_TEST_PEAK_MB")?,
            from_file_mb("peak_mb", fs.peak_mb),
        );
        let peak_mb = peak_mb.map(|(source, v)| check_mb(&source, v, false)).transpose()?;
        let device = first(
            attribute.device.clone().map(|v| (attr("device"), v)),
            from_env("GPU_LEAK_TEST_DEVICE")?,
            fs.device.clone().map(|v| (file.map(|f| f.source("device")).unwrap_or_default(), v)),
        )
        .unwrap_or_else(|| (String::new(), "auto".into()));
        let device = device.1.parse().map_err(|message| Error::Config { source: device.0, message })?;
        let scope = first(
            attribute.scope.clone().map(|v| (attr("scope"), v)),
            from_env("GPU_LEAK_TEST_SCOPE")?,
            fs.scope.clone().map(|v| (file.map(|f| f.source("scope")).unwrap_or_default(), v)),
        )
        .map(|(source, text)| text.parse().map_err(|message| Error::Config { source, message }))
        .transpose()?
        .unwrap_or_default();
        let report_dir = match from_env("GPU_LEAK_TEST_REPORT_DIR")? {
            Some((_, dir)) => Some(std::path::PathBuf::from(dir)),
            None => file.and_then(|f| f.settings.report_dir.as_ref().map(|dir| f.folder.join(dir))),
        };
        let plots = match from_env("GPU_LEAK_TEST_PLOTS")? {
            Some((source, text)) => text.parse().map_err(|message| Error::Config { source, message })?,
            None => fs.plots.unwrap_or_default(),
        };
        Ok(Settings {
            device,
            warmup: warmup.map(|(_, v)| v).unwrap_or(defaults.warmup),
            iterations: iterations.map(|(_, v)| v).unwrap_or(defaults.iterations),
            threshold_mb,
            peak_mb,
            attribution_iterations: attribution_iterations.map(|(_, v)| v).unwrap_or(defaults.attribution_iterations),
            scope,
            report_dir,
            plots,
            suppressions: file.map(|f| f.suppressions.clone()).unwrap_or_default(),
        })
    }
}

fn parse_number<T: std::str::FromStr>(source: &str, text: &str) -> Result<T> {
    text.trim().parse().map_err(|_| Error::Config {
        source: source.to_string(),
        message: format!(
            "{text:?} is not a valid {}",
            if std::any::type_name::<T>() == "f64" { "number of MiB" } else { "whole number" }
        ),
    })
}

fn check_mb(source: &str, value: f64, zero_allowed: bool) -> Result<f64> {
    let valid = value.is_finite() && (value > 0.0 || (zero_allowed && value == 0.0));
    if valid {
        Ok(value)
    } else {
        Err(Error::Config {
            source: source.to_string(),
            message: format!("{value} MiB is not allowed; use a {} number", if zero_allowed { "non-negative" } else { "positive" }),
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
        assert_eq!(Settings::resolve_with(&Overrides::default(), env(&[]), None).unwrap(), Settings::default());
    }

    #[test]
    fn attribute_beats_environment_beats_default() {
        let vars = env(&[("GPU_LEAK_TEST_ITERATIONS", "9"), ("GPU_LEAK_TEST_WARMUP", "4"), ("GPU_LEAK_TEST_THRESHOLD_MB", "0.5")]);
        let attribute = Overrides { iterations: Some(3), device: Some("cpu".into()), ..Default::default() };
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
            "defaults: { iterations: 7, warmup: 3, threshold_mb: 2, attribution_iterations: 6, report_dir: reports, plots: all }\n",
        )
        .unwrap();
        let file = config.layer_for("any::test");
        let vars = env(&[("GPU_LEAK_TEST_WARMUP", "4"), ("GPU_LEAK_TEST_THRESHOLD_MB", "1")]);
        let attribute = Overrides { threshold_mb: Some(0.5), ..Default::default() };
        let s = Settings::resolve_with(&attribute, vars, Some(&file)).unwrap();
        assert_eq!(s.threshold_mb, 0.5, "attribute over environment and file");
        assert_eq!(s.warmup, 4, "environment over file");
        assert_eq!((s.iterations, s.attribution_iterations), (7, 6), "file over default");
        assert_eq!(s.peak_mb, None, "default");
        assert_eq!(s.report_dir.as_deref(), Some(std::path::Path::new("/crate/reports")));
        assert_eq!(s.plots, Plots::All);
        // A bad value from the file names the file and the key.
        let config = ConfigFile::parse(std::path::Path::new("gpu-leak-test.yaml"), "defaults: { iterations: 0 }\n").unwrap_err();
        assert!(config.to_string().starts_with("gpu-leak-test.yaml:1: defaults.iterations: must be at least 1"), "{config}");
    }

    #[test]
    fn malformed_values_name_their_source() {
        let err = Settings::resolve_with(&Overrides::default(), env(&[("GPU_LEAK_TEST_ITERATIONS", "five")]), None).unwrap_err();
        assert_eq!(err.to_string(), "environment variable GPU_LEAK_TEST_ITERATIONS: \"five\" is not a valid whole number");
        let err = Settings::resolve_with(&Overrides::default(), env(&[("GPU_LEAK_TEST_THRESHOLD_MB", "-1")]), None).unwrap_err();
        assert!(err.to_string().starts_with("environment variable GPU_LEAK_TEST_THRESHOLD_MB: -1 MiB"), "{err}");
        let err = Settings::resolve_with(&Overrides { device: Some("tpu".into()), ..Default::default() }, env(&[]), None).unwrap_err();
        assert!(err.to_string().starts_with("attribute `device`: \"tpu\" is not a device"), "{err}");
        let err = Settings::resolve_with(&Overrides { iterations: Some(0), ..Default::default() }, env(&[]), None).unwrap_err();
        assert!(err.to_string().starts_with("attribute `iterations`: iterations must be at least 1"), "{err}");
    }
}
