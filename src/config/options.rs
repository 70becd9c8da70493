//! The one table of options. The attribute, the environment, the config
//! file's layers and the builder all fill [`Options`]; its fields are the only
//! list of option names, and the environment variables and the layer merge
//! are generated from the same table.
use super::Plots;
use crate::error::{Error, Result};

/// A value an option can hold: parsed from an environment variable, shown in
/// error messages.
pub(crate) trait OptionValue: Sized {
    fn parse_text(text: &str) -> std::result::Result<Self, String>;
    fn text(&self) -> String;
}

impl OptionValue for u32 {
    fn parse_text(text: &str) -> std::result::Result<Self, String> {
        text.trim().parse().map_err(|_| format!("{text:?} is not a valid whole number"))
    }
    fn text(&self) -> String {
        self.to_string()
    }
}

impl OptionValue for f64 {
    fn parse_text(text: &str) -> std::result::Result<Self, String> {
        text.trim().parse().map_err(|_| format!("{text:?} is not a valid number of MiB"))
    }
    fn text(&self) -> String {
        self.to_string()
    }
}

impl OptionValue for String {
    fn parse_text(text: &str) -> std::result::Result<Self, String> {
        Ok(text.trim().to_string())
    }
    fn text(&self) -> String {
        self.clone()
    }
}

impl OptionValue for Plots {
    fn parse_text(text: &str) -> std::result::Result<Self, String> {
        text.parse()
    }
    fn text(&self) -> String {
        format!("{self:?}").to_ascii_lowercase()
    }
}

fn any<T>(_: &T) -> std::result::Result<(), String> {
    Ok(())
}

// The rules themselves are shared with the attribute, which checks its
// literals at compile time.
#[path = "../../macros/src/values.rs"]
#[allow(unreachable_pub)] // `pub` for the macro crate, which includes it too.
pub(crate) mod values;

fn at_least_one(value: &u32) -> std::result::Result<(), String> {
    values::iterations(*value)
}

fn non_negative_mib(value: &f64) -> std::result::Result<(), String> {
    values::threshold_mb(*value)
}

fn positive_mib(value: &f64) -> std::result::Result<(), String> {
    values::peak_mb(*value)
}

fn device(value: &str) -> std::result::Result<(), String> {
    values::device(value).map(drop)
}

fn scope(value: &str) -> std::result::Result<(), String> {
    values::scope(value).map(drop)
}

macro_rules! options {
    ($( $(#[doc = $doc:literal])* $field:ident: $ty:ty, env $env:literal, check $check:path; )*) => {
        /// Every option of a leak test, `None` where not given. Fill the ones
        /// you set and leave the rest to `..Default::default()`:
        ///
        /// ```
        /// let options = gpu_leak_test::Options { threshold_mb: Some(1.0), ..Default::default() };
        /// ```
        ///
        /// Precedence at run time: the attribute (or builder), then the
        /// `GPU_LEAK_TEST_*` variable, then `gpu-leak-test.yaml`, then the
        /// default.
        #[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct Options {
            $( $(#[doc = $doc])* pub $field: Option<$ty>, )*
        }

        impl Options {
            /// Every option's name and its environment variable.
            pub const ENVIRONMENT: &'static [(&'static str, &'static str)] = &[$((stringify!($field), $env)),*];

            /// The value of each option from `self` where set, else from `lower`.
            pub fn or(self, lower: Options) -> Options {
                Options { $( $field: self.$field.or(lower.$field), )* }
            }

            /// The names of the options that are set.
            pub fn keys(&self) -> Vec<&'static str> {
                let mut keys = Vec::new();
                $( if self.$field.is_some() { keys.push(stringify!($field)); } )*
                keys
            }

            /// The options set in the environment (`env` reads a variable).
            pub(crate) fn from_env(env: impl Fn(&str) -> Result<Option<String>>) -> Result<Options> {
                let mut options = Options::default();
                $(
                    if let Some(text) = env($env)?.filter(|v| !v.trim().is_empty()) {
                        let value = <$ty as OptionValue>::parse_text(&text)
                            .map_err(|message| Error::Config { source: format!("environment variable {}", $env), message })?;
                        options.$field = Some(value);
                    }
                )*
                Ok(options)
            }

            /// Checks every value that is set, once, wherever it came from:
            /// `source(key, value)` names its origin for the error.
            pub(crate) fn validate(&self, source: impl Fn(&'static str, &str) -> String) -> Result<()> {
                $(
                    if let Some(value) = &self.$field {
                        $check(value).map_err(|message| Error::Config {
                            source: source(stringify!($field), &OptionValue::text(value)),
                            message,
                        })?;
                    }
                )*
                Ok(())
            }
        }
    };
}

options! {
    /// Retained growth over the measured iterations that still passes, in
    /// MiB (2^20 bytes). Default 0: exact accounting has no noise to absorb.
    threshold_mb: f64, env "GPU_LEAK_TEST_THRESHOLD_MB", check non_negative_mib;
    /// Measured iterations (default 5).
    iterations: u32, env "GPU_LEAK_TEST_ITERATIONS", check at_least_one;
    /// Warm-up iterations (default 2).
    warmup: u32, env "GPU_LEAK_TEST_WARMUP", check any;
    /// Where the body runs: `"auto"` (default), `"cpu"`, `"cuda"`, `"cuda:N"`.
    /// Every device the test touches is judged.
    device: String, env "GPU_LEAK_TEST_DEVICE", check device;
    /// Whose allocations count: `"auto"` (default), `"thread"`, `"process"`.
    scope: String, env "GPU_LEAK_TEST_SCOPE", check scope;
    /// Budget for the most live bytes at once, in MiB.
    peak_mb: f64, env "GPU_LEAK_TEST_PEAK_MB", check positive_mib;
    /// Iterations run with stack capture after a failing verdict (default 3).
    attribution_iterations: u32, env "GPU_LEAK_TEST_ATTRIBUTION_ITERATIONS", check any;
    /// Where reports go (default `target/gpu-leak-test`); in the config file,
    /// relative to its folder.
    report_dir: String, env "GPU_LEAK_TEST_REPORT_DIR", check any;
    /// Which tests get an SVG timeline: failing (default), all or none.
    plots: Plots, env "GPU_LEAK_TEST_PLOTS", check any;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_option_has_one_environment_variable_named_after_it() {
        for (key, env) in Options::ENVIRONMENT {
            assert_eq!(*env, format!("GPU_LEAK_TEST_{}", key.to_ascii_uppercase()));
        }
    }

    #[test]
    fn upper_layers_win_key_by_key() {
        let upper = Options { iterations: Some(3), ..Default::default() };
        let lower = Options { iterations: Some(9), warmup: Some(4), ..Default::default() };
        let merged = upper.or(lower);
        assert_eq!((merged.iterations, merged.warmup), (Some(3), Some(4)));
        assert_eq!(merged.keys(), ["iterations", "warmup"]);
    }

    #[test]
    fn validation_names_the_source_of_the_bad_value() {
        let bad = Options { peak_mb: Some(0.0), ..Default::default() };
        let err = bad.validate(|key, value| format!("{key}={value}")).unwrap_err().to_string();
        assert_eq!(err, "peak_mb=0: 0 MiB is not allowed; use a positive number");
    }
}
