//! Where events go once they are made: the durable outbox, and the sinks
//! that ship them to schedulers (one file per sink, one delivery loop).
//! `docs/writing-a-sink.md` says how to add one.

pub mod dask;
pub mod dask_map;
pub mod delivery;
pub mod guard;
pub mod nats;
pub mod outbox;
pub mod scontrol;
pub mod slurm;
pub mod store;
pub mod webhook;
