//! Where events go once they are made: the outbox, and (later) the sinks
//! that ship them to schedulers.

pub mod outbox;
