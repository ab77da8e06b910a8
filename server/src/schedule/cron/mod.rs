//! Cron expressions: parsing in Sundial's one fixed croner configuration, per-job IANA time zones, and the next fire times (epoch ms).
//!
//! # Dialect
//!
//! The number of fields picks the dialect; nothing else does, so one string
//! always means the same schedule:
//!
//! | fields | layout                              | day-of-week numbering        |
//! |--------|-------------------------------------|------------------------------|
//! | 5      | `min hour dom month dow`            | POSIX: 0-7, 0 and 7 = Sunday |
//! | 6      | `sec min hour dom month dow`        | Quartz: 1 = Sunday … 7 = Sat |
//! | 7      | `sec min hour dom month dow year`   | Quartz                       |
//!
//! All dialects accept croner's `L`, `W`, `LW` (day of month), `#n`, `nL`
//! (day of week) and month/day names. The Quartz dialects also accept a bare
//! start with a step (`0/5`), because Quartz defines it; the POSIX dialect
//! keeps croner's strict OCPS reading and rejects it (the Quartz dialects
//! also read croner's `/5` as `*/5`). The year field (croner
//! parses it natively) takes `*`, `?`, `2030`, `2030-2035`, `2030,2032`,
//! `2030/2` and `2030-2040/2`, within croner's range 1-5000.
//!
//! Quartz spellings croner lacks are read as Quartz 2.5.2 reads them ([`quartz`]): a
//! year step without a start counts from 1970 (`*/2` is the even years), a range
//! whose start is past its end wraps around in the Quartz dialects (`FRI-MON`, `22-2`,
//! `NOV-FEB`; refused, saying so, in the POSIX one), and `L-n` / `L-nW` as the whole
//! day-of-month field (every dialect) is n days before the month's last, or the
//! weekday nearest it.
//!
//! Sundial refuses a few spellings croner would otherwise take, because they
//! are surprising rather than useful: croner's `+` (AND) prefix on the
//! day-of-week field (it would make the day semantics vary per line), letters
//! outside the day/month names and `L`/`W` (croner replaces names across the
//! whole string, so `MON` in the minute field would silently mean minute 1),
//! `?` anywhere but as a whole day or year field, empty list items (`1,,2`
//! would leave a field with no value and turn the search into a crawl), a bare
//! `L` as a day of week (croner accepts it but it never matches), and non-ASCII
//! text (Unicode upper-casing can turn e.g. `ſun` into `SUN`).
//!
//! # Day of month and day of week
//!
//! Sundial uses croner's default (legacy, Vixie-compatible) rule, the same in
//! every dialect:
//!
//! * a field that is exactly `*` or `?` does not restrict the day;
//! * if only one of the two fields restricts the day, it alone decides;
//! * if both restrict it, a day fires when **either** matches (OR), so
//!   `0 0 13 * 5` runs on every 13th and on every Friday.
//!
//! Quartz forbids restricting both (it requires `?` in one of them), so every
//! valid Quartz expression means the same thing here. Unlike Vixie cron, a
//! stepped wildcard such as `*/2` counts as a restriction, because croner only
//! treats the literal `*`/`?` as unrestricted.
//!
//! # Daylight saving time
//!
//! Expressions are evaluated on the wall clock of the job's zone and reported
//! as UTC epoch milliseconds. Lines fall in two classes (as in Vixie cron):
//!
//! * **Fixed-time**: neither the minute nor the hour field holds `*` or `/`
//!   (e.g. `30 2 * * *`, `0 9,17 * * *`; the seconds field does not count). A wall time that a spring-forward
//!   gap skips fires once, at the first real instant after the gap; a wall
//!   time that a fall-back overlap repeats fires once, on its first pass.
//!   Several skipped wall times of one line collapse into one fire.
//! * **Interval**: the minute or hour field holds `*` or `/` (e.g.
//!   `*/15 * * * *`, `0 * * * *`). The line keeps its real-time cadence:
//!   skipped wall times do not fire, repeated ones fire on both passes.
//!
//! Croner implements the interval behaviour itself, so interval lines use its
//! zoned search directly. Croner's own fixed-time rule only covers lines whose
//! second, minute and hour are each a single value; a list such as
//! `0 2,14 * * *` would lose its 02:00 run on a spring-forward day and repeat
//! a 01:00 run on a fall-back day. So fixed-time lines are evaluated here:
//! croner finds the matching wall times (on a zone-less clock) and this module
//! maps each to its instant with the rule above.

use chrono::{DateTime, Datelike, LocalResult, NaiveDateTime, TimeDelta, TimeZone, Utc};
use chrono_tz::Tz;
use croner::errors::CronError as CronerError;
use croner::parser::{CronParser, Seconds, Year};
use croner::{Cron, JobType};

mod quartz;

use quartz::LastDayOffset;

/// Why an expression or time zone was refused.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum CronError {
    /// Unparsable expression, wrong field count, etc.; the message says why.
    #[error("cron: {0}")]
    Syntax(String),
    #[error("time_zone: unknown IANA time zone {0:?}")]
    UnknownTimeZone(String),
    /// The expression is valid but has no fire after the time of parsing.
    #[error("cron: expression never fires")]
    NeverFires,
}

impl CronError {
    /// Why, without the field's name (an API puts its own field path in front).
    pub fn reason(&self) -> String {
        match self {
            CronError::Syntax(why) => why.clone(),
            CronError::UnknownTimeZone(zone) => format!("unknown IANA time zone {zone:?}"),
            CronError::NeverFires => "expression never fires".to_owned(),
        }
    }

    /// The request field the error belongs to, so an API can point at it.
    pub fn field(&self) -> &'static str {
        match self {
            CronError::UnknownTimeZone(_) => "time_zone",
            CronError::Syntax(_) | CronError::NeverFires => "cron",
        }
    }
}

/// A parsed cron expression bound to the IANA zone it is evaluated in.
#[derive(Clone, Debug)]
pub struct CronSchedule {
    cron: Cron,
    tz: Tz,
    expr: String,
    /// Whether DST gaps and overlaps use the fixed-time rule (see module docs).
    fixed_time: bool,
    /// `L-n` in the day of month: croner searches every day and this picks the one.
    last_day: Option<LastDayOffset>,
}

/// 0001-01-01T00:00:00Z: croner has no year before 1, so an earlier start
/// searches the same as this one (less two days, so every zone's local year 1
/// is still ahead of it).
const MIN_SEARCH_MS: i64 = -62_135_596_800_000 - 2 * 86_400_000;
/// 5001-01-01T00:00:00Z: croner searches no further than year 5000, and
/// stopping here keeps chrono's zone conversions far from its own limits.
const MAX_SEARCH_MS: i64 = 95_649_120_000_000;

/// How far the DST helpers look for the edge of a gap or overlap. Real
/// transitions are at most a day (Samoa skipped 2011-12-30), so this is a
/// wide margin that still bounds the search.
const MAX_TRANSITION_SECONDS: i64 = 4 * 86_400;

