//! Sizes and durations as people write them (`64MiB`, `1.5GiB`, `500ms`), in the one form
//! the server's configuration, the client's environment variables and the command line all
//! read and print.

use std::time::Duration;

/// Parses a size such as `16GiB`, `512 MiB`, `64KiB`, `2GB`, `1.5GiB` or a plain byte count
/// (binary and decimal units, case-insensitive). `None` for anything else, negatives
/// included.
pub fn parse_size(text: &str) -> Option<u64> {
    let (number, unit) = number_and_unit(text)?;
    let multiplier: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "kib" => 1 << 10,
        "m" | "mb" => 1_000_000,
        "mib" => 1 << 20,
        "g" | "gb" => 1_000_000_000,
        "gib" => 1 << 30,
        "t" | "tb" => 1_000_000_000_000,
        "tib" => 1 << 40,
        _ => return None,
    };
    let bytes = number * multiplier as f64;
    (bytes.is_finite() && bytes >= 0.0 && bytes <= u64::MAX as f64).then_some(bytes as u64)
}

/// `1.5GiB` → `(1.5, "GiB")`: the leading decimal number and what follows it, trimmed.
fn number_and_unit(text: &str) -> Option<(f64, &str)> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    Some((number.parse().ok()?, unit.trim()))
}

/// `8388608` → `8MiB`: the largest binary unit that divides `bytes` exactly, so that
/// [`parse_size`] reads it back to the same number.
pub fn format_size(bytes: u64) -> String {
    for (shift, unit) in [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if bytes != 0 && bytes.is_multiple_of(1u64 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// `1.5 MiB`-style sizes for people (binary units, one decimal).
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Parses `2s`, `500ms`, `1.5s`, `1m`, `1h` or a bare number of seconds. `None` for
/// anything else, zero included (no setting of ours means "never" by zero).
pub fn parse_duration(text: &str) -> Option<Duration> {
    let (value, unit) = number_and_unit(text)?;
    let seconds = match unit {
        "" | "s" => value,
        "ms" => value / 1000.0,
        "m" | "min" => value * 60.0,
        "h" => value * 3600.0,
        _ => return None,
    };
    Duration::try_from_secs_f64(seconds)
        .ok()
        .filter(|d| !d.is_zero())
}

/// `2s`, `500ms`: a duration as [`parse_duration`] reads it back.
pub fn format_duration(duration: Duration) -> String {
    if duration.subsec_nanos() == 0 {
        format!("{}s", duration.as_secs())
    } else {
        format!("{}ms", duration.as_millis())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_like_biopb() {
        assert_eq!(parse_size("16GiB"), Some(16 << 30));
        assert_eq!(parse_size("512 MiB"), Some(512 << 20));
        assert_eq!(parse_size("64kib"), Some(64 << 10));
        assert_eq!(parse_size("2GB"), Some(2_000_000_000));
        assert_eq!(parse_size("1.5GiB"), Some(3 << 29));
        assert_eq!(parse_size("12345"), Some(12345));
        assert_eq!(parse_size("0"), Some(0));
        assert_eq!(parse_size("-1"), None);
        assert_eq!(parse_size("lots"), None);
        assert_eq!(parse_size("5 parsecs"), None);
    }

    #[test]
    fn exact_sizes_read_back() {
        for bytes in [
            0,
            1,
            1000,
            1 << 10,
            3 << 20,
            (8 << 20) + 1,
            5 << 30,
            2 << 40,
        ] {
            assert_eq!(parse_size(&format_size(bytes)), Some(bytes), "{bytes}");
        }
        assert_eq!(format_size(8 << 20), "8MiB");
    }

    #[test]
    fn human_sizes_have_one_decimal() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(2048), "2.0 KiB");
        assert_eq!(human_bytes(3 << 20), "3.0 MiB");
        assert_eq!(human_bytes(10 << 30), "10.0 GiB");
    }

    #[test]
    fn durations_parse_and_read_back() {
        assert_eq!(parse_duration("2s"), Some(Duration::from_secs(2)));
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1m"), Some(Duration::from_secs(60)));
        assert_eq!(parse_duration("7"), Some(Duration::from_secs(7)));
        assert_eq!(parse_duration("0s"), None);
        assert_eq!(parse_duration("soon"), None);
        for d in [Duration::from_secs(60), Duration::from_millis(250)] {
            assert_eq!(parse_duration(&format_duration(d)), Some(d));
        }
    }
}
