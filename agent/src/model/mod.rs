//! Leaf data every layer shares: events, pod identity, health verdicts,
//! worker and task specs, units, and decision time. Imports nothing of the
//! crate's own.

pub mod event;
pub mod health;
pub mod pod;
pub mod source;
pub mod spec;
pub mod time;
pub mod units;
