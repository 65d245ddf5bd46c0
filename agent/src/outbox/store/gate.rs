//! A commit that waits until the test lets it go: the fsync of a slow
//! disk, and a crash (nothing written from then on, as if the process had
//! died before the commit).

use std::{
    sync::{Condvar, Mutex},
    time::{Duration, Instant},
};

use super::StoreError;

/// A held commit waits this long at most, so a failing test ends.
const HOLD_BOUND: Duration = Duration::from_secs(10);

#[derive(Default)]
pub(crate) struct Gate {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    held: bool,
    /// Commits waiting at the gate now.
    waiting: usize,
    crashed: bool,
    /// Commits let through while held.
    tickets: usize,
}

impl Gate {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Commits wait from now on.
    pub(crate) fn hold(&self) {
        self.state().held = true;
    }

    /// The commits waiting go on (and later ones do not wait).
    pub(crate) fn release(&self) {
        self.state().held = false;
        self.changed.notify_all();
    }

    /// Lets the commit waiting (or the next one) through; later ones
    /// still wait.
    pub(crate) fn let_one_through(&self) {
        self.state().tickets += 1;
        self.changed.notify_all();
    }

    /// The process "dies": the commits waiting and every later write
    /// fail, nothing more reaches the file.
    pub(crate) fn crash(&self) {
        let mut state = self.state();
        state.crashed = true;
        state.held = false;
        self.changed.notify_all();
    }

    /// Waits (at most `bound`) until a commit waits at the gate.
    pub(crate) fn wait_for_commit(&self, bound: Duration) -> bool {
        let deadline = Instant::now() + bound;
        let mut state = self.state();
        while state.waiting == 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            state = self.changed.wait_timeout(state, left).unwrap().0;
        }
        true
    }

    /// A commit: waits while held (at most [`HOLD_BOUND`]).
    pub(super) fn pass(&self) -> Result<(), StoreError> {
        let deadline = Instant::now() + HOLD_BOUND;
        let mut state = self.state();
        state.waiting += 1;
        self.changed.notify_all();
        while state.held && state.tickets == 0 && Instant::now() < deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            state = self.changed.wait_timeout(state, left).unwrap().0;
        }
        if state.held && state.tickets > 0 {
            state.tickets -= 1;
        }
        state.waiting -= 1;
        drop(state);
        self.alive()
    }

    /// Fails once crashed.
    pub(super) fn alive(&self) -> Result<(), StoreError> {
        if self.state().crashed {
            return Err(StoreError::Sql(rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_IOERR),
                Some("simulated crash: the process is gone".into()),
            )));
        }
        Ok(())
    }
}
