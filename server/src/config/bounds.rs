//! The range of every number in the settings. A value outside its range stops the
//! server at startup with an error naming the setting, the value and the range, where
//! it used to be clamped in silence or taken whole (a `run_retention` of 10^15 ms would
//! have been written back by Lua's cjson as a float). Every bound keeps the times the
//! stores handle far below 10^14 ms. README's "Limits of the settings" is this table;
//! a test keeps the two the same.

use std::time::Duration;

use super::{Error, HumanDuration, given};

/// One setting's range, inclusive.
pub(super) struct Bound<T> {
    pub field: &'static str,
    pub min: T,
    pub max: T,
}

const MS: Duration = Duration::from_millis(1);
const fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}
const MINUTE: u64 = 60;
const HOUR: u64 = 60 * MINUTE;
const DAY: u64 = 24 * HOUR;
/// A year as `humantime` writes one (365.25 days), so that the bound reads "10years".
const YEAR: u64 = 31_557_600;

macro_rules! bound {
    ($name:ident, $field:literal, $min:expr, $max:expr) => {
        pub(super) const $name: Bound<Duration> = Bound {
            field: $field,
            min: $min,
            max: $max,
        };
    };
}
macro_rules! count {
    ($name:ident, $field:literal, $min:expr, $max:expr) => {
        pub(super) const $name: Bound<u64> = Bound {
            field: $field,
            min: $min,
            max: $max,
        };
    };
}

bound!(SCHEDULER_MAX_SLEEP, "scheduler_max_sleep", MS, secs(MINUTE));
bound!(
    PARTITION_LEASE,
    "partition_lease",
    Duration::ZERO,
    secs(HOUR)
);
bound!(
    MISFIRE_THRESHOLD,
    "misfire_threshold",
    Duration::ZERO,
    secs(30 * DAY)
);
bound!(TRIGGER_READ_BLOCK, "trigger_read_block", MS, secs(MINUTE));
bound!(TRIGGER_RECLAIM_IDLE, "trigger_reclaim_idle", MS, secs(HOUR));
bound!(
    TRIGGER_RECLAIM_EVERY,
    "trigger_reclaim_every",
    MS,
    secs(HOUR)
);
bound!(INSTANCE_TTL, "instance_ttl", MS, secs(10 * MINUTE));
bound!(TRIGGER_RETENTION, "trigger_retention", MS, secs(30 * DAY));
bound!(RUN_RETENTION, "run_retention", MS, secs(10 * YEAR));
bound!(
    HEARTBEAT_INTERVAL,
    "heartbeat_interval",
    MS,
    secs(10 * MINUTE)
);
bound!(LEASE_TTL, "lease_ttl", MS, secs(HOUR));
bound!(CONFIRM_WITHIN, "confirm_within", MS, secs(HOUR));
bound!(SILENT_AFTER, "silent_after", Duration::ZERO, secs(HOUR));
bound!(
    DISCONNECT_GRACE,
    "disconnect_grace",
    Duration::ZERO,
    secs(HOUR)
);
bound!(DISPATCH_WAIT, "dispatch_wait", MS, secs(DAY));
bound!(ROUTE_RETRY, "route_retry", MS, secs(10 * MINUTE));
bound!(SWEEP_EVERY, "sweep_every", MS, secs(MINUTE));
bound!(SHUTDOWN_GRACE, "shutdown_grace", MS, secs(HOUR));
bound!(HEALTH_WINDOW, "health_window", MS, secs(DAY));
bound!(HEALTH_PROBE_EVERY, "health_probe_every", MS, secs(HOUR));
bound!(WEBHOOK_TIMEOUT, "webhook_timeout", MS, secs(5 * MINUTE));
bound!(WEBHOOK_MAX_AGE, "webhook_max_age", MS, secs(30 * DAY));
bound!(
    WEBHOOK_BREAKER_COOLDOWN,
    "webhook_breaker_cooldown",
    MS,
    secs(DAY)
);
bound!(WEBHOOK_CLAIM_LEASE, "webhook_claim_lease", MS, secs(HOUR));

