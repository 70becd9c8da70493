//! What a valid option value is: the one place that says so. The attribute
//! checks its literals with these rules at compile time (a spanned error),
//! the runtime checks the environment, the config file and the builder with
//! them (an error naming the source).

/// A `device` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceValue {
    Auto,
    Cpu,
    Cuda(usize),
}

pub fn parse_device(text: &str) -> Result<DeviceValue, String> {
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

/// `device`: one [`parse_device`] accepts.
pub fn device(text: &str) -> Result<(), String> {
    parse_device(text).map(drop)
}

/// A `scope` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScopeValue {
    Auto,
    Thread,
    Process,
}

pub fn parse_scope(text: &str) -> Result<ScopeValue, String> {
    match text.trim() {
        "auto" => Ok(ScopeValue::Auto),
        "thread" => Ok(ScopeValue::Thread),
        "process" => Ok(ScopeValue::Process),
        other => Err(format!("{other:?} is not a scope; use \"auto\", \"thread\" or \"process\"")),
    }
}

/// `scope`: one [`parse_scope`] accepts.
pub fn scope(text: &str) -> Result<(), String> {
    parse_scope(text).map(drop)
}

/// `threshold_mb`: a finite number of MiB, 0 or more.
pub fn threshold_mb(value: &f64) -> Result<(), String> {
    if value.is_finite() && *value >= 0.0 {
        Ok(())
    } else {
        Err(format!("{value} MiB is not allowed; use a non-negative number"))
    }
}

/// `peak_mb`: a finite number of MiB, more than 0.
pub fn peak_mb(value: &f64) -> Result<(), String> {
    if value.is_finite() && *value > 0.0 {
        Ok(())
    } else {
        Err(format!("{value} MiB is not allowed; use a positive number"))
    }
}

/// `baseline_tolerance_pct`: a finite percentage, 0 or more (0: any rise
/// fails).
pub fn baseline_tolerance_pct(value: &f64) -> Result<(), String> {
    if value.is_finite() && *value >= 0.0 {
        Ok(())
    } else {
        Err(format!("{value}% is not allowed; use a non-negative percentage (0 fails any rise)"))
    }
}

/// `iterations`: at least one measured iteration.
pub fn iterations(value: &u32) -> Result<(), String> {
    if *value >= 1 {
        Ok(())
    } else {
        Err("must be at least 1 (2 or more to tell a leak from one-time retention)".into())
    }
}

/// `attribution_iterations`: at least one, since attribution is what names
/// the sites and tells state replaced every iteration from a leak.
pub fn attribution_iterations(value: &u32) -> Result<(), String> {
    if *value >= 1 {
        Ok(())
    } else {
        Err("must be at least 1: attribution names the sites of a failure and tells state replaced every iteration \
             from a leak. It runs only after a test has failed, so it costs a passing test nothing"
            .into())
    }
}

/// Every value its type can hold.
pub fn any<T: ?Sized>(_: &T) -> Result<(), String> {
    Ok(())
}