/// Each pass of the fixed-time loop either returns or jumps past a whole gap
/// or overlap, so a handful of passes is enough; the bound only guards
/// against a zone table that breaks that reasoning.
const MAX_FIXED_PASSES: usize = 64;

/// How many times an `L-n` search may move to another day before it gives up: two a
/// month at most, and a month without the day (`L-30` in February) costs one, so
/// this covers years of months.
const MAX_DAY_MOVES: usize = 256;

fn at_ms(ms: i64) -> Option<DateTime<Utc>> {
    DateTime::<Utc>::from_timestamp_millis(ms)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Dialect {
    Posix,
    Quartz,
    QuartzYear,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum FieldKind {
    Second,
    Minute,
    Hour,
    DayOfMonth,
    Month,
    DayOfWeek,
    Year,
}

impl FieldKind {
    fn name(self) -> &'static str {
        match self {
            FieldKind::Second => "second",
            FieldKind::Minute => "minute",
            FieldKind::Hour => "hour",
            FieldKind::DayOfMonth => "day-of-month",
            FieldKind::Month => "month",
            FieldKind::DayOfWeek => "day-of-week",
            FieldKind::Year => "year",
        }
    }
}

const POSIX_FIELDS: &[FieldKind] = &[
    FieldKind::Minute,
    FieldKind::Hour,
    FieldKind::DayOfMonth,
    FieldKind::Month,
    FieldKind::DayOfWeek,
];
const QUARTZ_FIELDS: &[FieldKind] = &[
    FieldKind::Second,
    FieldKind::Minute,
    FieldKind::Hour,
    FieldKind::DayOfMonth,
    FieldKind::Month,
    FieldKind::DayOfWeek,
];
const QUARTZ_YEAR_FIELDS: &[FieldKind] = &[
    FieldKind::Second,
    FieldKind::Minute,
    FieldKind::Hour,
    FieldKind::DayOfMonth,
    FieldKind::Month,
    FieldKind::DayOfWeek,
    FieldKind::Year,
];

const MONTH_NAMES: &[&str] = &[
    "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
];
const DAY_NAMES: &[&str] = &["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

impl Dialect {
    fn fields(self) -> &'static [FieldKind] {
        match self {
            Dialect::Posix => POSIX_FIELDS,
            Dialect::Quartz => QUARTZ_FIELDS,
            Dialect::QuartzYear => QUARTZ_YEAR_FIELDS,
        }
    }

    /// Sundial's one croner configuration per dialect. The field count has
    /// already been checked, so each parser is set to require exactly that
    /// count: croner then never guesses which field is missing.
    fn parser(self) -> CronParser {
        let builder = CronParser::builder().dom_and_dow(false);
        match self {
            Dialect::Posix => builder
                .seconds(Seconds::Disallowed)
                .year(Year::Disallowed)
                .alternative_weekdays(false)
                .sloppy_ranges(false),
            Dialect::Quartz => builder
                .seconds(Seconds::Required)
                .year(Year::Disallowed)
                .alternative_weekdays(true)
                .sloppy_ranges(true),
            Dialect::QuartzYear => builder
                .seconds(Seconds::Required)
                .year(Year::Required)
                .alternative_weekdays(true)
                .sloppy_ranges(true),
        }
        .build()
    }
}

impl CronSchedule {
    /// Parses `expr` in Sundial's configuration for the IANA zone `time_zone` ("" means "UTC").
    ///
    /// Fails with [`CronError::NeverFires`] when the expression is valid but
    /// has no fire after the current time, so the answer for a line with a
    /// year field changes once its last year has passed.
    pub fn parse(expr: &str, time_zone: &str) -> Result<Self, CronError> {
        let Parsed {
            cron,
            fixed_time,
            last_day,
        } = parse_remembered(expr)?;
        let tz = parse_time_zone(time_zone)?;
        let schedule = CronSchedule {
            cron,
            tz,
            expr: expr.to_string(),
            fixed_time,
            last_day,
        };
        // A schedule with nothing ahead of it would sit in the store forever
        // without running; refusing it at parse time tells the user now.
        if schedule.next_after(Utc::now().timestamp_millis()).is_none() {
            return Err(CronError::NeverFires);
        }
        Ok(schedule)
    }

    /// The first fire strictly after `after_ms` (epoch milliseconds, UTC), or None if there is none.
    pub fn next_after(&self, after_ms: i64) -> Option<i64> {
        let Some(rule) = self.last_day else {
            return self.next_any_day(after_ms);
        };
        // Croner finds the line's next fire on any day; one on another day than the
        // rule's moves the search to the rule's day of that month, or to the next
        // month: at most two moves a month.
        let mut from = after_ms;
        for _ in 0..MAX_DAY_MOVES {
            let next = self.next_any_day(from)?;
            let local = at_ms(next)?.with_timezone(&self.tz).date_naive();
            let target = match rule.day(local.year(), local.month()) {
                Some(day) if day == local.day() => return Some(next),
                Some(day) if day > local.day() => local.with_day(day)?,
                _ => local
                    .with_day(1)?
                    .checked_add_months(chrono::Months::new(1))?,
            };
            from = self.start_of_day(target)?.saturating_sub(1).max(next);
        }
        None
    }

    /// The first instant of `date` in the zone (after its gap, if midnight is skipped).
    fn start_of_day(&self, date: chrono::NaiveDate) -> Option<i64> {
        let midnight = date.and_hms_opt(0, 0, 0)?;
        let resolved = match self.tz.from_local_datetime(&midnight) {
            LocalResult::None => {
                let end = first_wall_where(self.tz, midnight, |r| !matches!(r, LocalResult::None))?;
                self.tz.from_local_datetime(&end).earliest()
            }
            other => other.earliest(),
        }?;
        Some(resolved.timestamp_millis())
    }

    /// The first fire strictly after `after_ms` on any day (`L-n` not applied).
    fn next_any_day(&self, after_ms: i64) -> Option<i64> {
        if after_ms >= MAX_SEARCH_MS {
            return None;
        }
        let after = DateTime::<Utc>::from_timestamp_millis(after_ms.max(MIN_SEARCH_MS))?;
        let next = if self.fixed_time {
            self.next_fixed_time(after)
        } else {
            self.next_interval(after)
        }?;
        let next_ms = next.timestamp_millis();
        // Both searches only return instants past `after`; the check keeps
        // the "strictly after" promise even if croner's rounding ever drifts.
        (next_ms > after_ms).then_some(next_ms)
    }

    /// Up to `n` fires strictly after `after_ms`, ascending.
    pub fn upcoming(&self, after_ms: i64, n: usize) -> Vec<i64> {
        // `n` comes from callers, so it does not size the allocation up front.
        let mut fires = Vec::with_capacity(n.min(64));
        let mut cursor = after_ms;
        while fires.len() < n {
            match self.next_after(cursor) {
                Some(next) => {
                    fires.push(next);
                    cursor = next;
                }
                None => break,
            }
        }
        fires
    }

    pub fn expr(&self) -> &str {
        &self.expr
    }

    pub fn time_zone(&self) -> Tz {
        self.tz
    }

    /// Interval lines: croner's zoned search already keeps the real-time
    /// cadence through gaps (skipped) and overlaps (both passes).
    fn next_interval(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let start = after.with_timezone(&self.tz);
        let mut found = self.cron.find_next_occurrence(&start, false).ok()?;
        // Croner searches in whole seconds; step again should it ever hand
        // back the start's own second.
        for _ in 0..4 {
            let utc = found.with_timezone(&Utc);
            if utc > after {
                return Some(utc);
            }
            found = self.cron.find_next_occurrence(&found, false).ok()?;
        }
        None
    }

    /// Fixed-time lines: croner walks the zone-less wall clock, and each
    /// matching wall time maps to one instant: itself, its first pass in an
    /// overlap, or the end of the gap that skips it. That map never goes
    /// backwards as the wall clock advances, so the first wall time after the
    /// start's own that maps past `after` is the answer, once the passes that
    /// an overlap or gap already spent are skipped.
    fn next_fixed_time(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let mut cursor: NaiveDateTime = after.with_timezone(&self.tz).naive_local();
        for _ in 0..MAX_FIXED_PASSES {
            let wall = self.cron.find_next_occurrence(&cursor, false).ok()?;
            match self.tz.from_local_datetime(&wall) {
                LocalResult::Single(instant) => {
                    let instant = instant.with_timezone(&Utc);
                    if instant > after {
                        return Some(instant);
                    }
                    cursor = wall;
                }
                LocalResult::Ambiguous(first_pass, _) => {
                    let first_pass = first_pass.with_timezone(&Utc);
                    if first_pass > after {
                        return Some(first_pass);
                    }
                    // `after` is on the second pass of this overlap, so every
                    // later wall time in it had its first pass already.
                    let end = first_wall_where(self.tz, wall, |r| {
                        !matches!(r, LocalResult::Ambiguous(..))
                    })?;
                    cursor = end.checked_sub_signed(TimeDelta::seconds(1))?;
                }
                LocalResult::None => {
                    let end = first_wall_where(self.tz, wall, |r| !matches!(r, LocalResult::None))?;
                    let after_gap = self.tz.from_local_datetime(&end).earliest()?;
                    let after_gap = after_gap.with_timezone(&Utc);
                    if after_gap > after {
                        return Some(after_gap);
                    }
                    // This gap's one fire is already behind `after`; the rest
                    // of the gap's wall times would only repeat it.
                    cursor = end.checked_sub_signed(TimeDelta::seconds(1))?;
                }
            }
        }
        None
    }
}

/// The first wall time after `start` (to the second) whose resolution in `tz`
/// satisfies `done`, given that `start` does not. Gaps and overlaps are short
/// runs, so an exponential probe brackets the edge and a bisection pins it:
/// a few dozen zone lookups instead of one per second of the run.
fn first_wall_where(
    tz: Tz,
    start: NaiveDateTime,
    done: impl Fn(&LocalResult<DateTime<Tz>>) -> bool,
) -> Option<NaiveDateTime> {
    let at = |offset: i64| start.checked_add_signed(TimeDelta::seconds(offset));
    let is_done = |offset: i64| at(offset).map(|wall| done(&tz.from_local_datetime(&wall)));

    let mut not_done = 0_i64;
    let mut step = 1_i64;
    let mut done_at = loop {
        if is_done(step)? {
            break step;
        }
        not_done = step;
        step = step.checked_mul(2)?;
        if step > MAX_TRANSITION_SECONDS {
            return None;
        }
    };
    while done_at - not_done > 1 {
        let middle = not_done + (done_at - not_done) / 2;
        if is_done(middle)? {
            done_at = middle;
        } else {
            not_done = middle;
        }
    }
    at(done_at)
}

fn parse_time_zone(time_zone: &str) -> Result<Tz, CronError> {
    if time_zone.is_empty() {
        return Ok(Tz::UTC);
    }
    time_zone.parse::<Tz>().map_err(|_| {
        // Named in the error, so at most 100 characters of it: a huge one must not
        // make a huge message (past a gRPC client's metadata limit).
        let cut = match time_zone.char_indices().nth(100) {
            Some((end, _)) => format!("{}…", &time_zone[..end]),
            None => time_zone.to_string(),
        };
        CronError::UnknownTimeZone(cut)
    })
}

/// An expression as croner reads it, and what Sundial adds.
#[derive(Clone)]
struct Parsed {
    cron: Cron,
    /// Whether it is a fixed-time line (see the module docs).
    fixed_time: bool,
    last_day: Option<LastDayOffset>,
}

/// How many parsed expressions [`parse_remembered`] keeps.
const REMEMBERED: usize = 4096;

/// Expressions parsed lately, by their text: croner's parse is the larger part of what
/// validating a job costs (remembering it took 10 000 jobs' `ApplyJobs` on the embedded
/// store from ~285 to ~160 ms), and jobs share a few expressions (`0 * * * *`).
/// Forgotten all at once when full.
static PARSED: std::sync::LazyLock<std::sync::Mutex<std::collections::HashMap<String, Parsed>>> =
    std::sync::LazyLock::new(Default::default);

/// `parse_expression`, remembered (errors are not: they are cheap and rare).
fn parse_remembered(expr: &str) -> Result<Parsed, CronError> {
    let remembered = || {
        PARSED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    };
    if let Some(parsed) = remembered().get(expr) {
        return Ok(parsed.clone());
    }
    let parsed = parse_expression(expr)?;
    let mut all = remembered();
    if all.len() >= REMEMBERED {
        all.clear();
    }
    all.insert(expr.to_owned(), parsed.clone());
    Ok(parsed)
}

/// Checks the expression against Sundial's rules, then has croner parse it.
fn parse_expression(expr: &str) -> Result<Parsed, CronError> {
    let trimmed = expr.trim();
    if trimmed.is_empty() {
        return Err(syntax("empty expression; expected 5, 6 or 7 fields"));
    }
    if !trimmed.is_ascii() {
        return Err(syntax("expression must be plain ASCII"));
    }
    let raw: Vec<&str> = trimmed.split_ascii_whitespace().collect();
    let dialect = match raw.len() {
        5 => Dialect::Posix,
        6 => Dialect::Quartz,
        7 => Dialect::QuartzYear,
        n => {
            return Err(syntax(format!(
                "expected 5 fields (min hour dom month dow), 6 (sec min hour dom month dow) \
                 or 7 (sec min hour dom month dow year), got {n} field{}",
                if n == 1 { "" } else { "s" }
            )));
        }
    };
    let kinds = dialect.fields();

    let mut fields = Vec::with_capacity(raw.len());
    let mut last_day = None;
    for (&kind, &field) in kinds.iter().zip(&raw) {
        let mut field = check_field(kind, field)?;
        if kind == FieldKind::DayOfMonth {
            last_day = LastDayOffset::parse(&field)?;
            if last_day.is_some() {
                // Every day; the rule picks the day (see `next_after`).
                field = "*".to_owned();
            }
        }
        field = match dialect {
            Dialect::Posix => {
                quartz::posix_field(kind, &field)?;
                field
            }
            Dialect::Quartz | Dialect::QuartzYear => quartz::quartz_field(kind, &field)?,
        };
        fields.push(field);
    }
    let dow = kinds.iter().position(|&k| k == FieldKind::DayOfWeek);
    if let Some(dow) = dow.and_then(|i| raw.get(i))
        && last_day.is_some()
        && *dow != "*"
        && *dow != "?"
    {
        return Err(syntax(format!(
            "day-of-week field {dow:?}: must be '?' (or '*') when the day of month is 'L-n'"
        )));
    }

    let parser = dialect.parser();
    let cron = match parser.parse(&fields.join(" ")) {
        Ok(cron) => cron,
        Err(err) => return Err(explain_croner_error(&parser, kinds, &fields, &err)),
    };

    // As written: a wrap-around range with a step is a list for croner.
    let is_wild = |kind: FieldKind| {
        kinds
            .iter()
            .position(|&k| k == kind)
            .and_then(|i| raw.get(i))
            .is_some_and(|f| f.contains('*') || f.contains('/'))
    };
    // Croner's own fixed class (single second, minute and hour) is a subset
    // of this one, so every line croner would treat as fixed-time is also
    // fixed-time here and interval lines can trust croner's DST handling.
    let fixed_time = (!is_wild(FieldKind::Minute) && !is_wild(FieldKind::Hour))
        || cron.determine_job_type() == JobType::FixedTime;
    Ok(Parsed {
        cron,
        fixed_time,
        last_day,
    })
}

/// Sundial-specific checks on one field; returns the text to hand to croner.
fn check_field(kind: FieldKind, field: &str) -> Result<String, CronError> {
    let name = kind.name();
    if field.contains('?') {
        let may_be_open = matches!(
            kind,
            FieldKind::DayOfMonth | FieldKind::DayOfWeek | FieldKind::Year
        );
        if field != "?" || !may_be_open {
            return Err(syntax(format!(
                "{name} field {field:?}: '?' may only stand alone in the day-of-month, \
                 day-of-week or year field"
            )));
        }
        // Croner's year field does not know `?`; for a year it means any.
        return Ok(if kind == FieldKind::Year { "*" } else { "?" }.to_string());
    }
    if field.split(',').any(str::is_empty) {
        return Err(syntax(format!("{name} field {field:?}: empty list item")));
    }
    if kind == FieldKind::DayOfWeek {
        if field.contains('+') {
            return Err(syntax(format!(
                "{name} field {field:?}: the '+' prefix is not supported"
            )));
        }
        if field.split(',').any(|item| item.eq_ignore_ascii_case("L")) {
            return Err(syntax(format!(
                "{name} field {field:?}: a bare 'L' is not supported; \
                 use e.g. '5L' for the last weekday 5 of the month"
            )));
        }
    }
    for word in field
        .split(|c: char| !c.is_ascii_alphabetic())
        .filter(|w| !w.is_empty())
    {
        let word = word.to_ascii_uppercase();
        let allowed = match kind {
            FieldKind::DayOfMonth => matches!(word.as_str(), "L" | "W" | "LW"),
            FieldKind::Month => MONTH_NAMES.contains(&word.as_str()),
            FieldKind::DayOfWeek => {
                word == "L"
                    || DAY_NAMES.contains(&word.as_str())
                    || word
                        .strip_suffix('L')
                        .is_some_and(|day| DAY_NAMES.contains(&day))
            }
            FieldKind::Second | FieldKind::Minute | FieldKind::Hour | FieldKind::Year => false,
        };
        if !allowed {
            return Err(syntax(format!(
                "{name} field {field:?}: unexpected {word:?}"
            )));
        }
    }
    Ok(field.to_string())
}

/// Croner reports what went wrong but not where. Re-parsing each field on its
/// own, with every other field a wildcard, finds the one to blame; this only
/// runs on the error path.
fn explain_croner_error(
    parser: &CronParser,
    kinds: &[FieldKind],
    fields: &[String],
    err: &CronerError,
) -> CronError {
    for (i, (&kind, field)) in kinds.iter().zip(fields).enumerate() {
        let probe: Vec<&str> = (0..fields.len())
            .map(|j| if j == i { field.as_str() } else { "*" })
            .collect();
        if let Err(field_err) = parser.parse(&probe.join(" ")) {
            return syntax(format!(
                "{} field {field:?}: {}",
                kind.name(),
                croner_message(&field_err)
            ));
        }
    }
    syntax(croner_message(err))
}

fn croner_message(err: &CronerError) -> String {
    let text = match err {
        CronerError::ComponentError(msg) | CronerError::InvalidPattern(msg) => msg.clone(),
        CronerError::IllegalCharacters(msg) => {
            msg.strip_prefix("CronPattern ").unwrap_or(msg).to_string()
        }
        other => other.to_string(),
    };
    let text = text.trim_end_matches('.');
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => "invalid expression".to_string(),
    }
}

