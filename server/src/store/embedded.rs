//! The embedded backend (being written).
