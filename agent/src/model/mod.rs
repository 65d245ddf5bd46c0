//! Leaf data every layer shares: events, pod identity, health verdicts,
//! worker and task specs, units, and decision time. Imports nothing of the
//! crate's own.

pub(crate) mod event;
pub(crate) mod health;
pub(crate) mod pod;
pub(crate) mod pressure;
pub(crate) mod process;
pub(crate) mod secret_file;
pub(crate) mod signal;
pub(crate) mod source;
pub(crate) mod spec;
pub(crate) mod time;
pub(crate) mod units;
