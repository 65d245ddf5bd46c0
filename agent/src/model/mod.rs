//! Leaf data every layer shares: events, pod identity, health verdicts,
//! worker and task specs, units, and decision time.

pub mod time;
