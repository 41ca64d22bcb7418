//! Value parsers with Knative's (that is, Go's) syntax, and the [`Problem`] every error becomes.
//!
//! Knative reads ConfigMaps with Go's `strconv` and `time.ParseDuration`, so thaw accepts exactly
//! those spellings: booleans `1 t T TRUE true True 0 f F FALSE false False`; durations with a unit
//! on every number (`60s`, `1m30s`, `1.5h`, `250ms`; a bare `0` is the one unitless value);
//! decimal or exponent floats. One deliberate difference: `NaN` and infinities are rejected.

use std::fmt;
use std::time::Duration;

/// One rejected value: the key, the value as written, and why; and the file it is in, once
/// known.
///
/// Displayed as `[FILE: ]KEY: VALUE: REASON`, the line `thaw config check` prints per problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The file the key is in, when the problem came from one (set by [`Problem::in_file`]).
    pub file: Option<String>,
    pub key: String,
    pub value: String,
    pub reason: String,
}

impl Problem {
    pub fn new(
        key: impl Into<String>,
        value: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        Self {
            file: None,
            key: key.into(),
            value: value.into(),
            reason: reason.into(),
        }
    }

    /// Names the file the problem is in, unless a file is named already (the innermost file
    /// wins: a ConfigMap reached through local.yaml names the ConfigMap's file) or the key is
    /// that file itself (a file that cannot be read or parsed).
    pub fn in_file(mut self, file: impl Into<String>) -> Self {
        let file = file.into();
        if self.file.is_none() && self.key != file {
            self.file = Some(file);
        }
        self
    }

    /// Whether the reason ends with the value as found (`..., got "lots"`, `..., got -1`).
    fn reason_quotes_value(&self) -> bool {
        self.reason.ends_with(&format!("got {:?}", self.value))
            || self.reason.ends_with(&format!("got {}", self.value))
    }

    /// `{"file", "key", "value", "reason"}` (file `null` when none is known).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "file": self.file,
            "key": self.key,
            "value": self.value,
            "reason": self.reason,
        })
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(file) = &self.file {
            write!(f, "{file}: ")?;
        }
        // A reason that already ends with what was found (`expected a whole number, got
        // "lots"`) is not preceded by the value again.
        if self.value.is_empty() || self.reason_quotes_value() {
            write!(f, "{}: {}", self.key, self.reason)
        } else {
            write!(f, "{}: {}: {}", self.key, self.value, self.reason)
        }
    }
}

/// Every problem found in one input, in key order of discovery. Never empty when returned as an
/// error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct Problems(pub Vec<Problem>);

impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

/// Go's `strconv.ParseBool`.
pub fn parse_bool(s: &str) -> Result<bool, String> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err("not a boolean (true or false)".into()),
    }
}

/// Go's `strconv.ParseFloat(s, 64)`, minus NaN and infinities.
pub fn parse_f64(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| "not a number".to_string())?;
    if !v.is_finite() {
        return Err("not a finite number".into());
    }
    Ok(v)
}

/// Go's `strconv.ParseInt(s, 10, 32)`.
pub fn parse_i32(s: &str) -> Result<i32, String> {
    s.parse::<i32>().map_err(|e| match e.kind() {
        std::num::IntErrorKind::PosOverflow | std::num::IntErrorKind::NegOverflow => {
            "out of range for a 32-bit integer".to_string()
        }
        _ => "not an integer".to_string(),
    })
}

/// Go's `strconv.ParseInt(s, 10, 64)`.
pub fn parse_i64(s: &str) -> Result<i64, String> {
    s.parse::<i64>().map_err(|e| match e.kind() {
        std::num::IntErrorKind::PosOverflow | std::num::IntErrorKind::NegOverflow => {
            "out of range for a 64-bit integer".to_string()
        }
        _ => "not an integer".to_string(),
    })
}

