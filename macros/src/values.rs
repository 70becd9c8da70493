//! What a valid option value is: the one place that says so. This file is
//! compiled into both crates: the attribute checks its literals with it at
//! compile time (a spanned error), the runtime checks the environment and
//! the config file with it (an error naming the source).

/// A `device` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceValue {
    Auto,
    Cpu,
    Cuda(usize),
}

pub fn device(text: &str) -> Result<DeviceValue, String> {
    match text.trim() {
        "auto" => Ok(DeviceValue::Auto),
        "cpu" => Ok(DeviceValue::Cpu),
        "cuda" => Ok(DeviceValue::Cuda(0)),
        other => other
            .strip_prefix("cuda:")
            .and_then(|n| n.parse().ok())
            .map(DeviceValue::Cuda)
            .ok_or_else(|| format!("{other:?} is not a device; use \"auto\", \"cpu\", \"cuda\" or \"cuda:N\"")),
    }
}

/// A `scope` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScopeValue {
    Auto,
    Thread,
    Process,
}

pub fn scope(text: &str) -> Result<ScopeValue, String> {
    match text.trim() {
        "auto" => Ok(ScopeValue::Auto),
        "thread" => Ok(ScopeValue::Thread),
        "process" => Ok(ScopeValue::Process),
        other => Err(format!("{other:?} is not a scope; use \"auto\", \"thread\" or \"process\"")),
    }
}

/// `threshold_mb`: a finite number of MiB, 0 or more.
pub fn threshold_mb(value: f64) -> Result<(), String> {
    if value.is_finite() && value >= 0.0 {
        Ok(())
    } else {
        Err(format!("{value} MiB is not allowed; use a non-negative number"))
    }
}

/// `peak_mb`: a finite number of MiB, more than 0.
pub fn peak_mb(value: f64) -> Result<(), String> {
    if value.is_finite() && value > 0.0 {
        Ok(())
    } else {
        Err(format!("{value} MiB is not allowed; use a positive number"))
    }
}

/// `iterations`: at least one measured iteration.
pub fn iterations(value: u32) -> Result<(), String> {
    if value >= 1 {
        Ok(())
    } else {
        Err("must be at least 1 (2 or more to tell a leak from one-time retention)".into())
    }
}
