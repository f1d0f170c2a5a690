//! Quantities as people write them in cluster configs: `400Gbps`, `1.5us`, `32MiB`. A number
//! without a unit, or with a unit of the wrong kind, is an error that lists the units allowed
//! (a bare `400` could be bits, bytes or gigabits: no silent defaults).

use std::fmt;

/// A quantity that could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitError {
    /// What was given.
    pub given: String,
    /// The kind of quantity wanted (bandwidth, time, bytes).
    pub kind: &'static str,
    /// The units allowed.
    pub allowed: &'static str,
}

impl fmt::Display for UnitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} is not a {}: write a number and one of {}",
            self.given, self.kind, self.allowed
        )
    }
}

impl std::error::Error for UnitError {}

fn split(s: &str) -> Option<(f64, String)> {
    let s = s.trim();
    let at = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(at);
    let v: f64 = num.replace('_', "").parse().ok()?;
    (v.is_finite() && v >= 0.0).then(|| (v, unit.trim().to_string()))
}

fn parse(
    s: &str,
    kind: &'static str,
    allowed: &'static str,
    units: &[(&str, f64)],
) -> Result<f64, UnitError> {
    let err = || UnitError {
        given: s.to_string(),
        kind,
        allowed,
    };
    let (v, unit) = split(s).ok_or_else(err)?;
    units
        .iter()
        .find(|(u, _)| *u == unit)
        .map(|(_, scale)| v * scale)
        .ok_or_else(err)
}

/// A bandwidth in bits per second: `400Gbps`, `400 Gb/s`, `100Mbps`, `1.6Tbps`.
pub fn parse_bandwidth(s: &str) -> Result<f64, UnitError> {
    parse(
        s,
        "bandwidth",
        "bps, Kbps, Mbps, Gbps, Tbps (or b/s, Kb/s, Mb/s, Gb/s, Tb/s)",
        &[
            ("bps", 1.0),
            ("b/s", 1.0),
            ("Kbps", 1e3),
            ("Kb/s", 1e3),
            ("Mbps", 1e6),
            ("Mb/s", 1e6),
            ("Gbps", 1e9),
            ("Gb/s", 1e9),
            ("Tbps", 1e12),
            ("Tb/s", 1e12),
        ],
    )
}

/// A time in seconds: `1us`, `500ns`, `2.5ms`, `1s` (`µs` too).
pub fn parse_time(s: &str) -> Result<f64, UnitError> {
    parse(
        s,
        "time",
        "ns, us (µs), ms, s",
        &[
            ("ns", 1e-9),
            ("us", 1e-6),
            ("µs", 1e-6),
            ("ms", 1e-3),
            ("s", 1.0),
        ],
    )
}

/// A size in bytes: `4KB`, `1MiB`, `32MB`, `1GiB`, `512B` (decimal KB/MB/GB/TB, binary
/// KiB/MiB/GiB/TiB).
pub fn parse_bytes(s: &str) -> Result<u64, UnitError> {
    let v = parse(
        s,
        "size",
        "B, KB, MB, GB, TB, KiB, MiB, GiB, TiB",
        &[
            ("B", 1.0),
            ("KB", 1e3),
            ("MB", 1e6),
            ("GB", 1e9),
            ("TB", 1e12),
            ("KiB", 1024.0),
            ("MiB", 1024.0 * 1024.0),
            ("GiB", 1024.0 * 1024.0 * 1024.0),
            ("TiB", 1024.0 * 1024.0 * 1024.0 * 1024.0),
        ],
    )?;
    if v.fract() != 0.0 || v > u64::MAX as f64 {
        return Err(UnitError {
            given: s.to_string(),
            kind: "whole number of bytes",
            allowed: "B, KB, MB, GB, TB, KiB, MiB, GiB, TiB",
        });
    }
    Ok(v as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_people_write() {
        assert_eq!(parse_bandwidth("400Gbps").unwrap(), 400e9);
        assert_eq!(parse_bandwidth("100 Gb/s").unwrap(), 100e9);
        assert_eq!(parse_bandwidth("1.6Tbps").unwrap(), 1.6e12);
        assert_eq!(parse_time("1us").unwrap(), 1e-6);
        assert!((parse_time("500ns").unwrap() - 5e-7).abs() < 1e-18);
        assert_eq!(parse_bytes("1MiB").unwrap(), 1 << 20);
        assert_eq!(parse_bytes("32MB").unwrap(), 32_000_000);
        assert_eq!(parse_bytes("1_024B").unwrap(), 1024);
    }

    #[test]
    fn unit_mistakes_are_errors_that_list_the_units() {
        for bad in ["400", "400GB", "fast", "-1Gbps", "400 gbps", ""] {
            let e = parse_bandwidth(bad).unwrap_err();
            assert!(e.to_string().contains("Gbps"), "{bad}: {e}");
        }
        assert!(parse_time("1Gbps").is_err());
        assert!(parse_bytes("1.5B").is_err());
        assert!(parse_bytes("1us").unwrap_err().to_string().contains("MiB"));
    }
}
