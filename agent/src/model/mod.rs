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

/// A hash map with a fast, per-process seeded hasher (foldhash), for the
/// maps a sampling round looks up once per task or followed cgroup (task
/// ids, cgroup paths): SipHash and `Path`'s component-wise hashing made a
/// tenth of an idle agent's CPU at 5,000 tasks (docs/benchmarks.md).
pub(crate) type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// A [`FastMap`] by path, keyed by the path's bytes: looked up with
/// `path.as_os_str()`, one hash of the bytes and one `memcmp`, where a
/// `PathBuf` key hashes and compares component by component (`a/b` and
/// `a//b` are one `Path`, two keys here). Only for paths that always come
/// spelled the same way (the predictor's targets, each tick).
pub(crate) type ByPath<V> = FastMap<std::ffi::OsString, V>;
