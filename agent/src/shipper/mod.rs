//! Where events go once they are made: the durable outbox, and the sinks
//! that ship them to schedulers (one file per sink, one delivery loop).

pub mod delivery;
pub mod nats;
pub mod outbox;
pub mod store;
pub mod webhook;
