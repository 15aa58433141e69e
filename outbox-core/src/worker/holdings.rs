//! What a worker holds in the database and must either finish or give
//! back: attempts whose handler runs or whose outcome is not written yet
//! (heartbeated until it is), and claims whose answer never arrived (the
//! claim may have committed although the connection broke before the
//! reply; such tasks are released by claim token, not left to the
//! heartbeat timeout).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::task::AbortHandle;
use tokio_util::sync::CancellationToken;

use crate::db::ClaimedTask;

#[derive(Default)]
struct Inner {
    /// By (task id, claim token): the same task can be held twice when a
    /// claim was lost in a server crash and the task claimed again. The
    /// value aborts the handler while it runs.
    attempts: HashMap<(i64, Arc<str>), Option<AbortHandle>>,
    /// Claims sent and not answered yet.
    claiming: HashSet<Arc<str>>,
    /// Claims that failed in a way that leaves their fate unknown: they may
    /// have committed without us seeing it.
    lost: HashSet<Arc<str>>,
    /// The cancellation tokens of running handlers, by task id.
    tokens: HashMap<i64, CancellationToken>,
    /// Held tasks an operator asked to cancel.
    cancel_requested: HashSet<i64>,
}

/// Shared between the producers, executor, completer and heartbeat.
pub(crate) struct Holdings {
    inner: Mutex<Inner>,
    /// This run of the worker: its id and a random per-run value, so that
    /// neither claim tokens nor the lease holder repeat across restarts of
    /// a worker that was given a fixed id.
    run_id: String,
    next_token: AtomicU64,
}

impl Holdings {
    pub(crate) fn new(worker_id: &str) -> Self {
        use std::hash::{BuildHasher, RandomState};
        let run = RandomState::new().hash_one(std::time::SystemTime::now()) & 0xffff_ffff;
        Self {
            inner: Mutex::default(),
            run_id: format!("{worker_id}/{run:08x}"),
            next_token: AtomicU64::new(1),
        }
    }

