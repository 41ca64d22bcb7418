//! The trace `simulate` replays (CSV `second,concurrency`) and the per-second CSV it writes.

use std::fmt::Write as _;

use super::Row;

/// The longest trace accepted: about 11.5 days of seconds.
pub const MAX_SECONDS: u64 = 1_000_000;

/// Parses a trace: a header `second,concurrency`, then one row per second with the offered
/// concurrency (>= 0). Seconds start at 0 or later and strictly increase; seconds missing in
/// between offer 0. Blank lines and lines starting with `#` are skipped. Returns the offered
/// concurrency of every second from 0 to the last one.
pub fn parse(text: &str) -> Result<Vec<f64>, String> {
    let mut lines = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'));
    match lines.next() {
        Some((_, header)) if header.replace(' ', "") == "second,concurrency" => {}
        Some((n, other)) => {
            return Err(format!(
                "line {n}: expected the header `second,concurrency`, got `{other}`"
            ));
        }
        None => return Err("empty trace".into()),
    }
    let mut offered = Vec::new();
    for (n, line) in lines {
        let (second, concurrency) = line
            .split_once(',')
            .ok_or_else(|| format!("line {n}: expected `second,concurrency`"))?;
        let second: u64 = second
            .trim()
            .parse()
            .map_err(|_| format!("line {n}: second `{}` is not a whole number", second.trim()))?;
        let concurrency: f64 = concurrency.trim().parse().map_err(|_| {
            format!(
                "line {n}: concurrency `{}` is not a number",
                concurrency.trim()
            )
        })?;
        if !concurrency.is_finite() || concurrency < 0.0 {
            return Err(format!(
                "line {n}: concurrency must be a finite number >= 0"
            ));
        }
        if concurrency > crate::stats::MAX_STAT_CONCURRENCY {
            return Err(format!(
                "line {n}: concurrency {concurrency} is above the ceiling of one stat ({})",
                crate::stats::MAX_STAT_CONCURRENCY
            ));
        }
        if second >= MAX_SECONDS {
            return Err(format!(
                "line {n}: traces are limited to {MAX_SECONDS} seconds"
            ));
        }
        let index =
            usize::try_from(second).map_err(|_| format!("line {n}: second out of range"))?;
        if index < offered.len() {
            return Err(format!(
                "line {n}: second {second} is not after the previous row"
            ));
        }
        offered.resize(index, 0.0);
        offered.push(concurrency);
    }
    if offered.is_empty() {
        return Err("the trace has no rows".into());
    }
    Ok(offered)
}

/// The per-second CSV: `second,desired,ready,panic,excess_burst_capacity,activator_in_path,waiting`
/// (booleans as 0/1).
pub fn to_csv(rows: &[Row]) -> String {
    let mut out = String::with_capacity(rows.len() * 24 + 80);
    out.push_str("second,desired,ready,panic,excess_burst_capacity,activator_in_path,waiting\n");
    for r in rows {
        // Writing into a String cannot fail.
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{}",
            r.second,
            r.desired,
            r.ready,
            u8::from(r.panic),
            r.excess_burst_capacity,
            u8::from(r.activator_in_path),
            number(r.waiting),
        );
    }
    out
}

/// A number without trailing zeros (at most 3 decimals).
pub fn number(v: f64) -> String {
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s.is_empty() || s == "-0" {
        "0".into()
    } else {
        s.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fills_gaps_and_rejects_nonsense() {
        let t = parse("# a comment\nsecond,concurrency\n0,1\n1,2.5\n\n4,3\n").unwrap();
        assert_eq!(t, [1.0, 2.5, 0.0, 0.0, 3.0]);
        assert!(parse("s,c\n0,1\n").unwrap_err().contains("header"));
        assert!(
            parse("second,concurrency\n1,1\n1,2\n")
                .unwrap_err()
                .contains("line 3")
        );
        assert!(parse("second,concurrency\n0,-1\n").is_err());
        assert!(parse("second,concurrency\n0,x\n").is_err());
        assert!(parse("second,concurrency\n").is_err());
        // Above one stat's ceiling (the live collector clamps; a trace is refused).
        let e = parse("second,concurrency\n0,1\n1,1e308\n").unwrap_err();
        assert!(e.contains("line 3") && e.contains("ceiling"), "{e}");
        assert!(parse("second,concurrency\n0,1000000\n").is_ok());
    }

    #[test]
    fn numbers_are_short() {
        assert_eq!(number(2.0), "2");
        assert_eq!(number(0.25), "0.25");
        assert_eq!(number(0.0), "0");
        assert_eq!(number(1.23456), "1.235");
    }
}
