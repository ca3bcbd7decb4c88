//! Reading a server's "retry after" hint from an error's text or data: seconds,
//! milliseconds, or an HTTP date.
//!
//! The text comes from a server (or through it, from anyone), so nothing in it can make
//! the parser panic or ask for an unbounded wait: every hint is clamped to [`MAX`].

use std::time::{Duration, SystemTime};

/// The longest wait a hint can ask for. Longer hints are read as this; the engine then
/// finds it past the call's deadline and gives up with the server's own words.
pub const MAX: Duration = Duration::from_secs(24 * 3600);

/// Finds a retry-after hint in `text`: `retry after 30`, `Retry-After: 30`, `retry in
/// 250ms`, `retry_after_seconds: 1.5`, `"retryAfter": 2`, or an HTTP date after
/// `Retry-After:`. `now` is the wall clock, for dates.
pub fn parse(text: &str, now: SystemTime) -> Option<Duration> {
    parse_without(text, now, |_| false)
}

/// [`parse`], passing over the keys `skips` says (a caller's own words, which are not
/// the server's hint).
pub fn parse_without(text: &str, now: SystemTime, skips: impl Fn(&str) -> bool) -> Option<Duration> {
    // A hint is near the start of what a server says; reading a bounded prefix keeps a
    // huge error text from costing more than a bounded scan.
    let text = prefix(text, SCAN_BYTES);
    let lower = text.to_ascii_lowercase();
    for key in KEYS.into_iter().filter(|key| !skips(key)) {
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

/// What introduces a hint, in lower case.
pub const KEYS: [&str; 6] = ["retry-after", "retry_after", "retryafter", "retry after", "retry in", "try again in"];

/// How much of a text is searched for a hint.
const SCAN_BYTES: usize = 64 << 10;

/// `text` cut to at most `max` bytes, on a character boundary.
fn prefix(text: &str, max: usize) -> &str {
    &text[..text.floor_char_boundary(max)]
}

fn split_key_unit(rest: &str) -> (&str, Option<Unit>) {
    // The longest unit suffix is 8 bytes: lowercase no more than that, per key found.
    let lower = prefix(rest, 16).to_ascii_lowercase();
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
    // Digits past f64's range parse as infinity, which `seconds` clamps.
    let value: f64 = rest[..end].parse().ok()?;
    let after = prefix(rest[end..].trim_start(), 16).to_ascii_lowercase();
    let unit = if after.starts_with("ms") || after.starts_with("millisecond") {
        Unit::Millis
    } else if after.starts_with('s') || after.starts_with("sec") {
        Unit::Seconds
    } else if after.starts_with("min") {
        return Some(seconds(value * 60.0));
    } else {
        key_unit.unwrap_or(Unit::Seconds)
    };
    Some(match unit {
        Unit::Seconds => seconds(value),
        Unit::Millis => seconds(value / 1000.0),
    })
}

/// `secs` as a duration, clamped to `[0, MAX]` (infinite and NaN included).
fn seconds(secs: f64) -> Duration {
    if secs.is_nan() || secs <= 0.0 {
        return Duration::ZERO;
    }
    Duration::from_secs_f64(secs.min(MAX.as_secs_f64()))
}

fn http_date(rest: &str, now: SystemTime) -> Option<Duration> {
    // An IMF-fixdate is 29 characters: "Sun, 06 Nov 1994 08:49:37 GMT".
    let candidate = rest.get(..29)?;
    let at = httpdate::parse_http_date(candidate).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO).min(MAX))
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

    #[test]
    fn absurd_hints_are_clamped() {
        let day = MAX.as_millis() as u64;
        check("try again in 99999999999999999999999 min", Some(day));
        check("retry after 1e400", Some(1_000)); // read as `1`, then text
        check(&format!("retry after {}", "9".repeat(400)), Some(day));
        check("Retry-After: Fri, 31 Dec 9999 23:59:59 GMT", Some(day));
        check("retry_after_ms=99999999999999999999999999", Some(day));
    }

    proptest::proptest! {
        #[test]
        fn never_panics_and_never_exceeds_the_cap(text in ".{0,200}", n in proptest::num::f64::ANY, unit in "(ms|s|min|seconds|)") {
            let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
            for t in [text.clone(), format!("retry after {n}{unit}"), format!("try again in {text} {n} {unit}")] {
                if let Some(d) = parse(&t, now) {
                    proptest::prop_assert!(d <= MAX, "{t}: {d:?}");
                }
            }
        }
    }
}