/// A signed duration as Go's `time.ParseDuration` reads it, in nanoseconds.
///
/// Kept signed so that rules such as "scale-down-delay must not be negative" can name the value
/// instead of failing as a syntax error.
pub fn parse_go_duration_nanos(s: &str) -> Result<i128, String> {
    const ERR: &str = "not a duration (a number with a unit: ns, us, ms, s, m or h, e.g. 60s)";
    let mut rest = s;
    let mut neg = false;
    if let Some(r) = rest.strip_prefix('-') {
        neg = true;
        rest = r;
    } else if let Some(r) = rest.strip_prefix('+') {
        rest = r;
    }
    if rest == "0" {
        return Ok(0);
    }
    if rest.is_empty() {
        return Err(ERR.into());
    }
    let mut total: i128 = 0;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let num = &rest[..num_len];
        if num.is_empty() || num == "." || num.matches('.').count() > 1 {
            return Err(ERR.into());
        }
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let scale: i128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => return Err(format!("{ERR}; missing unit")),
            _ => return Err(format!("{ERR}; unknown unit {unit:?}")),
        };
        let (int_part, frac_part) = num.split_once('.').unwrap_or((num, ""));
        let int: i128 = if int_part.is_empty() {
            0
        } else {
            int_part.parse().map_err(|_| ERR.to_string())?
        };
        let mut value = int.checked_mul(scale).ok_or("duration out of range")?;
        let mut frac_scale = scale;
        for d in frac_part.bytes().take(18) {
            frac_scale /= 10;
            value += i128::from(d - b'0') * frac_scale;
        }
        total = total.checked_add(value).ok_or("duration out of range")?;
        if total > i128::from(i64::MAX) {
            return Err("duration out of range".into());
        }
    }
    Ok(if neg { -total } else { total })
}

/// Formats a duration the way Go prints it for the common whole cases (`60s`, `1h0m0s` style is
/// avoided in favour of the shortest exact form: `1h`, `90s`, `250ms`).
pub fn format_duration(d: Duration) -> String {
    let n = d.as_nanos();
    if n == 0 {
        return "0s".into();
    }
    if n.is_multiple_of(3_600_000_000_000) {
        format!("{}h", n / 3_600_000_000_000)
    } else if n.is_multiple_of(60_000_000_000) && n >= 60_000_000_000 * 2 {
        format!("{}m", n / 60_000_000_000)
    } else if n.is_multiple_of(1_000_000_000) {
        format!("{}s", n / 1_000_000_000)
    } else if n.is_multiple_of(1_000_000) {
        format!("{}ms", n / 1_000_000)
    } else {
        format!("{}ns", n)
    }
}

/// Seconds as a JSON number: whole seconds print as integers, fractions as decimals.
pub fn duration_json(d: Duration) -> serde_json::Value {
    if d.subsec_nanos() == 0 {
        serde_json::Value::from(d.as_secs())
    } else {
        serde_json::Value::from(d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        let ok = [
            ("0", 0i128),
            ("60s", 60_000_000_000),
            ("1m30s", 90_000_000_000),
            ("1.5h", 5_400_000_000_000),
            ("250ms", 250_000_000),
            ("-1s", -1_000_000_000),
            ("1h2m3s4ms", 3_723_004_000_000),
            (".5s", 500_000_000),
            ("3us", 3_000),
        ];
        for (s, want) in ok {
            assert_eq!(parse_go_duration_nanos(s), Ok(want), "{s}");
        }
        for bad in ["", "60", "s", "1x", "1.2.3s", "- 1s", "1s ", "abc", "1d"] {
            assert!(
                parse_go_duration_nanos(bad).is_err(),
                "{bad:?} should be rejected"
            );
        }
    }

    #[test]
    fn go_bools_and_numbers() {
        for t in ["1", "t", "T", "TRUE", "true", "True"] {
            assert_eq!(parse_bool(t), Ok(true));
        }
        for f in ["0", "f", "F", "FALSE", "false", "False"] {
            assert_eq!(parse_bool(f), Ok(false));
        }
        assert!(parse_bool("yes").is_err());
        assert_eq!(parse_f64("1e3"), Ok(1000.0));
        assert!(parse_f64("NaN").is_err());
        assert!(parse_f64("inf").is_err());
        assert!(
            parse_i32("2147483648")
                .unwrap_err()
                .contains("out of range")
        );
    }

    #[test]
    fn durations_print_shortest() {
        assert_eq!(format_duration(Duration::from_secs(60)), "60s");
        assert_eq!(format_duration(Duration::from_secs(3600)), "1h");
        assert_eq!(format_duration(Duration::from_secs(600)), "10m");
        assert_eq!(format_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(format_duration(Duration::ZERO), "0s");
    }
}
