//! Quartz spellings croner lacks, read as Quartz 2.5.2 (`CronExpression`) reads them:
//! year steps counted from 1970, ranges that wrap around the end of their field
//! (`FRI-MON`, `22-2`, `NOV-FEB`, `30-2`), and `L-n` / `L-nW` in the day of month. The
//! first two become text croner reads the same way; `L-n` is a day rule croner cannot
//! express, applied by `CronSchedule` over croner's every-day search. The tests in
//! `cron` compare each with a table of Quartz's own answers.

use chrono::{Datelike, NaiveDate, Weekday};

use super::{CronError, DAY_NAMES, FieldKind, MONTH_NAMES, syntax};

/// Quartz refuses a larger offset from the last day.
const MAX_LAST_DAY_OFFSET: u32 = 30;

/// Quartz counts a year field's steps from its first year.
const QUARTZ_FIRST_YEAR: u32 = 1970;

/// The day of month `L-n` names: `n` days before the month's last (`L-0` is the last),
/// or with `W` the weekday nearest that day within the month. A month of `n` days or
/// fewer has none (Quartz skips it too).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct LastDayOffset {
    days: u32,
    weekday: bool,
}

impl LastDayOffset {
    /// `L-n` or `L-nW` (any case) as the whole day-of-month field; `None` for a field
    /// without `L-`. Quartz also takes `L-n` as one item of a list; Sundial refuses that
    /// rather than half-support it.
    pub(super) fn parse(field: &str) -> Result<Option<Self>, CronError> {
        let upper = field.to_ascii_uppercase();
        if !upper.contains("L-") {
            return Ok(None);
        }
        let refuse = |why: &str| {
            Err(syntax(format!(
                "day-of-month field {field:?}: {why}; 'L-n' (n days before the last day \
                 of the month, 0 to {MAX_LAST_DAY_OFFSET}) or 'L-nW' (the weekday nearest it) \
                 must be the whole field"
            )))
        };
        let Some(rest) = upper.strip_prefix("L-") else {
            return refuse("'L-' must start the field");
        };
        let (digits, weekday) = match rest.strip_suffix('W') {
            Some(d) => (d, true),
            None => (rest, false),
        };
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return refuse("'L-' must be followed by a number and nothing else");
        }
        match digits.parse::<u32>() {
            Ok(days) if days <= MAX_LAST_DAY_OFFSET => Ok(Some(LastDayOffset { days, weekday })),
            _ => refuse("the offset from the last day is past 30"),
        }
    }

    /// The day of `year`-`month` this names, if the month has it.
    pub(super) fn day(self, year: i32, month: u32) -> Option<u32> {
        let first = NaiveDate::from_ymd_opt(year, month, 1)?;
        let last = first
            .checked_add_months(chrono::Months::new(1))?
            .pred_opt()?
            .day();
        let day = last.checked_sub(self.days).filter(|d| *d >= 1)?;
        if !self.weekday {
            return Some(day);
        }
        // Quartz's W: a Saturday moves to the Friday before, a Sunday to the Monday
        // after, each staying inside the month.
        Some(match first.with_day(day)?.weekday() {
            Weekday::Sat if day == 1 => 3,
            Weekday::Sat => day - 1,
            Weekday::Sun if day == last => day - 2,
            Weekday::Sun => day + 1,
            _ => day,
        })
    }
}

/// How a field's values go round (every field but the year): after its greatest value
/// comes its least.
struct Circle {
    min: u32,
    max: u32,
}

fn circle(kind: FieldKind) -> Option<Circle> {
    let (min, max) = match kind {
        FieldKind::Second | FieldKind::Minute => (0, 59),
        FieldKind::Hour => (0, 23),
        FieldKind::DayOfMonth => (1, 31),
        FieldKind::Month => (1, 12),
        // Quartz numbering: 1 = Sunday.
        FieldKind::DayOfWeek => (1, 7),
        FieldKind::Year => return None,
    };
    Some(Circle { min, max })
}

