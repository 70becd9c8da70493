//! `gpu-leak-test.yaml`, found in the manifest folder of the crate under
//! test: defaults, suppressions and per-test overrides. It sits below the
//! attribute and the environment in precedence, above the built-in defaults.
//!
//! ```yaml
//! defaults:
//!   iterations: 8
//!   threshold_mb: 0
//!   report_dir: target/leak-reports
//!   plots: failing        # failing | all | none
//! suppressions:
//!   - site: "tests/common/*"
//!     reason: "the shared fixture cache is filled lazily, bounded by design"
//! overrides:
//!   - tests: "slow::*"
//!     settings: { iterations: 3 }
//! ```
use super::Options;
use crate::error::{Error, Result};
use serde::Deserialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// The config file's name, looked up in the crate under test's folder.
pub const CONFIG_FILE_NAME: &str = "gpu-leak-test.yaml";

/// Settings a file can give, in `defaults` or an override: the same table
/// as the attribute's.
pub(crate) type FileSettings = Options;

/// Which tests get an SVG timeline.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Plots {
    /// Failing tests only.
    #[default]
    Failing,
    /// Every test.
    All,
    /// None.
    None,
}

impl std::str::FromStr for Plots {
    type Err = crate::error::InvalidValue;
    fn from_str(text: &str) -> std::result::Result<Self, Self::Err> {
        match text.trim() {
            "failing" => Ok(Plots::Failing),
            "all" => Ok(Plots::All),
            "none" => Ok(Plots::None),
            other => Err(crate::error::InvalidValue::new(format!("{other:?} is not a plot choice; use failing, all or none"))),
        }
    }
}

/// Survivors whose allocation site matches `site` (a glob on `file:line` or
/// on the function) are listed in reports but not counted.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Suppression {
    /// A glob on the site's `file:line`, function or calling line.
    pub site: String,
    /// Why it is suppressed (required; shown in reports).
    pub reason: String,
}

/// Settings for the tests whose names match the glob `tests`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TestOverride {
    pub(crate) tests: String,
    pub(crate) settings: FileSettings,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ConfigFile {
    #[serde(default)]
    pub(crate) defaults: FileSettings,
    #[serde(default)]
    pub(crate) suppressions: Vec<Suppression>,
    #[serde(default)]
    pub(crate) overrides: Vec<TestOverride>,
    #[serde(skip)]
    pub(crate) path: PathBuf,
}

/// The file's settings for one test, each with where it came from.
#[derive(Debug, Clone, Default)]
pub(crate) struct FileLayer {
    pub(crate) settings: FileSettings,
    /// Per key, a description of the source (`gpu-leak-test.yaml (defaults)`).
    pub(crate) sources: HashMap<&'static str, String>,
    pub(crate) suppressions: Vec<Suppression>,
    pub(crate) folder: PathBuf,
}

impl FileLayer {
    #[cfg(test)]
    pub(crate) fn source(&self, key: &str) -> String {
        self.sources.get(key).cloned().unwrap_or_else(|| CONFIG_FILE_NAME.to_string())
    }
}

/// Why `pattern` uses glob syntax [`glob_match`] does not have (`{a,b}`,
/// `[lo]`), which would otherwise be taken literally and never match.
fn unsupported_glob(pattern: &str) -> Option<String> {
    pattern.chars().find(|c| matches!(c, '{' | '}' | '[' | ']')).map(|c| {
        format!(
            "{pattern:?} uses `{c}`, which these globs do not support (only `*`, any run of characters, and `?`, any \
             one); write one entry per alternative"
        )
    })
}

/// `*` matches any run of characters, `?` any one.
pub(crate) fn glob_match(pattern: &str, text: &str) -> bool {
    glob_match_counting(pattern, text).0
}

/// [`glob_match`] with the number of steps it took. Greedy matching that
/// only ever backtracks to the latest `*` (an earlier star can never do
/// better than a later one), so the steps grow with the text's length, not
/// exponentially with the stars as plain recursion does.
pub(crate) fn glob_match_counting(pattern: &str, text: &str) -> (bool, u64) {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti, mut steps) = (0usize, 0usize, 0u64);
    // The latest star, and the text position its match currently ends at.
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        steps += 1;
        match p.get(pi) {
            Some('*') => {
                star = Some((pi, ti));
                pi += 1;
            }
            Some(&c) if c == '?' || c == t[ti] => {
                pi += 1;
                ti += 1;
            }
            _ => match star {
                // Let the latest star take one more character and retry.
                Some((star_pi, star_ti)) => {
                    star = Some((star_pi, star_ti + 1));
                    pi = star_pi + 1;
                    ti = star_ti + 1;
                }
                None => return (false, steps),
            },
        }
    }
    while p.get(pi) == Some(&'*') {
        steps += 1;
        pi += 1;
    }
    (pi == p.len(), steps)
}

