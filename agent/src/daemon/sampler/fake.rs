//! A [`MemoryReader`] of figures set by hand, that notes every read.

use std::sync::Mutex;

use super::*;

#[derive(Default)]
pub(crate) struct FakeReader {
    pub memory: Mutex<HashMap<MemorySource, u64>>,
    pub caps: Mutex<HashMap<std::path::PathBuf, u64>>,
    pub host_pressure: Mutex<Option<Pressure>>,
    /// PSI and memory.events by cgroup: parsed from fixture text, as
    /// the real files would be.
    pub pressure: Mutex<HashMap<std::path::PathBuf, Pressure>>,
    pub events: Mutex<HashMap<std::path::PathBuf, MemoryEvents>>,
    /// Every source read, in order.
    pub reads: Mutex<Vec<MemorySource>>,
    /// The predictor's figures by cgroup, and every cgroup they were
    /// read of, in order.
    pub predict: Mutex<HashMap<std::path::PathBuf, PredictFigures>>,
    pub predict_reads: Mutex<Vec<std::path::PathBuf>>,
    /// Every cgroup whose usage alone was read, in order.
    pub usage_reads: Mutex<Vec<std::path::PathBuf>>,
    /// Every cgroup whose limits alone were read, in order.
    pub limit_reads: Mutex<Vec<std::path::PathBuf>>,
}

impl FakeReader {
    pub(crate) fn set(&self, source: MemorySource, bytes: u64) {
        self.memory.lock().unwrap().insert(source, bytes);
    }

    /// A cgroup's `memory.pressure`, as its text.
    pub(crate) fn set_pressure(&self, cgroup: &Path, text: &str) {
        let parsed = pressure::parse(text).pressure.expect("a PSI fixture");
        self.pressure
            .lock()
            .unwrap()
            .insert(cgroup.to_path_buf(), parsed);
    }

    /// A cgroup's `memory.events`, as its text.
    pub(crate) fn set_events(&self, cgroup: &Path, text: &str) {
        self.events
            .lock()
            .unwrap()
            .insert(cgroup.to_path_buf(), pressure::parse_memory_events(text));
    }
}

impl MemoryReader for FakeReader {
    fn read(&self, source: &MemorySource) -> io::Result<u64> {
        self.reads.lock().unwrap().push(source.clone());
        self.memory
            .lock()
            .unwrap()
            .get(source)
            .copied()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "not set"))
    }

    fn cgroup_soft_cap(&self, cgroup: &Path) -> Option<u64> {
        self.caps.lock().unwrap().get(cgroup).copied()
    }

    fn predict_figures(&self, cgroup: &Path, _root: &Path) -> Option<PredictFigures> {
        self.predict_reads
            .lock()
            .unwrap()
            .push(cgroup.to_path_buf());
        self.predict.lock().unwrap().get(cgroup).cloned()
    }

    /// The figures' unreclaimable bytes stand for the usage (no cache).
    fn cgroup_usage(&self, cgroup: &Path) -> Option<u64> {
        self.usage_reads.lock().unwrap().push(cgroup.to_path_buf());
        let figures = self.predict.lock().unwrap();
        figures.get(cgroup).map(|f| f.unreclaimable)
    }

    /// The limits stand while `predict` holds the same ones (the
    /// usage against each may have moved).
    fn limits_stand(
        &self,
        cgroup: &Path,
        kept: &PredictFigures,
        _root: &Path,
        _shared: &mut limits::LimitsShared,
    ) -> bool {
        self.limit_reads.lock().unwrap().push(cgroup.to_path_buf());
        let bytes = |f: &PredictFigures| -> Vec<(std::path::PathBuf, u64)> {
            f.limits
                .iter()
                .map(|l| (l.cgroup.clone(), l.bytes))
                .collect()
        };
        let figures = self.predict.lock().unwrap();
        figures
            .get(cgroup)
            .is_some_and(|f| bytes(f) == bytes(kept) && f.high == kept.high)
    }

    fn host_pressure(&self) -> Option<Pressure> {
        *self.host_pressure.lock().unwrap()
    }

    fn cgroup_pressure(&self, cgroup: &Path) -> Option<Pressure> {
        self.pressure.lock().unwrap().get(cgroup).copied()
    }

    fn memory_events(&self, cgroup: &Path) -> Option<MemoryEvents> {
        self.events.lock().unwrap().get(cgroup).cloned()
    }
}