    /// This run of the worker (`worker id/random`).
    pub(crate) fn run_id(&self) -> &str {
        &self.run_id
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A fresh claim token, recorded until [`Self::settle`] or
    /// [`Self::lost`]: call before sending the claim, so that a claim
    /// abandoned half-way (shutdown) is still released at exit.
    pub(crate) fn begin_claim(&self) -> Arc<str> {
        let n = self.next_token.fetch_add(1, Ordering::Relaxed);
        let token: Arc<str> = Arc::from(format!("{}/{n}", self.run_id));
        self.lock().claiming.insert(Arc::clone(&token));
        token
    }

    /// The claim's answer arrived: its tasks (if any) are held from now on.
    pub(crate) fn settle(&self, token: &Arc<str>, tasks: &[ClaimedTask]) {
        let mut inner = self.lock();
        inner.claiming.remove(token);
        for task in tasks {
            inner
                .attempts
                .insert((task.id, Arc::clone(&task.token)), None);
        }
    }

    /// The claim's statement failed: after a transient error its fate is
    /// unknown and its token must be released ([`Self::lost`]); a refused
    /// statement claimed nothing.
    pub(crate) fn claim_failed(&self, token: &Arc<str>, error: &sqlx::Error) {
        if crate::db::classify::is_transient(error) {
            self.lost(token);
        } else {
            self.settle(token, &[]);
        }
    }

    /// The claim failed without a clear answer (a transient error): it may
    /// have committed, so its token must be released.
    fn lost(&self, token: &Arc<str>) {
        let mut inner = self.lock();
        inner.claiming.remove(token);
        inner.lost.insert(Arc::clone(token));
    }

    /// Tokens of lost claims (to release before claiming again).
    pub(crate) fn lost_claims(&self) -> Vec<Arc<str>> {
        self.lock().lost.iter().cloned().collect()
    }

    /// These lost claims were released.
    pub(crate) fn forget_claims(&self, tokens: &[Arc<str>]) {
        let mut inner = self.lock();
        for t in tokens {
            inner.lost.remove(t);
        }
    }

    /// The handler of an attempt started; shutdown may abort it, and an
    /// operator's cancel fires `cancel`.
    pub(crate) fn running(
        &self,
        id: i64,
        token: &Arc<str>,
        abort: AbortHandle,
        cancel: CancellationToken,
    ) {
        let mut inner = self.lock();
        if let Some(a) = inner.attempts.get_mut(&(id, Arc::clone(token))) {
            *a = Some(abort);
            if inner.cancel_requested.contains(&id) {
                cancel.cancel();
            }
            inner.tokens.insert(id, cancel);
        }
    }

    /// The handler of an attempt returned; its outcome is on its way.
    pub(crate) fn ran(&self, id: i64, token: &Arc<str>) {
        let mut inner = self.lock();
        if let Some(a) = inner.attempts.get_mut(&(id, Arc::clone(token))) {
            *a = None;
        }
        inner.tokens.remove(&id);
    }

    /// An operator asked to cancel task `id`: if this worker holds it, its
    /// handler's token fires and its outcome will be "cancelled". Returns
    /// whether the task is held here.
    pub(crate) fn request_cancel(&self, id: i64) -> bool {
        let mut inner = self.lock();
        if !inner.attempts.keys().any(|(held, _)| *held == id) {
            return false;
        }
        inner.cancel_requested.insert(id);
        if let Some(token) = inner.tokens.get(&id) {
            token.cancel();
        }
        true
    }

    /// Whether an operator asked to cancel task `id`.
    pub(crate) fn cancel_requested(&self, id: i64) -> bool {
        self.lock().cancel_requested.contains(&id)
    }

    /// The attempt's outcome was written (or fenced out, or given up): the
    /// worker no longer holds the task.
    pub(crate) fn done(&self, id: i64, token: &Arc<str>) {
        let mut inner = self.lock();
        inner.attempts.remove(&(id, Arc::clone(token)));
        // Called for every task: look through the attempts only in the rare
        // case that a cancel is pending.
        if inner.cancel_requested.contains(&id)
            && !inner.attempts.keys().any(|(held, _)| *held == id)
        {
            inner.cancel_requested.remove(&id);
        }
    }

    /// Held attempts: task ids and the distinct claim tokens, for the
    /// heartbeat.
    pub(crate) fn heartbeat_targets(&self) -> (Vec<i64>, Vec<Arc<str>>) {
        let inner = self.lock();
        let ids = inner.attempts.keys().map(|(id, _)| *id).collect();
        let tokens: HashSet<&Arc<str>> = inner.attempts.keys().map(|(_, t)| t).collect();
        (ids, tokens.into_iter().cloned().collect())
    }

    /// Aborts every handler still running; returns how many.
    pub(crate) fn abort_running(&self) -> usize {
        let mut inner = self.lock();
        let mut aborted = 0;
        for attempt in inner.attempts.values_mut() {
            if let Some(abort) = attempt.take() {
                abort.abort();
                aborted += 1;
            }
        }
        aborted
    }

    /// Every claim token under which this worker may still hold a task.
    pub(crate) fn all_tokens(&self) -> Vec<Arc<str>> {
        let inner = self.lock();
        let mut tokens: HashSet<Arc<str>> = inner.claiming.union(&inner.lost).cloned().collect();
        tokens.extend(inner.attempts.keys().map(|(_, t)| Arc::clone(t)));
        tokens.into_iter().collect()
    }

    /// Ids of the held attempts, sorted (for logs).
    pub(crate) fn held_ids(&self) -> Vec<i64> {
        let mut ids: Vec<i64> = self.lock().attempts.keys().map(|(id, _)| *id).collect();
        ids.sort_unstable();
        ids
    }

    /// Forgets everything (after a final release).
    pub(crate) fn clear(&self) {
        let mut inner = self.lock();
        inner.attempts.clear();
        inner.claiming.clear();
        inner.lost.clear();
    }

    /// Held attempts.
    pub(crate) fn len(&self) -> usize {
        self.lock().attempts.len()
    }
}