count!(PARTITIONS, "partitions", 1, 1024);
count!(SCHEDULER_BATCH, "scheduler_batch", 1, 10_000);
count!(
    SCHEDULER_PARALLEL_PARTITIONS,
    "scheduler_parallel_partitions",
    1,
    256
);
count!(MISFIRE_CATCH_UP_LIMIT, "misfire_catch_up_limit", 0, 1000);
count!(MAX_RUNS_PER_JOB, "max_runs_per_job", 1, 1_000_000);
count!(MISSED_HEARTBEATS, "missed_heartbeats", 1, 100);
count!(SERIAL_LIMIT, "serial_limit", 1, 100_000);
count!(MAX_LOG_BYTES, "max_log_bytes", 1024, 64 << 20);
count!(HTTP_MAX_CONCURRENCY, "http_max_concurrency", 1, 10_000);
count!(WORKER_THREADS, "worker_threads", 1, 1024);
count!(HEALTH_MIN_RESULTS, "health_min_results", 1, 10_000);
count!(
    WEBHOOK_BREAKER_FAILURES,
    "webhook_breaker_failures",
    1,
    1000
);
count!(WEBHOOK_CONCURRENCY, "webhook_concurrency", 1, 10_000);
count!(
    WEBHOOK_DESTINATION_CONCURRENCY,
    "webhook_destination_concurrency",
    1,
    10_000
);

/// Every duration setting's range, in the README's order.
#[cfg(test)]
pub(super) const DURATIONS: &[&Bound<Duration>] = &[
    &SCHEDULER_MAX_SLEEP,
    &PARTITION_LEASE,
    &MISFIRE_THRESHOLD,
    &TRIGGER_READ_BLOCK,
    &TRIGGER_RECLAIM_IDLE,
    &TRIGGER_RECLAIM_EVERY,
    &INSTANCE_TTL,
    &TRIGGER_RETENTION,
    &RUN_RETENTION,
    &HEARTBEAT_INTERVAL,
    &LEASE_TTL,
    &CONFIRM_WITHIN,
    &SILENT_AFTER,
    &DISCONNECT_GRACE,
    &DISPATCH_WAIT,
    &ROUTE_RETRY,
    &SWEEP_EVERY,
    &SHUTDOWN_GRACE,
    &HEALTH_WINDOW,
    &HEALTH_PROBE_EVERY,
    &WEBHOOK_TIMEOUT,
    &WEBHOOK_MAX_AGE,
    &WEBHOOK_BREAKER_COOLDOWN,
    &WEBHOOK_CLAIM_LEASE,
];

/// Every count setting's range, in the README's order.
#[cfg(test)]
pub(super) const COUNTS: &[&Bound<u64>] = &[
    &PARTITIONS,
    &SCHEDULER_BATCH,
    &SCHEDULER_PARALLEL_PARTITIONS,
    &MISFIRE_CATCH_UP_LIMIT,
    &MAX_RUNS_PER_JOB,
    &MISSED_HEARTBEATS,
    &SERIAL_LIMIT,
    &MAX_LOG_BYTES,
    &HTTP_MAX_CONCURRENCY,
    &WORKER_THREADS,
    &HEALTH_MIN_RESULTS,
    &WEBHOOK_BREAKER_FAILURES,
    &WEBHOOK_CONCURRENCY,
    &WEBHOOK_DESTINATION_CONCURRENCY,
];

/// Each delay of `webhook_retry_schedule`, and how many there may be.
pub(super) const RETRY_DELAY: Bound<Duration> = Bound {
    field: "webhook_retry_schedule",
    min: MS,
    max: secs(7 * DAY),
};
pub(super) const MAX_RETRY_DELAYS: usize = 100;