/// A suppression pattern made only of wildcards with a `*` among them
/// matches every real site (a `file:line` is longer than a few `?`s), so
/// it would silently pass every leak.
fn matches_everything(pattern: &str) -> bool {
    let pattern = pattern.trim();
    pattern.contains('*') && pattern.chars().all(|c| c == '*' || c == '?')
}

/// The 1-based line of the first line of `text` that holds `key:` and, if
/// given, `value`.
/// Top-level keys the file ignores, for YAML anchors to live on (as in
/// docker-compose files): `x-common: &common ...`.
const EXTENSION_PREFIX: &str = "x-";

fn line_of(text: &str, key: &str, value: Option<&str>) -> usize {
    let needle = format!("{key}:");
    text.lines()
        .position(|line| line.contains(&needle) && value.is_none_or(|v| line.contains(v)))
        .or_else(|| text.lines().position(|line| line.contains(&needle)))
        .map(|i| i + 1)
        .unwrap_or(1)
}

/// `section: key: why` (a typed value that names its key, where serde_yaml's
/// path stops at the mapping holding it) as `section.key: why`.
fn with_key_in_path(message: String) -> String {
    let Some((path, rest)) = message.split_once(": ") else { return message };
    match rest.split_once(": ") {
        Some((key, why)) if super::Options::ENVIRONMENT.iter().any(|(name, _)| *name == key) => format!("{path}.{key}: {why}"),
        _ => message,
    }
}

impl ConfigFile {
    /// Parses and checks a config file. Errors name the file, the line and
    /// the key.
    pub(crate) fn parse(path: &Path, text: &str) -> Result<ConfigFile> {
        let display = path.display().to_string();
        let error = |line: usize, message: String| Error::Config { source: format!("{display}:{line}"), message };
        let mut config: ConfigFile = if text.trim().is_empty() {
            ConfigFile::default()
        } else {
            let yaml_error = |e: serde_yaml::Error| {
                let message = e.to_string();
                // A value built from merged keys has no positions: the
                // line is the key's the message names.
                let named_key = message.split('`').nth(1).unwrap_or("");
                let line = e.location().map(|l| l.line()).unwrap_or_else(|| line_of(text, named_key, None));
                let mut message = match message.find(" at line ") {
                    Some(cut) => message[..cut].to_string(),
                    None => message,
                };
                if text.lines().nth(line.saturating_sub(1)).is_some_and(|l| l.trim_end().starts_with(|c: char| c.is_whitespace()) && l.contains('\t')) {
                    message += " (a tab: YAML indents with spaces only)";
                }
                error(line, with_key_in_path(message))
            };
            if text.contains("<<") || text.lines().any(|line| line.starts_with(EXTENSION_PREFIX)) {
                // Merge keys (`<<: *common`) and top-level `x-` keys to
                // anchor them on, as CI configuration uses them: resolved
                // before the typed parse.
                let mut value: serde_yaml::Value = serde_yaml::from_str(text).map_err(yaml_error)?;
                value.apply_merge().map_err(yaml_error)?;
                if let serde_yaml::Value::Mapping(top) = &mut value {
                    top.retain(|key, _| !key.as_str().is_some_and(|key| key.starts_with(EXTENSION_PREFIX)));
                }
                serde_yaml::from_value(value).map_err(yaml_error)?
            } else {
                serde_yaml::from_str(text).map_err(yaml_error)?
            }
        };
        config.path = path.to_path_buf();
        let mut sections = vec![("defaults".to_string(), &config.defaults)];
        for (i, o) in config.overrides.iter().enumerate() {
            sections.push((format!("overrides[{i}].settings"), &o.settings));
        }
        for (section, s) in sections {
            s.validate(|key, value| format!("{display}:{}: {section}.{key}", line_of(text, key, Some(value))))?;
        }
        for (i, o) in config.overrides.iter().enumerate() {
            if let Some(why) = unsupported_glob(&o.tests) {
                return Err(error(line_of(text, "tests", Some(&o.tests)), format!("overrides[{i}].tests: {why}")));
            }
        }
        for (i, suppression) in config.suppressions.iter().enumerate() {
            if suppression.site.trim().is_empty() {
                return Err(error(
                    line_of(text, "site", Some(&suppression.site)),
                    format!("suppressions[{i}].site: empty, so it would match no site; name the file, line or function it is for"),
                ));
            }
            if let Some(why) = unsupported_glob(&suppression.site) {
                return Err(error(line_of(text, "site", Some(&suppression.site)), format!("suppressions[{i}].site: {why}")));
            }
            if matches_everything(&suppression.site) {
                return Err(error(
                    line_of(text, "site", Some(&suppression.site)),
                    format!(
                        "suppressions[{i}].site: {:?} matches every site, so it would pass every leak; name the \
                         file, line or function it is for (\"tests/common/*\", \"*::fill_cache\")",
                        suppression.site
                    ),
                ));
            }
            if suppression.reason.trim().is_empty() {
                return Err(error(
                    line_of(text, "site", Some(&suppression.site)),
                    format!("suppressions[{i}].reason: say why {:?} is suppressed", suppression.site),
                ));
            }
        }
        Ok(config)
    }

