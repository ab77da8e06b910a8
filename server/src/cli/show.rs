//! How the client prints answers: tables of aligned columns (comfy-table, no borders),
//! blocks of `key: value` lines, times in a job's zone, durations and state names; and,
//! with `-o json`, one document in the proto's canonical JSON mapping.

use chrono::TimeZone as _;
use comfy_table::{Table, presets};
use serde::Serialize;

use super::{Failure, Result};

/// Writes one line on stdout (see `say!`): a closed pipe ends the process with
/// success, any other write error with failure.
pub fn line(args: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    if let Err(e) = writeln!(out, "{args}") {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: cannot write the answer: {e}");
        std::process::exit(1);
    }
}

/// Prints `value` as pretty JSON on stdout.
pub fn json<T: Serialize + ?Sized>(value: &T) -> Result<()> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| Failure::usage(format!("cannot print the answer as JSON: {e}")))?;
    say!("{text}");
    Ok(())
}

/// Prints rows under a header, columns aligned, two spaces apart.
pub fn table(header: &[&str], rows: impl IntoIterator<Item = Vec<String>>) {
    let mut t = Table::new();
    t.load_preset(presets::NOTHING).set_header(header.to_vec());
    for row in rows {
        t.add_row(row);
    }
    for column in t.column_iter_mut() {
        column.set_padding((0, 2));
    }
    for line in t.lines() {
        say!("{}", line.trim_end());
    }
}

/// Prints `key: value` lines with the values aligned; empty values are left out.
pub fn fields(pairs: &[(&str, String)]) {
    let width = pairs.iter().map(|(k, _)| k.len()).max().unwrap_or(0) + 1;
    for (key, value) in pairs.iter().filter(|(_, v)| !v.is_empty()) {
        say!("{:<width$} {value}", format!("{key}:"));
    }
}

/// An epoch-ms time on the wall clock of the IANA zone `zone` (UTC if the zone is
/// empty or unknown), with the zone's abbreviation; "-" for 0 (unset).
pub fn time_in(ms: i64, zone: &str) -> String {
    if ms == 0 {
        return "-".to_owned();
    }
    formatted(ms, zone, "%Y-%m-%d %H:%M:%S %Z")
}

/// A time with milliseconds, for log lines.
pub fn precise_time_in(ms: i64, zone: &str) -> String {
    formatted(ms, zone, "%Y-%m-%d %H:%M:%S%.3f %Z")
}

fn formatted(ms: i64, zone: &str, format: &str) -> String {
    let tz: chrono_tz::Tz = zone.parse().unwrap_or(chrono_tz::UTC);
    match tz.timestamp_millis_opt(ms).single() {
        Some(t) => t.format(format).to_string(),
        None => format!("{ms} ms"),
    }
}

/// How long from `start` to `end` (epoch ms): "850ms", "12.3s", "4m 10s"; "-" when
/// either is unset.
pub fn duration(start: i64, end: i64) -> String {
    if start == 0 || end == 0 || end < start {
        return "-".to_owned();
    }
    let ms = end - start;
    match ms {
        0..1_000 => format!("{ms}ms"),
        1_000..60_000 => format!("{:.1}s", ms as f64 / 1000.0),
        _ => humantime::format_duration(std::time::Duration::from_secs((ms / 1000) as u64))
            .to_string(),
    }
}

/// An enum value's name without its prefix, in lower case: `RUN_STATE_SUCCEEDED` →
/// `succeeded`.
pub fn short(name: &str, prefix: &str) -> String {
    name.strip_prefix(prefix)
        .unwrap_or(name)
        .to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_shown_in_the_zone_and_durations_in_units() {
        // 2030-03-31T01:00:00Z is 03:00 CEST, just after Berlin's spring-forward gap.
        assert_eq!(
            time_in(1_901_149_200_000, "Europe/Berlin"),
            "2030-03-31 03:00:00 CEST"
        );
        assert_eq!(
            time_in(1_901_149_200_000, "nowhere"),
            "2030-03-31 01:00:00 UTC"
        );
        assert_eq!(time_in(0, "UTC"), "-");
        assert_eq!(duration(1_000, 1_850), "850ms");
        assert_eq!(duration(1_000, 13_300), "12.3s");
        assert_eq!(duration(0, 250_000), "-");
        assert_eq!(duration(1_000, 251_000), "4m 10s");
        assert_eq!(short("RUN_STATE_SUCCEEDED", "RUN_STATE_"), "succeeded");
    }
}