/// A value of `kind` as a number (Quartz numbering), or None if it is not one.
fn value(kind: FieldKind, text: &str) -> Option<u32> {
    if let Ok(n) = text.parse::<u32>() {
        return Some(n);
    }
    let upper = text.to_ascii_uppercase();
    let names = match kind {
        FieldKind::Month => MONTH_NAMES,
        FieldKind::DayOfWeek => DAY_NAMES,
        _ => return None,
    };
    let i = names.iter().position(|n| *n == upper)?;
    u32::try_from(i).ok().map(|i| i + 1)
}

/// One field of a 6- or 7-field (Quartz) line as croner should read it: a year step
/// without a start (`*/2`, `/2`) starts at 1970, and a range whose start is past its
/// end wraps around the field (`22-2` is 22, 23, 0, 1, 2; with a step, counted on
/// from the start across the wrap, as Quartz does).
pub(super) fn quartz_field(kind: FieldKind, field: &str) -> Result<String, CronError> {
    let items: Vec<String> = field
        .split(',')
        .map(|item| quartz_item(kind, field, item))
        .collect::<Result<_, _>>()?;
    Ok(items.join(","))
}

fn quartz_item(kind: FieldKind, field: &str, item: &str) -> Result<String, CronError> {
    let (range, step) = match item.split_once('/') {
        Some((r, s)) => (r, Some(s)),
        None => (item, None),
    };
    if kind == FieldKind::Year
        && let Some(step) = step.filter(|_| range.is_empty() || range == "*")
    {
        return Ok(format!("{QUARTZ_FIRST_YEAR}/{step}"));
    }
    let Some((from, to)) = range.split_once('-') else {
        return Ok(item.to_owned());
    };
    let (Some(from), Some(to)) = (value(kind, from), value(kind, to)) else {
        // Not two values: croner names what is wrong.
        return Ok(item.to_owned());
    };
    if from <= to {
        return Ok(item.to_owned());
    }
    let Some(c) = circle(kind) else {
        return Err(syntax(format!(
            "{} field {field:?}: range {item:?} starts after it ends (a year range does not \
             wrap around)",
            kind.name()
        )));
    };
    let step = match step.map(str::parse::<u32>) {
        None => 1,
        Some(Ok(s)) if s >= 1 => s,
        // A step croner will refuse by itself, naming it.
        Some(_) => return Ok(item.to_owned()),
    };
    if from > c.max || to < c.min {
        return Ok(item.to_owned());
    }
    let size = c.max - c.min + 1;
    let mut values = Vec::new();
    let mut i = from;
    while i <= to + size {
        values.push(c.min + (i - c.min) % size);
        i += step;
    }
    Ok(values
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(","))
}

