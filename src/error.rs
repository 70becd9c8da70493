//! The crate's one error type. Every message says what went wrong, where, and
//! what to do about it.
use std::fmt;

#[allow(missing_docs)] // The fields are named for what they hold; the variants say the rest.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Error {
    /// A CUDA query on a process that has no usable CUDA device.
    NoCudaDevice { reason: String },
    /// `cuda:N` where the process sees `count` devices.
    NoSuchCudaDevice { index: usize, count: usize },
    /// A libtorch call threw; `call` names the shim entry point, or the
    /// harness's own tensor call.
    Libtorch { call: &'static str, message: String },
    /// The allocation hook could not be installed or removed.
    Hook { message: String },
    /// A setting (attribute, environment variable or config file) is
    /// malformed; `source` names where it came from (file and line, or the
    /// variable).
    Config { source: String, message: String },
    /// A leak test started inside the body of another (`outer`), which
    /// holds the locks the inner one would wait for.
    NestedLeakTest { outer: String, inner: String },
    /// A report file or folder could not be written or read; `message`
    /// names the file and the system's reason.
    ReportFiles { message: String },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NoCudaDevice { reason } => write!(
                f,
                "no CUDA device: {reason}. CUDA memory cannot be measured in this process; \
                 run on a machine with an NVIDIA GPU and a CUDA build of libtorch, or use device = \"cpu\""
            ),
            Error::NoSuchCudaDevice { index, count } => write!(
                f,
                "no CUDA device cuda:{index}: this process sees {count} CUDA device(s) \
                 (cuda:0..cuda:{}); pick one of those or check CUDA_VISIBLE_DEVICES",
                count.saturating_sub(1)
            ),
            Error::Libtorch { call, message } => write!(f, "libtorch failed in {call}: {message}"),
            Error::Hook { message } => write!(f, "allocation hook: {message}"),
            Error::Config { source, message } => write!(f, "{source}: {message}"),
            Error::NestedLeakTest { outer, inner } => write!(
                f,
                "the leak test `{inner}` was started inside the body of the leak test `{outer}`, which holds the \
                 device and scope locks for its whole run, so `{inner}` would wait for it forever. Make `{inner}` a \
                 test of its own, or call its body directly inside `{outer}`"
            ),
            Error::ReportFiles { message } => write!(f, "{message}"),
        }
    }
}

impl std::error::Error for Error {}

/// A text that is not a value of a setting: what parsing a
/// [`DeviceChoice`](crate::device::DeviceChoice), [`Scope`](crate::scope::Scope) or
/// [`Plots`](crate::config::Plots) from text returns. Its message quotes the text
/// and lists the valid values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidValue {
    message: String,
}

impl InvalidValue {
    pub(crate) fn new(message: String) -> Self {
        InvalidValue { message }
    }

    /// What was wrong with the text, and what to write instead.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Contains `needle`: for tests of the message.
    #[cfg(test)]
    pub(crate) fn contains(&self, needle: &str) -> bool {
        self.message.contains(needle)
    }
}

impl fmt::Display for InvalidValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for InvalidValue {}

/// Deserializes a setting from the text the attribute takes (its `FromStr`),
/// naming `key` in the error: serde_yaml's path stops at the mapping that
/// holds it.
pub(crate) fn deserialize_text<'de, D, T>(deserializer: D, key: &str) -> std::result::Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: std::str::FromStr<Err = InvalidValue>,
{
    let text = <String as serde::Deserialize>::deserialize(deserializer)?;
    text.parse().map_err(|why: InvalidValue| serde::de::Error::custom(format!("{key}: {why}")))
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
