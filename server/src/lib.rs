//! Sundial's control plane as a library: the `sundial` binary is a thin shell over
//! [`server::run`], and the integration tests start the same code in-process or as
//! processes.

pub mod cron;
pub mod fault;
pub mod model;
pub mod store;
