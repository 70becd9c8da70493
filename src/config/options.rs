//! The options struct, from the one table of options
//! (`gpu_leak_test_options::for_each_option!`, which the attribute reads
//! too). The attribute, the environment, the config file's layers and the
//! builder all fill [`Options`]; the environment variables, the checks and
//! the layer merge are generated from the same table.
use super::Plots;
use crate::device::DeviceChoice;
use crate::scope::Scope;
use crate::baseline::BaselineMode;
use crate::error::{Error, Result};

/// A value an option can hold: parsed from an environment variable, shown in
/// error messages.
pub(crate) trait OptionValue: Sized {
    fn parse_text(text: &str) -> std::result::Result<Self, String>;
    fn text(&self) -> String;
}

impl OptionValue for u32 {
    fn parse_text(text: &str) -> std::result::Result<Self, String> {
        text.trim().parse().map_err(|_| format!("{text:?} is not a valid whole number (0 to {})", u32::MAX))
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

impl OptionValue for bool {
    fn parse_text(text: &str) -> std::result::Result<Self, String> {
        crate::environment::parse_bool("", text).map_err(|_| format!("{text:?} is not a boolean; use 1 or 0"))
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

/// Typed values read from text as the attribute checks them, and shown as
/// written.
macro_rules! from_text {
    ($($ty:ty),*) => {$(
        impl OptionValue for $ty {
            fn parse_text(text: &str) -> std::result::Result<Self, String> {
                text.parse().map_err(|why: crate::error::InvalidValue| why.to_string())
            }
            fn text(&self) -> String {
                self.to_string()
            }
        }
    )*};
}

from_text!(DeviceChoice, Scope, BaselineMode);

impl OptionValue for Plots {
    fn parse_text(text: &str) -> std::result::Result<Self, String> {
        text.parse().map_err(|why: crate::error::InvalidValue| why.to_string())
    }
    fn text(&self) -> String {
        format!("{self:?}").to_ascii_lowercase()
    }
}

/// Builds [`Options`] from the one table (`gpu_leak_test_options`), which
/// the attribute reads too.
macro_rules! options {
    ($( $(#[doc = $doc:literal])* $field:ident: $ty:ty, env $env:literal, rule $rule:ident,
        attribute $kind:ident $(($($arg:tt)*))?; )*) => {
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
                        gpu_leak_test_options::rules::$rule(value).map_err(|message| Error::Config {
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

gpu_leak_test_options::for_each_option!(options);

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
