//! The one table of gpu-leak-test's options, and the rules for their
//! values. Both of its crates read it: the runtime builds its `Options`
//! struct, environment variables and checks from [`for_each_option!`];
//! the `#[gpu_leak_test]` attribute finds each key's kind in it and checks
//! its literal with the same rule at compile time, as a spanned error.
//! Adding an option is one line of the table (and a rule where its values
//! need one).
pub mod rules;

/// How the attribute takes an option's value.
#[derive(Clone, Copy)]
pub enum AttributeValue {
    /// A number: a float or integer literal, possibly negated, checked by
    /// the rule; the text says what it counts ("a number of MiB").
    Number(fn(&f64) -> Result<(), String>, &'static str),
    /// `true` or `false`.
    Flag,
    /// A whole-number literal, checked by the rule.
    Whole(fn(&u32) -> Result<(), String>),
    /// A string literal, checked by the rule; the text lists what is valid.
    Text(fn(&str) -> Result<(), String>, &'static str),
    /// Not on the attribute: a setting of the whole suite (the config file
    /// or the environment).
    SuiteOnly,
}

/// One option as the attribute sees it.
pub struct AttributeOption {
    pub name: &'static str,
    pub value: AttributeValue,
}

/// Calls `$callback! { ... }` with every option, one entry each:
///
/// ```text
/// /// doc
/// name: Type, env "GPU_LEAK_TEST_NAME", rule rule_fn, attribute kind(args);
/// ```
///
/// `Type` is the runtime's field type (named where the callback expands;
/// typed values such as a device are valid once parsed, by the rule the
/// attribute uses too), `rule_fn` a function of [`rules`] taking `&Type`
/// (for every source), and
/// the attribute kind one of `mib`, `percent`, `flag`, `whole`,
/// `text("what is valid")` or `suite_only`, with the rule the attribute
/// checks literals with.
#[macro_export]
macro_rules! for_each_option {
    ($callback:ident) => {
        $callback! {
            /// Retained growth over the measured iterations that still passes, in
            /// MiB (2^20 bytes). Default 0: exact accounting has no noise to absorb.
            threshold_mb: f64, env "GPU_LEAK_TEST_THRESHOLD_MB", rule threshold_mb, attribute mib(threshold_mb);
            /// Measured iterations (default 5).
            iterations: u32, env "GPU_LEAK_TEST_ITERATIONS", rule iterations, attribute whole(iterations);
            /// Warm-up iterations (default 2).
            warmup: u32, env "GPU_LEAK_TEST_WARMUP", rule any, attribute whole(any);
            /// Where the body runs: `"auto"` (default), `"cpu"`, `"cuda"`, `"cuda:N"`.
            /// Every device the test touches is judged.
            device: DeviceChoice, env "GPU_LEAK_TEST_DEVICE", rule any, attribute text(device, "\"auto\", \"cpu\", \"cuda\" or \"cuda:N\"");
            /// Whose allocations count: `"auto"` (default), `"thread"`, `"process"`.
            scope: Scope, env "GPU_LEAK_TEST_SCOPE", rule any, attribute text(scope, "\"auto\", \"thread\" or \"process\"");
            /// Budget for the most live bytes at once, in MiB.
            peak_mb: f64, env "GPU_LEAK_TEST_PEAK_MB", rule peak_mb, attribute mib(peak_mb);
            /// Iterations run with stack capture after a failing verdict (default 3,
            /// at least 1; more where the leak's period needs them).
            attribution_iterations: u32, env "GPU_LEAK_TEST_ATTRIBUTION_ITERATIONS", rule attribution_iterations, attribute whole(attribution_iterations);
            /// Where reports go (default `target/gpu-leak-test`); in the config file,
            /// relative to its folder.
            report_dir: String, env "GPU_LEAK_TEST_REPORT_DIR", rule any, attribute suite_only;
            /// Which tests get an SVG timeline: failing (default), all or none.
            plots: Plots, env "GPU_LEAK_TEST_PLOTS", rule any, attribute suite_only;
            /// Keep this test's memory figures as a reviewed baseline in
            /// `memory-baselines/` and fail where one grows past it (default false).
            baseline: bool, env "GPU_LEAK_TEST_BASELINE", rule any, attribute flag;
            /// How far, in percent, a figure may rise above its baseline and
            /// still pass (default 5; 0 allowed).
            baseline_tolerance_pct: f64, env "GPU_LEAK_TEST_BASELINE_TOLERANCE_PCT", rule baseline_tolerance_pct, attribute percent(baseline_tolerance_pct);
            /// Where baselines live (default `memory-baselines` in the crate's
            /// folder); in the config file, relative to its folder.
            baseline_dir: String, env "GPU_LEAK_TEST_BASELINE_DIR", rule any, attribute suite_only;
            /// What runs do with baselines: `check` (default: compare where one
            /// exists), `update` (write them), `require` (fail a test without one).
            baselines: BaselineMode, env "GPU_LEAK_TEST_BASELINES", rule any, attribute suite_only;
        }
    };
}

macro_rules! attribute_table {
    ($( $(#[doc = $doc:literal])* $field:ident: $ty:ty, env $env:literal, rule $rule:ident,
        attribute $kind:ident $(($($arg:tt)*))?; )*) => {
        /// Every option, with how the attribute takes its value.
        pub const OPTIONS: &[AttributeOption] = &[
            $( AttributeOption { name: stringify!($field), value: attribute_value!($kind $(($($arg)*))?) }, )*
        ];
    };
}

macro_rules! attribute_value {
    (mib($rule:ident)) => {
        AttributeValue::Number(rules::$rule, "a number of MiB")
    };
    (percent($rule:ident)) => {
        AttributeValue::Number(rules::$rule, "a percentage")
    };
    (flag) => {
        AttributeValue::Flag
    };
    (whole($rule:ident)) => {
        AttributeValue::Whole(rules::$rule)
    };
    (text($rule:ident, $valid:literal)) => {
        AttributeValue::Text(|text| rules::$rule(&text), $valid)
    };
    (suite_only) => {
        AttributeValue::SuiteOnly
    };
}

for_each_option!(attribute_table);

/// The option `name`, where there is one.
pub fn option(name: &str) -> Option<&'static AttributeOption> {
    OPTIONS.iter().find(|option| option.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_option_is_in_the_table_once() {
        let mut names: Vec<&str> = OPTIONS.iter().map(|o| o.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), OPTIONS.len());
        assert!(option("threshold_mb").is_some() && option("iteratons").is_none());
    }

    #[test]
    fn the_attribute_checks_literals_with_the_rules_every_source_uses() {
        let Some(AttributeOption { value: AttributeValue::Number(check, _), .. }) = option("threshold_mb") else { panic!() };
        assert!(check(&1.0).is_ok() && check(&-1.0).is_err());
        let Some(AttributeOption { value: AttributeValue::Text(check, valid), .. }) = option("device") else { panic!() };
        assert!(check("cuda:1").is_ok() && check("gpu").is_err() && valid.contains("cuda:N"));
        assert!(matches!(option("plots").unwrap().value, AttributeValue::SuiteOnly));
    }
}
