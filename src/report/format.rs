//! Number formatting for people: thousands separators and binary units.

/// `1234567` → `"1,234,567"`.
pub fn thousands(value: u64) -> String {
    let digits = value.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Escapes text for SVG and HTML.
pub(crate) fn escape_markup(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A rate of bytes per iteration as [`bytes`] shows it, rounded to whole
/// bytes (a shrinking rate shows as 0 B).
pub(crate) fn per_iteration_bytes(rate: f64) -> String {
    bytes(rate.round().max(0.0) as u64)
}

/// `512` → `"512 B"`, `2_621_440` → `"2.50 MiB (2,621,440 B)"`.
pub fn bytes(value: u64) -> String {
    const UNITS: [(&str, f64); 3] = [("GiB", 1073741824.0), ("MiB", 1048576.0), ("KiB", 1024.0)];
    for (unit, size) in UNITS {
        if value as f64 >= size {
            return format!("{:.2} {unit} ({} B)", value as f64 / size, thousands(value));
        }
    }
    format!("{} B", thousands(value))
}

/// A byte count short enough for a table cell: `"2.50 MiB"`, `"512 B"`;
/// signed (`"+2.50 MiB"`) where `signed`. The exact figure goes beside it
/// ([`bytes`]), as the cell's title.
pub(crate) fn short_bytes(value: i64, signed: bool) -> String {
    const UNITS: [(&str, f64); 3] = [("GiB", 1073741824.0), ("MiB", 1048576.0), ("KiB", 1024.0)];
    let sign = match value {
        v if v < 0 => "-",
        v if v > 0 && signed => "+",
        _ => "",
    };
    let magnitude = value.unsigned_abs();
    UNITS
        .iter()
        .find(|(_, size)| magnitude as f64 >= *size)
        .map(|(unit, size)| format!("{sign}{:.2} {unit}", magnitude as f64 / size))
        .unwrap_or_else(|| format!("{sign}{} B", thousands(magnitude)))
}

/// Like [`bytes`] with a sign: `"+512 B"`, `"-1.00 KiB (1,024 B)"`, `"0 B"`.
pub fn signed_bytes(value: i64) -> String {
    match value {
        0 => "0 B".into(),
        v if v > 0 => format!("+{}", bytes(v as u64)),
        v => format!("-{}", bytes(v.unsigned_abs())),
    }
}

/// A level, not a change: plain where it is not negative (`"512 B"`), with
/// its sign where it is (a test's live bytes can end below where it began).
pub(crate) fn level_bytes(value: i64) -> String {
    if value < 0 {
        signed_bytes(value)
    } else {
        bytes(value as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formatting() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(404490240), "404,490,240");
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(2_621_440), "2.50 MiB (2,621,440 B)");
        assert_eq!(signed_bytes(-1024), "-1.00 KiB (1,024 B)");
        assert_eq!(signed_bytes(512), "+512 B");
    }

    #[test]
    fn a_level_has_a_sign_only_below_zero() {
        assert_eq!(level_bytes(512), "512 B");
        assert_eq!(level_bytes(0), "0 B");
        assert_eq!(level_bytes(-512), "-512 B");
    }
}
