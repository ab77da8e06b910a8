//! *When* must a job run: cron expressions ([`cron`]), the job lifecycle and how a job
//! is armed ([`jobs`]), and the claim loop that turns due fires into triggers
//! ([`scheduler`]).
//!
//! May import the foundation (`store`, `model`, `metrics`, `fault`) and
//! `deliver::alerts`; never `dispatch`, `api` or `server`.

pub mod cron;
pub mod jobs;
pub mod scheduler;
