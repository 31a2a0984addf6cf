//! Human byte sizes (`512MiB`, `20GiB`, `1.5GB`, `4096`) and rates (`100MiB/s`).
//!
//! Binary suffixes (`KiB`, `MiB`, ...) are powers of 1024 and decimal ones (`KB`, `MB`, ...)
//! powers of 1000, as a storage admin reads them; a bare `K`/`M`/`G`/`T` is binary, as in
//! `dd` and Slurm. Fractions are allowed (`1.5GiB`) and rounded down to whole bytes.

use thiserror::Error;

/// Why a size or rate could not be read.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SizeError {
    /// The text is not a number with an optional unit.
    #[error("`{0}` is not a size: expected a number with an optional unit such as 512MiB, 20GiB, 1.5GB or 4096")]
    Malformed(String),
    /// The unit is not one of the known ones.
    #[error("`{input}` has an unknown unit `{unit}`: use B, KiB, MiB, GiB, TiB (1024-based) or KB, MB, GB, TB (1000-based)")]
    UnknownUnit { input: String, unit: String },
    /// The value does not fit in 64 bits.
    #[error("`{0}` is too large")]
    Overflow(String),
    /// A rate lacks its `/s`.
    #[error("`{0}` is not a rate: expected a size per second such as 200MiB/s")]
    NotARate(String),
}

/// Parses a byte size.
pub fn parse_size(input: &str) -> Result<u64, SizeError> {
    let s = input.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    if num.is_empty() || num.chars().filter(|&c| c == '.').count() > 1 {
        return Err(SizeError::Malformed(input.to_string()));
    }
    let unit = unit.trim();
    let mult: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "p" | "pib" => 1 << 50,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        "pb" => 1_000_000_000_000_000,
        _ => {
            return Err(SizeError::UnknownUnit {
                input: input.to_string(),
                unit: unit.to_string(),
            })
        }
    };
    if let Some((int, frac)) = num.split_once('.') {
        let int: u64 = if int.is_empty() {
            0
        } else {
            int.parse()
                .map_err(|_| SizeError::Overflow(input.to_string()))?
        };
        let whole = int
            .checked_mul(mult)
            .ok_or_else(|| SizeError::Overflow(input.to_string()))?;
        // Fractions are computed in f64 only for the fractional part, which is < mult.
        let frac: f64 = format!("0.{frac}")
            .parse()
            .map_err(|_| SizeError::Malformed(input.to_string()))?;
        whole
            .checked_add((frac * mult as f64) as u64)
            .ok_or_else(|| SizeError::Overflow(input.to_string()))
    } else {
        num.parse::<u64>()
            .map_err(|_| SizeError::Overflow(input.to_string()))?
            .checked_mul(mult)
            .ok_or_else(|| SizeError::Overflow(input.to_string()))
    }
}

/// Parses a rate such as `200MiB/s` into bytes per second.
pub fn parse_rate(input: &str) -> Result<u64, SizeError> {
    let s = input.trim();
    let body = s
        .strip_suffix("/s")
        .ok_or_else(|| SizeError::NotARate(input.to_string()))?;
    parse_size(body)
}

/// Formats bytes with a binary unit and two decimals (`1.50 GiB`).
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.2} {}", UNITS[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("20GiB").unwrap(), 20 << 30);
        assert_eq!(parse_size("20G").unwrap(), 20 << 30);
        assert_eq!(parse_size("1.5GB").unwrap(), 1_500_000_000);
        assert_eq!(parse_size("1.5KiB").unwrap(), 1536);
        assert_eq!(parse_size(" 3 MiB ").unwrap(), 3 << 20);
    }

    #[test]
    fn bad_sizes() {
        assert!(matches!(parse_size(""), Err(SizeError::Malformed(_))));
        assert!(matches!(parse_size("MiB"), Err(SizeError::Malformed(_))));
        assert!(matches!(parse_size("1.2.3"), Err(SizeError::Malformed(_))));
        assert!(matches!(
            parse_size("12parsecs"),
            Err(SizeError::UnknownUnit { .. })
        ));
        assert!(matches!(
            parse_size("99999999999PiB"),
            Err(SizeError::Overflow(_))
        ));
        assert!(parse_size("-1").is_err());
    }

    #[test]
    fn rates() {
        assert_eq!(parse_rate("200MiB/s").unwrap(), 200 << 20);
        assert!(matches!(parse_rate("200MiB"), Err(SizeError::NotARate(_))));
    }

    #[test]
    fn formatting() {
        assert_eq!(format_bytes(10), "10 B");
        assert_eq!(format_bytes(1536), "1.50 KiB");
    }
}