fn human(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

impl Bound<Duration> {
    /// The setting's value (it has a declared default, so it is set), or the error
    /// naming it.
    pub fn get(&self, v: Option<HumanDuration>) -> Result<Duration, Error> {
        self.within(given(self.field, v)?.0)
    }

    /// The setting's value (`default`, derived from others, when unset), or the error
    /// naming it.
    pub fn check(&self, v: Option<HumanDuration>, default: Duration) -> Result<Duration, Error> {
        v.map_or(Ok(default), |HumanDuration(d)| self.within(d))
    }

    fn within(&self, d: Duration) -> Result<Duration, Error> {
        if d < self.min || d > self.max {
            return Err(Error::Invalid {
                field: self.field,
                reason: format!("{} is not between {}", human(d), self.range()),
            });
        }
        Ok(d)
    }

    pub fn range(&self) -> String {
        format!("{} and {}", human(self.min), human(self.max))
    }
}

impl Bound<u64> {
    /// The setting's value (it has a declared default, so it is set), or the error
    /// naming it.
    pub fn get<T>(&self, v: Option<T>) -> Result<T, Error>
    where
        T: Copy + TryInto<u64>,
    {
        self.within(given(self.field, v)?)
    }

    /// The setting's value (`default`, derived from others, when unset), or the error
    /// naming it.
    pub fn check<T>(&self, v: Option<T>, default: T) -> Result<T, Error>
    where
        T: Copy + TryInto<u64>,
    {
        v.map_or(Ok(default), |n| self.within(n))
    }

    fn within<T>(&self, n: T) -> Result<T, Error>
    where
        T: Copy + TryInto<u64>,
    {
        match n.try_into() {
            Ok(x) if (self.min..=self.max).contains(&x) => Ok(n),
            Ok(x) => Err(Error::Invalid {
                field: self.field,
                reason: format!("{x} is not between {}", self.range()),
            }),
            Err(_) => Err(Error::Invalid {
                field: self.field,
                reason: format!("is not between {}", self.range()),
            }),
        }
    }

    pub fn range(&self) -> String {
        format!("{} and {}", self.min, self.max)
    }
}

/// README's table of these ranges, as it must read.
#[cfg(test)]
pub(super) fn readme_table() -> String {
    let mut t = String::from("| setting | range |\n|---|---|\n");
    for b in DURATIONS {
        t.push_str(&format!(
            "| `{}` | {} to {} |\n",
            b.field,
            human(b.min),
            human(b.max)
        ));
    }
    for b in COUNTS {
        t.push_str(&format!("| `{}` | {} to {} |\n", b.field, b.min, b.max));
    }
    t.push_str(&format!(
        "| `{}` | up to {MAX_RETRY_DELAYS} delays, each {} to {} |\n",
        RETRY_DELAY.field,
        human(RETRY_DELAY.min),
        human(RETRY_DELAY.max)
    ));
    t
}

#[cfg(test)]
mod tests {
    use super::super::{Config, Settings};
    use super::*;

    /// The settings with one key set, as the TOML file would give it.
    fn with(key: &str, value: &str) -> Settings {
        toml::from_str(&format!("{key} = {value}"))
            .unwrap_or_else(|e| panic!("{key} = {value}: {e}"))
    }

    fn refused(key: &str, value: &str) -> String {
        match Config::from_settings(with(key, value)) {
            Err(Error::Invalid { field, reason }) => {
                assert_eq!(
                    field, key,
                    "{key} = {value} was refused naming {field}: {reason}"
                );
                reason
            }
            Err(other) => panic!("{key} = {value}: {other}"),
            Ok(_) => panic!("{key} = {value} was accepted"),
        }
    }

    #[test]
    fn every_number_past_its_range_is_refused_naming_the_setting() {
        for b in DURATIONS {
            let past = human(b.max + MS);
            let why = refused(b.field, &format!("{past:?}"));
            assert!(why.contains(&b.range()), "{}: {why}", b.field);
            if b.min > Duration::ZERO {
                refused(b.field, "\"0s\"");
            }
        }
        for b in COUNTS {
            let why = refused(b.field, &(b.max + 1).to_string());
            assert!(why.contains(&b.range()), "{}: {why}", b.field);
            if b.min > 0 {
                refused(b.field, &(b.min - 1).to_string());
            }
        }
        // A time Lua would have written back as a float, refused.
        refused("run_retention", "\"3200years\"");
        refused("webhook_retry_schedule", "\"1s, 8days\"");
        let many = vec!["1s"; MAX_RETRY_DELAYS + 1].join(",");
        refused("webhook_retry_schedule", &format!("{many:?}"));
    }

    #[test]
    fn the_bounds_at_their_ends_are_taken() {
        for (key, value) in [
            ("run_retention", "\"3650days\""),
            ("misfire_threshold", "\"0s\""),
            ("partitions", "1024"),
            ("max_log_bytes", "1024"),
            ("webhook_retry_schedule", "\"1ms, 7days\""),
        ] {
            Config::from_settings(with(key, value))
                .unwrap_or_else(|e| panic!("{key} = {value}: {e}"));
        }
    }

    #[test]
    fn the_readme_lists_every_range() {
        let readme = include_str!("../../../README.md");
        let table = readme_table();
        assert!(
            readme.contains(&table),
            "README.md's \"Limits of the settings\" should read:\n{table}"
        );
    }
}