fn syntax(msg: impl Into<String>) -> CronError {
    CronError::Syntax(msg.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{Datelike, NaiveDate, Timelike, Weekday};
    use proptest::prelude::*;

    const MINUTE: i64 = 60_000;
    const HOUR: i64 = 60 * MINUTE;

    fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> i64 {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, s)
            .single()
            .expect("unambiguous test time")
            .timestamp_millis()
    }

    /// An unambiguous local wall time in `tz`, as epoch ms.
    fn local(tz: Tz, y: i32, mo: u32, d: u32, h: u32, mi: u32) -> i64 {
        tz.with_ymd_and_hms(y, mo, d, h, mi, 0)
            .single()
            .expect("unambiguous test time")
            .timestamp_millis()
    }

    fn sched(expr: &str, tz: &str) -> CronSchedule {
        CronSchedule::parse(expr, tz).unwrap_or_else(|e| panic!("{expr:?} in {tz:?}: {e}"))
    }

    fn at(ms: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(ms).expect("test instant in chrono's range")
    }

    fn date(y: i32, mo: u32, d: u32) -> NaiveDate {
        NaiveDate::from_ymd_opt(y, mo, d).expect("valid test date")
    }

    fn wall(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> NaiveDateTime {
        date(y, mo, d)
            .and_hms_opt(h, mi, 0)
            .expect("valid test time")
    }

    fn parse_err(expr: &str, tz: &str) -> CronError {
        match CronSchedule::parse(expr, tz) {
            Ok(s) => panic!("{expr:?} in {tz:?} parsed: {s:?}"),
            Err(e) => e,
        }
    }

    fn next(s: &CronSchedule, after_ms: i64) -> i64 {
        s.next_after(after_ms)
            .unwrap_or_else(|| panic!("{} fires after {}", s.expr(), at(after_ms)))
    }

    fn in_zone(ms: i64, tz: Tz) -> NaiveDateTime {
        at(ms).with_timezone(&tz).naive_local()
    }

    /// All fires in `[from, to)`.
    fn fires_between(s: &CronSchedule, from: i64, to: i64) -> Vec<i64> {
        let mut out = Vec::new();
        let mut cursor = from - 1;
        while let Some(next) = s.next_after(cursor) {
            if next >= to {
                break;
            }
            out.push(next);
            cursor = next;
        }
        out
    }

    fn assert_every(fires: &[i64], gap_ms: i64) {
        for pair in fires.windows(2) {
            assert_eq!(
                pair[1] - pair[0],
                gap_ms,
                "{} -> {}",
                at(pair[0]),
                at(pair[1])
            );
        }
    }

    // ---- Quartz (6/7 fields) ----

    #[test]
    fn quartz_every_five_minutes() {
        let s = sched("0 0/5 * * * ?", "");
        let from = utc(2026, 5, 4, 10, 2, 30);
        let fires = s.upcoming(from, 4);
        assert_eq!(
            fires,
            vec![
                utc(2026, 5, 4, 10, 5, 0),
                utc(2026, 5, 4, 10, 10, 0),
                utc(2026, 5, 4, 10, 15, 0),
                utc(2026, 5, 4, 10, 20, 0),
            ]
        );
    }

    #[test]
    fn quartz_last_day_of_month() {
        let s = sched("0 0 2 L * ?", "");
        // Leap year: February has 29 days.
        assert_eq!(
            s.next_after(utc(2028, 2, 1, 0, 0, 0)),
            Some(utc(2028, 2, 29, 2, 0, 0))
        );
        // Non-leap year: 28.
        assert_eq!(
            s.next_after(utc(2027, 2, 1, 0, 0, 0)),
            Some(utc(2027, 2, 28, 2, 0, 0))
        );
        // Every fire is the last day of its month.
        for ms in s.upcoming(utc(2026, 1, 1, 0, 0, 0), 24) {
            let t = at(ms);
            assert_eq!((t.hour(), t.minute(), t.second()), (2, 0, 0));
            assert_eq!((t + TimeDelta::days(1)).day(), 1, "{t}");
        }
    }

    #[test]
    fn quartz_third_friday() {
        let s = sched("0 0 10 ? * 6#3", "");
        assert_eq!(
            s.next_after(utc(2026, 12, 1, 0, 0, 0)),
            Some(utc(2026, 12, 18, 10, 0, 0))
        );
        let dec18 = date(2026, 12, 18);
        assert_eq!(dec18.weekday(), Weekday::Fri);
        for ms in s.upcoming(utc(2026, 1, 1, 0, 0, 0), 24) {
            let t = at(ms);
            assert_eq!(t.weekday(), Weekday::Fri, "{t}");
            assert!((15..=21).contains(&t.day()), "{t} is not a third Friday");
            assert_eq!(t.hour(), 10);
        }
    }

    #[test]
    fn quartz_weekdays_mon_to_fri() {
        let s = sched("0 0 12 ? * 2-6", "");
        // 2026-05-04 is a Monday; two weeks hold ten weekdays.
        let fires = s.upcoming(utc(2026, 5, 4, 0, 0, 0), 10);
        assert_eq!(fires.len(), 10);
        assert_eq!(fires[0], utc(2026, 5, 4, 12, 0, 0));
        assert_eq!(fires[9], utc(2026, 5, 15, 12, 0, 0));
        for ms in fires {
            let wd = at(ms).weekday();
            assert!(!matches!(wd, Weekday::Sat | Weekday::Sun), "{}", at(ms));
        }
    }

    #[test]
    fn quartz_and_posix_number_days_differently() {
        // Quartz 1 = Sunday; POSIX 1 = Monday.
        let quartz = sched("0 0 12 ? * 1", "");
        let posix = sched("0 12 * * 1", "");
        let from = utc(2026, 5, 4, 0, 0, 0);
        assert_eq!(at(next(&quartz, from)).weekday(), Weekday::Sun);
        assert_eq!(at(next(&posix, from)).weekday(), Weekday::Mon);
    }

    #[test]
    fn quartz_last_friday() {
        let s = sched("0 15 10 ? * 6L", "");
        // 2026-12-25 is the last Friday of December 2026.
        assert_eq!(
            s.next_after(utc(2026, 12, 1, 0, 0, 0)),
            Some(utc(2026, 12, 25, 10, 15, 0))
        );
        for ms in s.upcoming(utc(2026, 1, 1, 0, 0, 0), 24) {
            let t = at(ms);
            assert_eq!(t.weekday(), Weekday::Fri, "{t}");
            assert_ne!((t + TimeDelta::days(7)).month(), t.month(), "{t} not last");
        }
    }

    #[test]
    fn quartz_nearest_weekday_to_15th() {
        let s = sched("0 0 12 15W * ?", "");
        // Nov 15 2026 is a Sunday -> Monday 16th; Aug 15 2026 is a Saturday
        // -> Friday 14th; Jul 15 2026 is a Wednesday -> itself.
        assert_eq!(date(2026, 11, 15).weekday(), Weekday::Sun);
        assert_eq!(date(2026, 8, 15).weekday(), Weekday::Sat);
        assert_eq!(
            s.next_after(utc(2026, 11, 1, 0, 0, 0)),
            Some(utc(2026, 11, 16, 12, 0, 0))
        );
        assert_eq!(
            s.next_after(utc(2026, 8, 1, 0, 0, 0)),
            Some(utc(2026, 8, 14, 12, 0, 0))
        );
        assert_eq!(
            s.next_after(utc(2026, 7, 1, 0, 0, 0)),
            Some(utc(2026, 7, 15, 12, 0, 0))
        );
        for ms in s.upcoming(utc(2026, 1, 1, 0, 0, 0), 24) {
            let t = at(ms);
            assert!(!matches!(t.weekday(), Weekday::Sat | Weekday::Sun), "{t}");
            assert!((13..=17).contains(&t.day()), "{t}");
        }
    }

    // ---- POSIX (5 fields) ----

    #[test]
    fn posix_every_fifteen_minutes() {
        let s = sched("*/15 * * * *", "");
        let fires = s.upcoming(utc(2026, 5, 4, 10, 7, 0), 5);
        assert_eq!(fires[0], utc(2026, 5, 4, 10, 15, 0));
        assert_eq!(fires.len(), 5);
        assert_every(&fires, 15 * MINUTE);
    }

    #[test]
    fn posix_weekdays_at_nine() {
        let s = sched("0 9 * * 1-5", "");
        let fires = s.upcoming(utc(2026, 5, 2, 12, 0, 0), 5); // a Saturday
        assert_eq!(fires[0], utc(2026, 5, 4, 9, 0, 0));
        let days: Vec<Weekday> = fires.iter().map(|&ms| at(ms).weekday()).collect();
        assert_eq!(
            days,
            vec![
                Weekday::Mon,
                Weekday::Tue,
                Weekday::Wed,
                Weekday::Thu,
                Weekday::Fri
            ]
        );
    }

    #[test]
    fn posix_sunday_is_zero_and_seven() {
        let zero = sched("0 0 * * 0", "");
        let seven = sched("0 0 * * 7", "");
        let from = utc(2026, 5, 4, 0, 0, 0);
        let a = zero.upcoming(from, 6);
        assert_eq!(a, seven.upcoming(from, 6));
        assert_eq!(a[0], utc(2026, 5, 10, 0, 0, 0));
        for ms in a {
            assert_eq!(at(ms).weekday(), Weekday::Sun);
        }
    }

    #[test]
    fn both_day_fields_restricted_means_either() {
        // Every 13th and every Friday (croner's legacy OR rule).
        let s = sched("0 0 13 * 5", "");
        let fires = s.upcoming(utc(2026, 5, 1, 0, 0, 0), 6);
        for &ms in &fires {
            let t = at(ms);
            assert!(t.day() == 13 || t.weekday() == Weekday::Fri, "{t}");
        }
        assert!(fires.contains(&utc(2026, 5, 13, 0, 0, 0))); // a Wednesday
        assert!(fires.contains(&utc(2026, 5, 8, 0, 0, 0))); // a Friday
    }

    #[test]
    fn whitespace_is_flexible() {
        let s = sched("  0   9 *\t*  1-5  ", "");
        assert_eq!(s.expr(), "  0   9 *\t*  1-5  ");
        assert_eq!(
            s.next_after(utc(2026, 5, 2, 0, 0, 0)),
            Some(utc(2026, 5, 4, 9, 0, 0))
        );
    }

    #[test]
    fn names_are_accepted_where_they_belong() {
        let s = sched("0 9 * JAN,JUL mon-fri", "");
        let t = at(next(&s, utc(2026, 5, 1, 0, 0, 0)));
        assert_eq!((t.month(), t.weekday()), (7, Weekday::Wed));
        assert!(matches!(
            CronSchedule::parse("MON * * * *", ""),
            Err(CronError::Syntax(_))
        ));
    }

    // ---- 7 fields: year ----

    #[test]
    fn year_field_fires_once_then_never() {
        let s = sched("0 0 12 1 1 ? 2030", "");
        let first = s.next_after(utc(2026, 5, 1, 0, 0, 0));
        assert_eq!(first, Some(utc(2030, 1, 1, 12, 0, 0)));
        assert_eq!(s.next_after(utc(2030, 1, 1, 12, 0, 0)), None);
        assert_eq!(s.upcoming(utc(2026, 5, 1, 0, 0, 0), 10).len(), 1);
    }

    #[test]
    fn year_field_forms() {
        let from = utc(2026, 5, 1, 0, 0, 0);
        let years = |expr: &str| -> Vec<i32> {
            sched(expr, "")
                .upcoming(from, 10)
                .into_iter()
                .map(|ms| at(ms).year())
                .collect()
        };
        assert_eq!(years("0 0 12 1 1 ? 2030-2032"), vec![2030, 2031, 2032]);
        assert_eq!(years("0 0 12 1 1 ? 2028,2031"), vec![2028, 2031]);
        assert_eq!(years("0 0 12 1 1 ? 2030-2036/3"), vec![2030, 2033, 2036]);
        assert_eq!(years("0 0 12 1 1 ? 2030/10")[..3], [2030, 2040, 2050]);
        assert_eq!(years("0 0 12 1 1 ? ?")[..2], [2027, 2028]);
        assert_eq!(years("0 0 12 1 1 ? *")[..2], [2027, 2028]);
    }

    #[test]
    fn past_year_never_fires() {
        for expr in [
            "0 0 12 1 1 ? 2020",
            "0 0 12 1 1 ? 2001-2010",
            "0 0 0 * * ? 1999",
        ] {
            assert_eq!(parse_err(expr, ""), CronError::NeverFires, "{expr}");
        }
    }

    // ---- time zones ----

    #[test]
    fn shanghai_nine_is_one_utc() {
        let s = sched("0 9 * * *", "Asia/Shanghai");
        assert_eq!(s.time_zone(), chrono_tz::Asia::Shanghai);
        assert_eq!(
            s.next_after(utc(2026, 5, 4, 0, 0, 0)),
            Some(utc(2026, 5, 4, 1, 0, 0))
        );
    }

    #[test]
    fn new_york_summer_and_winter() {
        let s = sched("0 9 * * *", "America/New_York");
        // EDT (UTC-4) in July, EST (UTC-5) in January.
        assert_eq!(
            s.next_after(utc(2026, 7, 1, 0, 0, 0)),
            Some(utc(2026, 7, 1, 13, 0, 0))
        );
        assert_eq!(
            s.next_after(utc(2026, 1, 15, 0, 0, 0)),
            Some(utc(2026, 1, 15, 14, 0, 0))
        );
    }

    #[test]
    fn empty_zone_is_utc() {
        assert_eq!(sched("0 9 * * *", "").time_zone(), Tz::UTC);
        assert_eq!(sched("0 9 * * *", "UTC").time_zone(), Tz::UTC);
    }

    // ---- DST ----

    const NY: Tz = chrono_tz::America::New_York;
    const BERLIN: Tz = chrono_tz::Europe::Berlin;

    #[test]
    fn dst_transitions_are_where_the_tests_assume() {
        // 2026-03-08 02:00 EST does not exist in New York.
        let gap = wall(2026, 3, 8, 2, 30);
        assert!(matches!(NY.from_local_datetime(&gap), LocalResult::None));
        let overlap = wall(2026, 11, 1, 1, 30);
        assert!(matches!(
            NY.from_local_datetime(&overlap),
            LocalResult::Ambiguous(..)
        ));
        let gap = wall(2026, 3, 29, 2, 30);
        assert!(matches!(
            BERLIN.from_local_datetime(&gap),
            LocalResult::None
        ));
        let overlap = wall(2026, 10, 25, 2, 30);
        assert!(matches!(
            BERLIN.from_local_datetime(&overlap),
            LocalResult::Ambiguous(..)
        ));
    }

    #[test]
    fn fixed_time_in_spring_gap_runs_once_after_it() {
        for (tz, zone, day) in [(NY, "America/New_York", 8), (BERLIN, "Europe/Berlin", 29)] {
            let s = sched("30 2 * * *", zone);
            let fires = fires_between(
                &s,
                local(tz, 2026, 3, day, 0, 0),
                local(tz, 2026, 3, day + 1, 0, 0),
            );
            assert_eq!(fires, vec![local(tz, 2026, 3, day, 3, 0)], "{zone}");
            // The days around it run at 02:30 as usual.
            assert_eq!(
                s.next_after(local(tz, 2026, 3, day - 1, 0, 0)),
                Some(local(tz, 2026, 3, day - 1, 2, 30))
            );
            assert_eq!(
                s.next_after(local(tz, 2026, 3, day, 3, 0)),
                Some(local(tz, 2026, 3, day + 1, 2, 30))
            );
        }
    }

    #[test]
    fn fixed_time_in_fall_overlap_runs_once() {
        let s = sched("30 1 * * *", "America/New_York");
        let day_start = local(NY, 2026, 11, 1, 0, 0);
        let fires = fires_between(&s, day_start, local(NY, 2026, 11, 2, 0, 0));
        // The first pass: 01:30 EDT = 05:30Z.
        assert_eq!(fires, vec![utc(2026, 11, 1, 5, 30, 0)]);
        // Starting inside the second pass does not fire it either.
        assert_eq!(
            s.next_after(utc(2026, 11, 1, 6, 10, 0)),
            Some(local(NY, 2026, 11, 2, 1, 30))
        );

        let s = sched("30 2 * * *", "Europe/Berlin");
        let fires = fires_between(
            &s,
            local(BERLIN, 2026, 10, 25, 0, 0),
            local(BERLIN, 2026, 10, 26, 0, 0),
        );
        // 02:30 CEST = 00:30Z.
        assert_eq!(fires, vec![utc(2026, 10, 25, 0, 30, 0)]);
    }

    #[test]
    fn fixed_time_lists_follow_the_fixed_rule() {
        // Croner alone would treat these as interval lines.
        let s = sched("0 2,14 * * *", "America/New_York");
        let fires = fires_between(&s, local(NY, 2026, 3, 8, 0, 0), local(NY, 2026, 3, 9, 0, 0));
        assert_eq!(
            fires,
            vec![local(NY, 2026, 3, 8, 3, 0), local(NY, 2026, 3, 8, 14, 0)]
        );

        let s = sched("0,30 1 * * *", "America/New_York");
        let fires = fires_between(
            &s,
            local(NY, 2026, 11, 1, 0, 0),
            local(NY, 2026, 11, 2, 0, 0),
        );
        assert_eq!(
            fires,
            vec![utc(2026, 11, 1, 5, 0, 0), utc(2026, 11, 1, 5, 30, 0)]
        );

        // Two skipped wall times of one line collapse into one run.
        let s = sched("0 0,30 2 * * ?", "America/New_York");
        let fires = fires_between(&s, local(NY, 2026, 3, 8, 0, 0), local(NY, 2026, 3, 9, 0, 0));
        assert_eq!(fires, vec![local(NY, 2026, 3, 8, 3, 0)]);
    }

    #[test]
    fn interval_keeps_real_cadence_through_dst() {
        let cases = [
            (NY, "America/New_York", utc(2026, 3, 8, 7, 0, 0)),
            (NY, "America/New_York", utc(2026, 11, 1, 6, 0, 0)),
            (BERLIN, "Europe/Berlin", utc(2026, 3, 29, 1, 0, 0)),
            (BERLIN, "Europe/Berlin", utc(2026, 10, 25, 1, 0, 0)),
        ];
        for (tz, zone, change) in cases {
            let s = sched("*/30 * * * *", zone);
            let from = change - 12 * HOUR;
            let fires = fires_between(&s, from, from + 24 * HOUR);
            assert_eq!(fires.len(), 48, "{zone} around {}", at(change));
            assert_eq!(fires[0], from);
            assert_every(&fires, 30 * MINUTE);

            let s = sched("0 * * * *", zone);
            let fires = fires_between(&s, from, from + 24 * HOUR);
            assert_eq!(fires.len(), 24, "{zone} around {}", at(change));
            assert_every(&fires, HOUR);
            // The wall clock really did jump around these fires.
            let walls: Vec<u32> = fires.iter().map(|&ms| in_zone(ms, tz).hour()).collect();
            assert!(
                walls.windows(2).any(|w| w[1] != (w[0] + 1) % 24),
                "{walls:?}"
            );
        }
    }

    #[test]
    fn interval_fires_both_copies_of_repeated_hour() {
        let s = sched("*/15 * * * *", "America/New_York");
        let fires = fires_between(
            &s,
            utc(2026, 11, 1, 5, 0, 0), // 01:00 EDT
            utc(2026, 11, 1, 7, 0, 0), // 02:00 EST
        );
        let walls: Vec<String> = fires
            .iter()
            .map(|&ms| in_zone(ms, NY).format("%H:%M").to_string())
            .collect();
        assert_eq!(
            walls,
            [
                "01:00", "01:15", "01:30", "01:45", "01:00", "01:15", "01:30", "01:45"
            ]
        );
    }

    // ---- errors ----

    #[test]
    fn wrong_field_counts_are_syntax_errors() {
        for (expr, count) in [("* * * *", "4"), ("* * * * * * * *", "8"), ("@daily", "1")] {
            match CronSchedule::parse(expr, "") {
                Err(CronError::Syntax(msg)) => {
                    assert!(msg.contains(&format!("got {count} field")), "{msg}")
                }
                other => panic!("{expr:?}: {other:?}"),
            }
        }
        for expr in ["", "   ", "\t\n"] {
            assert!(matches!(
                CronSchedule::parse(expr, ""),
                Err(CronError::Syntax(_))
            ));
        }
    }

    #[test]
    fn bad_values_are_syntax_errors() {
        let err = parse_err("61 * * * *", "");
        assert!(
            matches!(&err, CronError::Syntax(m) if m.contains("minute")),
            "{err}"
        );
        assert_eq!(err.field(), "cron");
        assert!(err.to_string().starts_with("cron: "));
        for expr in [
            "* 24 * * *",
            "* * 0 * *",
            "* * * 13 *",
            "* * * * 8",
            "0/5 * * * *",   // POSIX keeps the strict step syntax
            "0 0 12 ? * 0",  // Quartz has no day 0
            "0 0 12 ? * 8",  // ... nor 8
            "0 0 12 ? * L",  // bare L as a weekday
            "0 0 12 ? * +1", // croner's AND prefix
            "0 0 12 1? * *", // ? only alone
            "? * * * *",
            "1,,2 * * * *",
            "0 0 12 * * ? 6000", // beyond croner's year range
            "0 0 12 * * ? 20x0",
            "*/0 * * * *",
            "5-1 * * * *",
            "0 0 0 ? * 2#6",
            "0 0 12 ſun * *",
        ] {
            assert!(
                matches!(CronSchedule::parse(expr, ""), Err(CronError::Syntax(_))),
                "{expr:?} should be a syntax error, got {:?}",
                CronSchedule::parse(expr, "")
            );
        }
    }

    #[test]
    fn feb_30_never_fires() {
        let err = parse_err("0 0 30 2 *", "");
        assert_eq!(err, CronError::NeverFires);
        assert_eq!(err.field(), "cron");
        assert_eq!(err.to_string(), "cron: expression never fires");
    }

    #[test]
    fn unknown_zone() {
        let err = parse_err("0 9 * * *", "Mars/Olympus");
        assert_eq!(err, CronError::UnknownTimeZone("Mars/Olympus".to_string()));
        assert_eq!(err.field(), "time_zone");
        assert_eq!(
            err.to_string(),
            "time_zone: unknown IANA time zone \"Mars/Olympus\""
        );
    }

    // ---- next_after / upcoming ----

    #[test]
    fn upcoming_is_ascending_and_strictly_after() {
        for (expr, zone) in [
            ("*/15 * * * *", "America/New_York"),
            ("30 2 * * *", "Europe/Berlin"),
            ("0 0/5 * * * ?", "Asia/Shanghai"),
            ("0 0 10 ? * 6#3", ""),
        ] {
            let s = sched(expr, zone);
            let from = utc(2026, 3, 1, 0, 0, 0) + 123; // mid-second
            let fires = s.upcoming(from, 50);
            assert_eq!(fires.len(), 50);
            assert!(fires[0] > from);
            assert!(fires.windows(2).all(|w| w[0] < w[1]), "{expr}");
        }
        let s = sched("0 * * * *", "");
        // A start on a fire itself excludes it; a start inside its second too.
        let on = utc(2026, 5, 4, 10, 0, 0);
        assert_eq!(s.next_after(on), Some(on + HOUR));
        assert_eq!(s.next_after(on + 500), Some(on + HOUR));
        assert_eq!(s.next_after(on - 1), Some(on));
        assert!(s.upcoming(on, 0).is_empty());
    }

    #[test]
    fn extreme_inputs_do_not_panic() {
        let s = sched("* * * * * ?", "Pacific/Kiritimati");
        assert_eq!(s.next_after(i64::MAX), None);
        assert!(s.next_after(i64::MIN).is_some());
        assert!(s.next_after(MAX_SEARCH_MS - 1).is_none());
        let s = sched("30 2 * * *", "Pacific/Apia");
        assert!(s.next_after(i64::MIN).is_some());
        assert_eq!(s.next_after(i64::MAX - 1), None);
    }

    #[test]
    fn samoa_skipped_day_fires_after_the_gap() {
        // Samoa skipped all of 2011-12-30.
        let s = sched("0 12 * * *", "Pacific/Apia");
        let dec29_noon = chrono_tz::Pacific::Apia
            .with_ymd_and_hms(2011, 12, 29, 12, 0, 0)
            .single()
            .expect("unambiguous test time")
            .timestamp_millis();
        let next = next(&s, dec29_noon);
        let wall = in_zone(next, chrono_tz::Pacific::Apia);
        assert_eq!(wall.date(), date(2011, 12, 31));
    }

    // ---- property tests ----

    /// Cron-ish expressions: each field mostly draws from tokens that suit
    /// its position, sometimes from any token, so many parse and the rest
    /// probe the error paths.
    fn cronish() -> impl Strategy<Value = String> {
        const ANY: &[&str] = &[
            "*", "?", "L", "W", "#", "/", "-", ",", "0", "1", "7", "15", "31", "59", "60", "2030",
            "MON", "JAN", "LW", "6#3", "*/5", "0/15", "1-5", "5L", "15W", "",
        ];
        const SEC_MIN: &[&str] = &[
            "*", "0", "5", "30", "59", "*/5", "*/15", "0/20", "10-20", "0-59/7",
        ];
        const HOUR: &[&str] = &[
            "*", "0", "1", "2", "3", "12", "23", "*/2", "1-3", "0/6", "9-17",
        ];
        const DOM: &[&str] = &[
            "*", "?", "1", "15", "28", "29", "30", "31", "L", "LW", "15W", "1W", "*/2", "1-7",
        ];
        const MONTH: &[&str] = &[
            "*", "1", "2", "3", "10", "12", "*/3", "1-6", "JAN", "FEB", "NOV-DEC",
        ];
        const DOW: &[&str] = &[
            "*", "?", "0", "1", "2", "5", "6", "7", "1-5", "2-6", "6#3", "2#5", "6L", "1L", "MON",
            "FRI", "SAT-SUN", "MON-FRI",
        ];
        const YEAR: &[&str] = &[
            "*",
            "?",
            "2030",
            "2020",
            "2026-2040",
            "2030/5",
            "2001-2010",
            "2100",
        ];

        fn field(own: &'static [&'static str]) -> BoxedStrategy<String> {
            let item = prop_oneof![
                6 => prop::sample::select(own),
                1 => prop::sample::select(ANY),
            ];
            let items = prop_oneof![4 => Just(1_usize), 1 => Just(2_usize)];
            items
                .prop_flat_map(move |n| prop::collection::vec(item.clone(), n))
                .prop_map(|items| items.join(","))
                .boxed()
        }
        fn layout(kinds: &'static [&'static [&'static str]]) -> BoxedStrategy<String> {
            let fields: Vec<BoxedStrategy<String>> = kinds.iter().map(|k| field(k)).collect();
            (fields, prop::sample::select(&[" ", "  ", " \t "][..]))
                .prop_map(|(f, sep)| f.join(sep))
                .boxed()
        }
        prop_oneof![
            3 => layout(&[SEC_MIN, HOUR, DOM, MONTH, DOW]),
            3 => layout(&[SEC_MIN, SEC_MIN, HOUR, DOM, MONTH, DOW]),
            3 => layout(&[SEC_MIN, SEC_MIN, HOUR, DOM, MONTH, DOW, YEAR]),
            1 => prop::collection::vec(prop::sample::select(ANY), 0..10).prop_map(|t| t.join(" ")),
        ]
    }

    fn zone() -> impl Strategy<Value = String> {
        prop_oneof![
            Just(String::new()),
            Just("UTC".to_string()),
            Just("America/New_York".to_string()),
            Just("Europe/Berlin".to_string()),
            Just("Australia/Lord_Howe".to_string()),
            "\\PC{0,20}",
        ]
    }

    fn check_schedule(s: &CronSchedule, start: i64) -> Result<(), TestCaseError> {
        let mut cursor = start;
        for _ in 0..3 {
            match s.next_after(cursor) {
                Some(next) => {
                    prop_assert!(next > cursor, "{} -> {next}", cursor);
                    cursor = next;
                }
                None => break,
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn random_text_never_panics(expr in "\\PC{0,40}", tz in zone(), start in any::<i64>()) {
            if let Ok(s) = CronSchedule::parse(&expr, &tz) {
                check_schedule(&s, start)?;
            }
        }

        #[test]
        fn cronish_text_never_panics(
            expr in cronish(),
            tz in zone(),
            start in prop_oneof![any::<i64>(), 1_700_000_000_000_i64..2_000_000_000_000],
        ) {
            if let Ok(s) = CronSchedule::parse(&expr, &tz) {
                check_schedule(&s, start)?;
            }
        }
    }
}
