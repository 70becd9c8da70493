//! Settings resolved at run time: attribute values first, then
//! `GPU_LEAK_TEST_*` environment variables, then defaults.
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
        }
    }
}

pub fn mb_to_bytes(mb: f64) -> u64 {
    (mb * MIB).round() as u64
}

impl Settings {
    pub fn threshold_bytes(&self) -> u64 {
        mb_to_bytes(self.threshold_mb)
    }

    pub fn peak_budget_bytes(&self) -> Option<u64> {
        self.peak_mb.map(mb_to_bytes)
    }

    /// Attribute first, then `GPU_LEAK_TEST_*` variables, then defaults.
    pub fn resolve(attribute: &Overrides) -> Result<Settings> {
        Self::resolve_with(attribute, env_var)
    }

    /// [`Settings::resolve`] with the environment passed in, for tests.
    pub fn resolve_with(
        attribute: &Overrides,
        env: impl Fn(&str) -> Result<Option<String>>,
    ) -> Result<Settings> {
        let defaults = Settings::default();
        let from_env = |name: &str| -> Result<Option<(String, String)>> {
            Ok(env(name)?.filter(|v| !v.trim().is_empty()).map(|v| (format!("environment variable {name}"), v)))
        };
        let attr = |key: &str| format!("attribute `{key}`");

        let iterations = match (attribute.iterations, from_env("GPU_LEAK_TEST_ITERATIONS")?) {
            (Some(v), _) => (attr("iterations"), v),
            (None, Some((source, text))) => (source.clone(), parse_number(&source, &text)?),
            (None, None) => (String::new(), defaults.iterations),
        };
        if iterations.1 == 0 {
            return Err(Error::Config {
                source: iterations.0,
                message: "iterations must be at least 1 (2 or more to tell a leak from one-time retention)".into(),
            });
        }
        let warmup = match (attribute.warmup, from_env("GPU_LEAK_TEST_WARMUP")?) {
            (Some(v), _) => v,
            (None, Some((source, text))) => parse_number(&source, &text)?,
            (None, None) => defaults.warmup,
        };
        let attribution_iterations =
            match (attribute.attribution_iterations, from_env("GPU_LEAK_TEST_ATTRIBUTION_ITERATIONS")?) {
                (Some(v), _) => v,
                (None, Some((source, text))) => parse_number(&source, &text)?,
                (None, None) => defaults.attribution_iterations,
            };
        let threshold_mb = match (attribute.threshold_mb, from_env("GPU_LEAK_TEST_THRESHOLD_MB")?) {
            (Some(v), _) => check_mb(&attr("threshold_mb"), v, true)?,
            (None, Some((source, text))) => check_mb(&source, parse_number(&source, &text)?, true)?,
            (None, None) => defaults.threshold_mb,
        };
        let peak_mb = match (attribute.peak_mb, from_env("GPU_LEAK_TEST_PEAK_MB")?) {
            (Some(v), _) => Some(check_mb(&attr("peak_mb"), v, false)?),
            (None, Some((source, text))) => Some(check_mb(&source, parse_number(&source, &text)?, false)?),
            (None, None) => None,
        };
        let device = match (&attribute.device, from_env("GPU_LEAK_TEST_DEVICE")?) {
            (Some(text), _) => (attr("device"), text.clone()),
            (None, Some(found)) => found,
            (None, None) => (String::new(), "auto".into()),
        };
        let device = device.1.parse().map_err(|message| Error::Config { source: device.0, message })?;
        Ok(Settings { device, warmup, iterations: iterations.1, threshold_mb, peak_mb, attribution_iterations })
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
        assert_eq!(Settings::resolve_with(&Overrides::default(), env(&[])).unwrap(), Settings::default());
    }

    #[test]
    fn attribute_beats_environment_beats_default() {
        let vars = env(&[("GPU_LEAK_TEST_ITERATIONS", "9"), ("GPU_LEAK_TEST_WARMUP", "4"), ("GPU_LEAK_TEST_THRESHOLD_MB", "0.5")]);
        let attribute = Overrides { iterations: Some(3), device: Some("cpu".into()), ..Default::default() };
        let settings = Settings::resolve_with(&attribute, vars).unwrap();
        assert_eq!(settings.iterations, 3);
        assert_eq!(settings.warmup, 4);
        assert_eq!(settings.threshold_mb, 0.5);
        assert_eq!(settings.threshold_bytes(), 524_288);
        assert_eq!(settings.device, DeviceChoice::Cpu);
    }

    #[test]
    fn malformed_values_name_their_source() {
        let err = Settings::resolve_with(&Overrides::default(), env(&[("GPU_LEAK_TEST_ITERATIONS", "five")])).unwrap_err();
        assert_eq!(err.to_string(), "environment variable GPU_LEAK_TEST_ITERATIONS: \"five\" is not a valid whole number");
        let err = Settings::resolve_with(&Overrides::default(), env(&[("GPU_LEAK_TEST_THRESHOLD_MB", "-1")])).unwrap_err();
        assert!(err.to_string().starts_with("environment variable GPU_LEAK_TEST_THRESHOLD_MB: -1 MiB"), "{err}");
        let err = Settings::resolve_with(&Overrides { device: Some("tpu".into()), ..Default::default() }, env(&[])).unwrap_err();
        assert!(err.to_string().starts_with("attribute `device`: \"tpu\" is not a device"), "{err}");
        let err = Settings::resolve_with(&Overrides { iterations: Some(0), ..Default::default() }, env(&[])).unwrap_err();
        assert!(err.to_string().starts_with("attribute `iterations`: iterations must be at least 1"), "{err}");
    }
}