/// A 5-field (POSIX) line has no wrap-around ranges: refused with the reason, naming
/// the dialects that have them.
pub(super) fn posix_field(kind: FieldKind, field: &str) -> Result<(), CronError> {
    for item in field.split(',') {
        let range = item.split_once('/').map_or(item, |(r, _)| r);
        let Some((from, to)) = range.split_once('-') else {
            continue;
        };
        // POSIX numbers Sunday 0 (and 7: croner reads `-SUN` as `-7`).
        let day = |text: &str| DAY_NAMES.iter().position(|d| d.eq_ignore_ascii_case(text));
        let (from, to) = match kind {
            FieldKind::DayOfWeek => (
                day(from).map_or_else(|| value(kind, from), |d| u32::try_from(d).ok()),
                day(to).map_or_else(
                    || value(kind, to),
                    |d| Some(if d == 0 { 7 } else { d as u32 }),
                ),
            ),
            _ => (value(kind, from), value(kind, to)),
        };
        if let (Some(from), Some(to)) = (from, to)
            && from > to
        {
            return Err(syntax(format!(
                "{} field {field:?}: range {item:?} starts after it ends; ranges that wrap \
                 around (such as FRI-MON) are read only in the 6- and 7-field (Quartz) \
                 dialects",
                kind.name()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use chrono::{DateTime, Utc};

    use super::super::{CronError, CronSchedule};

    fn ms(rfc3339: &str) -> i64 {
        DateTime::parse_from_rfc3339(rfc3339)
            .expect("a test instant")
            .with_timezone(&Utc)
            .timestamp_millis()
    }

    /// Quartz 2.5.2's answers: `new CronExpression(expr)` in UTC, `getTimeAfter` from
    /// the start, then from each answer (a small Java program against
    /// org.quartz-scheduler:quartz:2.5.2 from Maven Central printed them).
    const QUARTZ: &[(&str, &str, &[&str])] = &[
        (
            "0 0 0 1 1 ? */2",
            "2026-12-04T00:00:00Z",
            &[
                "2028-01-01T00:00:00Z",
                "2030-01-01T00:00:00Z",
                "2032-01-01T00:00:00Z",
            ],
        ),
        (
            "0 0 0 1 1 ? /3",
            "2026-12-04T00:00:00Z",
            &[
                "2027-01-01T00:00:00Z",
                "2030-01-01T00:00:00Z",
                "2033-01-01T00:00:00Z",
            ],
        ),
        (
            "0 0 0 1 1 ? 2027/2",
            "2026-12-04T00:00:00Z",
            &[
                "2027-01-01T00:00:00Z",
                "2029-01-01T00:00:00Z",
                "2031-01-01T00:00:00Z",
            ],
        ),
        (
            "0 0 12 L-3 * ?",
            "2026-12-04T00:00:00Z",
            &[
                "2026-12-28T12:00:00Z",
                "2027-01-28T12:00:00Z",
                "2027-02-25T12:00:00Z",
                "2027-03-28T12:00:00Z",
            ],
        ),
        (
            "0 0 12 L-3 * ?",
            "2028-01-30T00:00:00Z",
            &[
                "2028-02-26T12:00:00Z",
                "2028-03-28T12:00:00Z",
                "2028-04-27T12:00:00Z",
            ],
        ),
        (
            "0 0 12 L-0 * ?",
            "2026-12-04T00:00:00Z",
            &[
                "2026-12-31T12:00:00Z",
                "2027-01-31T12:00:00Z",
                "2027-02-28T12:00:00Z",
            ],
        ),
        (
            "0 0 12 L-30 * ?",
            "2026-12-04T00:00:00Z",
            &[
                "2027-01-01T12:00:00Z",
                "2027-03-01T12:00:00Z",
                "2027-05-01T12:00:00Z",
                "2027-07-01T12:00:00Z",
            ],
        ),
        (
            "0 0 12 L-5W * ?",
            "2026-12-04T00:00:00Z",
            &[
                "2026-12-25T12:00:00Z",
                "2027-01-26T12:00:00Z",
                "2027-02-23T12:00:00Z",
                "2027-03-26T12:00:00Z",
                "2027-04-26T12:00:00Z",
                "2027-05-26T12:00:00Z",
            ],
        ),
        (
            "0 0 12 L-1W * ?",
            "2027-01-01T00:00:00Z",
            &[
                "2027-01-29T12:00:00Z",
                "2027-02-26T12:00:00Z",
                "2027-03-30T12:00:00Z",
                "2027-04-29T12:00:00Z",
                "2027-05-31T12:00:00Z",
                "2027-06-29T12:00:00Z",
            ],
        ),
        (
            "0 0 12 ? * FRI-MON",
            "2026-12-04T00:00:00Z",
            &[
                "2026-12-04T12:00:00Z",
                "2026-12-05T12:00:00Z",
                "2026-12-06T12:00:00Z",
                "2026-12-07T12:00:00Z",
                "2026-12-11T12:00:00Z",
                "2026-12-12T12:00:00Z",
            ],
        ),
        (
            "0 0 22-2 * * ?",
            "2026-12-04T00:00:00Z",
            &[
                "2026-12-04T01:00:00Z",
                "2026-12-04T02:00:00Z",
                "2026-12-04T22:00:00Z",
                "2026-12-04T23:00:00Z",
                "2026-12-05T00:00:00Z",
                "2026-12-05T01:00:00Z",
            ],
        ),
        (
            "0 0 22-2/2 * * ?",
            "2026-12-04T00:00:00Z",
            &[
                "2026-12-04T02:00:00Z",
                "2026-12-04T22:00:00Z",
                "2026-12-05T00:00:00Z",
                "2026-12-05T02:00:00Z",
            ],
        ),
        (
            "0 0 0 1 NOV-FEB ?",
            "2026-12-04T00:00:00Z",
            &[
                "2027-01-01T00:00:00Z",
                "2027-02-01T00:00:00Z",
                "2027-11-01T00:00:00Z",
                "2027-12-01T00:00:00Z",
                "2028-01-01T00:00:00Z",
            ],
        ),
        (
            "0 0 0 30-2 * ?",
            "2026-12-04T00:00:00Z",
            &[
                "2026-12-30T00:00:00Z",
                "2026-12-31T00:00:00Z",
                "2027-01-01T00:00:00Z",
                "2027-01-02T00:00:00Z",
                "2027-01-30T00:00:00Z",
                "2027-01-31T00:00:00Z",
            ],
        ),
        (
            "0 50-10/5 * * * ?",
            "2026-12-04T00:00:00Z",
            &[
                "2026-12-04T00:05:00Z",
                "2026-12-04T00:10:00Z",
                "2026-12-04T00:50:00Z",
                "2026-12-04T00:55:00Z",
                "2026-12-04T01:00:00Z",
                "2026-12-04T01:05:00Z",
            ],
        ),
        (
            "0 0 0 ? * SAT-SUN",
            "2026-12-04T00:00:00Z",
            &[
                "2026-12-05T00:00:00Z",
                "2026-12-06T00:00:00Z",
                "2026-12-12T00:00:00Z",
                "2026-12-13T00:00:00Z",
            ],
        ),
        (
            "0 0 0 ? * 7-1",
            "2026-12-04T00:00:00Z",
            &[
                "2026-12-05T00:00:00Z",
                "2026-12-06T00:00:00Z",
                "2026-12-12T00:00:00Z",
                "2026-12-13T00:00:00Z",
            ],
        ),
    ];

    #[test]
    fn quartz_corners_fire_when_quartz_fires_them() {
        for (expr, from, want) in QUARTZ {
            let s = CronSchedule::parse(expr, "UTC").unwrap_or_else(|e| panic!("{expr}: {e}"));
            let got = s.upcoming(ms(from), want.len());
            let want: Vec<i64> = want.iter().map(|w| ms(w)).collect();
            assert_eq!(got, want, "{expr} from {from}");
        }
    }

    #[test]
    fn l_minus_n_keeps_its_day_in_a_zone() {
        // The second-to-last day of the month at 22:00 in New York (EST, UTC-5) is
        // the next day in UTC: the rule counts the zone's days. November has 30 days,
        // December 31.
        let s = CronSchedule::parse("0 0 22 L-1 * ?", "America/New_York").expect("parse");
        let got = s.upcoming(ms("2026-11-01T00:00:00Z"), 2);
        assert_eq!(
            got,
            [ms("2026-11-30T03:00:00Z"), ms("2026-12-31T03:00:00Z")]
        );
    }

    #[test]
    fn what_quartz_refuses_or_sundial_does_not_take_is_refused_saying_why() {
        let cases: &[(&str, &str)] = &[
            // Quartz: "Start year must be less than stop year".
            ("0 0 0 1 1 ? 2040-2030", "a year range does not wrap around"),
            // Quartz: "Offset from last day must be <= 30".
            ("0 0 0 L-31 * ?", "past 30"),
            // Quartz takes L-n in a list; Sundial does not.
            ("0 0 0 L-3,15 * ?", "must be the whole field"),
            ("0 0 0 L- * ?", "followed by a number"),
            ("0 0 0 3L-2 * ?", "must start the field"),
            (
                "0 0 0 L-3 * MON",
                "must be '?' (or '*') when the day of month is 'L-n'",
            ),
            // The 5-field dialect has no wrap-around ranges.
            (
                "0 9 * * FRI-MON",
                "read only in the 6- and 7-field (Quartz) dialects",
            ),
            (
                "0 22-2 * * *",
                "read only in the 6- and 7-field (Quartz) dialects",
            ),
        ];
        for (expr, why) in cases {
            match CronSchedule::parse(expr, "UTC") {
                Err(CronError::Syntax(msg)) => assert!(msg.contains(why), "{expr}: {msg}"),
                other => panic!("{expr}: {other:?}"),
            }
        }
        // POSIX ranges that only look backwards: SAT-SUN is 6-7 there.
        for ok in ["0 0 * * SAT-SUN", "0 0 L-2 * *", "0 0 L-2W * ?"] {
            CronSchedule::parse(ok, "UTC").unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
    }
}
