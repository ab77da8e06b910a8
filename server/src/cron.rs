//! Cron (being written).
