//! Reading `GPU_LEAK_TEST_*` variables: the settings' layer of them
//! (config) and the switches the probe reads itself share these rules.
use crate::error::{Error, Result};

/// Parses a boolean variable: 1/true/yes/on or 0/false/no/off/empty.
pub(crate) fn parse_bool(name: &str, value: &str) -> Result<bool> {
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
pub(crate) fn env_var(name: &str) -> Result<Option<String>> {
    match std::env::var(name) {
        Ok(value) => Ok(Some(value)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(Error::Config {
            source: format!("environment variable {name}"),
            message: "is not valid UTF-8".into(),
        }),
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