    /// Loads `gpu-leak-test.yaml` from `folder`, once per process;
    /// `Ok(None)` where there is none.
    pub(crate) fn load(folder: &Path) -> Result<Option<Arc<ConfigFile>>> {
        type Cache = Mutex<HashMap<PathBuf, Result<Option<Arc<ConfigFile>>>>>;
        static CACHE: OnceLock<Cache> = OnceLock::new();
        let path = folder.join(CONFIG_FILE_NAME);
        let mut cache = CACHE.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
        cache
            .entry(path.clone())
            .or_insert_with(|| match std::fs::read_to_string(&path) {
                Ok(text) => ConfigFile::parse(&path, &text).map(|c| Some(Arc::new(c))),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(Error::Config { source: path.display().to_string(), message: format!("cannot read: {e}") }),
            })
            .clone()
    }

    /// The settings for `test`: `defaults`, then every override whose glob
    /// matches the test's name, later ones winning.
    pub(crate) fn layer_for(&self, test: &str) -> FileLayer {
        let file = self.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let mut layer = FileLayer {
            suppressions: self.suppressions.clone(),
            folder: self.path.parent().map(Path::to_path_buf).unwrap_or_default(),
            ..Default::default()
        };
        let mut apply = |from: &FileSettings, source: String| {
            for key in from.keys() {
                layer.sources.insert(key, format!("{file} ({source}.{key})"));
            }
            layer.settings = from.clone().or(std::mem::take(&mut layer.settings));
        };
        apply(&self.defaults, "defaults".into());
        for (i, o) in self.overrides.iter().enumerate() {
            if glob_match(&o.tests, test) {
                apply(&o.settings, format!("overrides[{i}].settings"));
            }
        }
        layer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_suppression_that_matches_every_site_is_refused_naming_file_line_and_key() {
        for site in ["*", "**", "*?*"] {
            let text = format!("suppressions:\n  - site: \"{site}\"\n    reason: \"noise\"\n");
            let err = parse(&text).unwrap_err().to_string();
            assert!(err.starts_with("gpu-leak-test.yaml:2: suppressions[0].site:") && err.contains("matches every site"), "{err}");
        }
        assert!(parse("suppressions:\n  - site: \"tests/common/*\"\n    reason: \"fixture cache\"\n").is_ok());
    }

    #[test]
    fn glob_matching_takes_linear_steps_on_a_pathological_pattern() {
        // 30 stars between letters, against subjects that almost match: plain
        // recursion explores exponentially many splits here.
        let pattern: String = (0..30).map(|_| "a*").collect::<String>() + "b";
        let steps = |n: usize| {
            let (matched, steps) = glob_match_counting(&pattern, &"a".repeat(n));
            assert!(!matched);
            steps
        };
        let (at_200, at_400, at_800) = (steps(200), steps(400), steps(800));
        println!("steps: 200 chars {at_200}, 400 chars {at_400}, 800 chars {at_800}");
        assert!(at_200 <= 200 * 64, "{at_200} steps for 200 characters");
        // Doubling the subject at most doubles the steps (plus slack), as
        // linear growth does.
        assert!(at_400 <= at_200 * 2 + 64 && at_800 <= at_400 * 2 + 64, "{at_200} {at_400} {at_800}");
    }

    #[test]
    fn globs() {
        assert!(glob_match("article::*", "article::cpu::row1"));
        assert!(glob_match("*row?", "article::row1"));
        assert!(!glob_match("article::*::row2", "article::cpu::row1"));
        assert!(glob_match("tests/common/*", "tests/common/mod.rs:12"));
    }

    fn parse(text: &str) -> Result<ConfigFile> {
        ConfigFile::parse(Path::new("gpu-leak-test.yaml"), text)
    }

    #[test]
    fn overrides_apply_by_name_later_ones_winning() {
        let config = parse(
            "defaults: { iterations: 8, warmup: 1 }\noverrides:\n  - tests: \"slow::*\"\n    settings: { iterations: 3 }\n  - tests: \"slow::very*\"\n    settings: { iterations: 2 }\n",
        )
        .unwrap();
        let layer = config.layer_for("slow::very_slow");
        assert_eq!((layer.settings.iterations, layer.settings.warmup), (Some(2), Some(1)));
        assert_eq!(layer.source("iterations"), "gpu-leak-test.yaml (overrides[1].settings.iterations)");
        assert_eq!(config.layer_for("fast::one").settings.iterations, Some(8));
    }

    #[test]
    fn merge_keys_apply_as_in_ci_configuration() {
        let text = "x-common: &common\n  iterations: 7\n  warmup: 3\ndefaults:\n  <<: *common\n  threshold_mb: 1\n";
        let config = parse(text).unwrap();
        assert_eq!((config.defaults.iterations, config.defaults.warmup), (Some(7), Some(3)));
        // A key merged in is checked like any other, at its line.
        let err = parse("x-common: &common\n  iteratons: 7\ndefaults:\n  <<: *common\n").unwrap_err().to_string();
        assert!(err.starts_with("gpu-leak-test.yaml:2:") && err.contains("unknown field `iteratons`"), "{err}");
    }

    #[test]
    fn a_tab_used_for_indentation_is_named() {
        let err = parse("defaults:\n\titerations: 5\n").unwrap_err().to_string();
        assert!(err.starts_with("gpu-leak-test.yaml:2:") && err.contains("a tab: YAML indents with spaces only"), "{err}");
    }

    #[test]
    fn errors_name_file_line_and_key() {
        let err = parse("defaults:\n  iterations: 5\n  treshold_mb: 1\n").unwrap_err().to_string();
        assert!(err.starts_with("gpu-leak-test.yaml:3: defaults: unknown field `treshold_mb`"), "{err}");
        let err = parse("defaults:\n  warmup: 1\n  threshold_mb: -2\n").unwrap_err().to_string();
        assert_eq!(err, "gpu-leak-test.yaml:3: defaults.threshold_mb: -2 MiB is not allowed; use a non-negative number");
        let err = parse("defaults:\n  iterations: many\n").unwrap_err().to_string();
        assert!(err.starts_with("gpu-leak-test.yaml:2: defaults.iterations: invalid type"), "{err}");
        let err = parse("suppressions:\n  - site: \"x.rs:*\"\n").unwrap_err().to_string();
        assert!(err.contains("missing field `reason`"), "{err}");
        let err = parse("suppressions:\n  - site: \"x.rs:*\"\n    reason: \" \"\n").unwrap_err().to_string();
        assert!(err.starts_with("gpu-leak-test.yaml:2: suppressions[0].reason"), "{err}");
        let err = parse("overrides:\n  - tests: a\n    settings: { device: tpu }\n").unwrap_err().to_string();
        assert!(err.starts_with("gpu-leak-test.yaml:3: overrides[0].settings.device: \"tpu\" is not a device"), "{err}");
        let err = parse("defaults: {}\noverrides:\n  - tests: \"suite::{a,b}\"\n    settings: { iterations: 3 }\n").unwrap_err().to_string();
        assert!(err.starts_with("gpu-leak-test.yaml:3: overrides[0].tests: \"suite::{a,b}\" uses `{`"), "{err}");
        let err = parse("suppressions:\n  - site: \"src/[lo]*.rs:*\"\n    reason: cache\n").unwrap_err().to_string();
        assert!(err.starts_with("gpu-leak-test.yaml:2: suppressions[0].site: \"src/[lo]*.rs:*\" uses `[`"), "{err}");
        let err = parse("suppressions:\n  - site: \"\"\n    reason: cache\n").unwrap_err().to_string();
        assert!(err.starts_with("gpu-leak-test.yaml:2: suppressions[0].site: empty"), "{err}");
        let err = parse("defaults: { plots: sometimes }\n").unwrap_err().to_string();
        assert!(err.contains("unknown variant `sometimes`"), "{err}");
    }
}
