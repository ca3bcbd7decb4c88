//! Reading a server's "retry after" hint from an error's text or data: seconds,
//! milliseconds, or an HTTP date.

use std::time::{Duration, SystemTime};

/// Finds a retry-after hint in `text`: `retry after 30`, `Retry-After: 30`, `retry in
/// 250ms`, `retry_after_seconds: 1.5`, `"retryAfter": 2`, or an HTTP date after
/// `Retry-After:`. `now` is the wall clock, for dates.
pub fn parse(text: &str, now: SystemTime) -> Option<Duration> {
    let lower = text.to_ascii_lowercase();
    for key in ["retry-after", "retry_after", "retryafter", "retry after", "retry in", "try again in"] {
        let mut from = 0;
        while let Some(i) = lower[from..].find(key) {
            let start = from + i + key.len();
            from = start;
            let rest = &text[start..];
            // The key may carry a unit in its own name (retry_after_seconds, retryAfterMs).
            let (rest, key_unit) = split_key_unit(rest);
            let rest =
                rest.trim_start_matches(|c: char| c == ':' || c == '=' || c == '"' || c == '\'' || c.is_whitespace());
            if let Some(d) = number_with_unit(rest, key_unit) {
                return Some(d);
            }
            if let Some(d) = http_date(rest, now) {
                return Some(d);
            }
        }
    }
    None
}

fn split_key_unit(rest: &str) -> (&str, Option<Unit>) {
    let lower = rest.to_ascii_lowercase();
    for (suffix, unit) in [
        ("_seconds", Unit::Seconds),
        ("_secs", Unit::Seconds),
        ("_ms", Unit::Millis),
        ("ms", Unit::Millis),
        ("seconds", Unit::Seconds),
    ] {
        if lower.starts_with(suffix) {
            return (&rest[suffix.len()..], Some(unit));
        }
    }
    (rest, None)
}

#[derive(Clone, Copy)]
enum Unit {
    Seconds,
    Millis,
}

fn number_with_unit(rest: &str, key_unit: Option<Unit>) -> Option<Duration> {
    let end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
    let value: f64 = rest[..end].parse().ok()?;
    if !value.is_finite() || value < 0.0 {
        return None;
    }
    let after = rest[end..].trim_start().to_ascii_lowercase();
    let unit = if after.starts_with("ms") || after.starts_with("millisecond") {
        Unit::Millis
    } else if after.starts_with('s') || after.starts_with("sec") {
        Unit::Seconds
    } else if after.starts_with("min") {
        return Some(Duration::from_secs_f64(value * 60.0));
    } else {
        key_unit.unwrap_or(Unit::Seconds)
    };
    Some(match unit {
        Unit::Seconds => Duration::from_secs_f64(value.min(1e9)),
        Unit::Millis => Duration::from_secs_f64((value / 1000.0).min(1e9)),
    })
}

fn http_date(rest: &str, now: SystemTime) -> Option<Duration> {
    // An IMF-fixdate is 29 characters: "Sun, 06 Nov 1994 08:49:37 GMT".
    let candidate = rest.get(..29)?;
    let at = httpdate::parse_http_date(candidate).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str, expect: Option<u64>) {
        let now = httpdate::parse_http_date("Sun, 22 Nov 2026 04:00:00 GMT").unwrap();
        assert_eq!(parse(text, now).map(|d| d.as_millis() as u64), expect, "{text}");
    }

    #[test]
    fn hints() {
        check("429 Too Many Requests. Retry after 30 seconds.", Some(30_000));
        check("Retry-After: 2", Some(2_000));
        check("rate limited, retry in 250ms", Some(250));
        check(r#"{"error": "rate_limited", "retry_after_seconds": 1.5}"#, Some(1_500));
        check(r#"{"retryAfter": 3}"#, Some(3_000));
        check("retry_after_ms=400", Some(400));
        check("Retry-After: Sun, 22 Nov 2026 04:00:10 GMT", Some(10_000));
        check("Retry-After: Sun, 22 Nov 2026 03:00:00 GMT", Some(0));
        check("please try again in 2 min", Some(120_000));
        check("retry later", None);
        check("no hint here", None);
    }
}
